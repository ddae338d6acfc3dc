"""The console's pages: overview, files, search, review, failed, upload, login
(Starlette + Jinja2).

Endpoints are plain functions: Starlette runs them in its thread pool, so the SQLite
reads and file reads never block the console's own loop, and nothing here runs on the
daemon's.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from urllib.parse import urlencode

import structlog
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from ocrd.names import shown
from ocrd.web import actions, api, serve, turn
from ocrd.web.auth import COOKIE, BodyTooLarge, Guard
from ocrd.web.context import Context
from ocrd.web.pages import int_param, render
from ocrd.web.queries import LIST_STATES, search_results, waiting_list
from ocrd.web.search import COUNT_AT_MOST, Query
from ocrd.web.store import listed_outputs
from ocrd.web.views import job_facts, review_pages, state_of
from ocrd.work.journal import FILTER_STATES, FileFilter, Job

log = structlog.get_logger("ocrd.web")

HERE = Path(__file__).parent
PAGE_SIZE = 50
SEARCH_PAGE_SIZE = 20
CHART_HOURS = 6
CHART_BUCKET = 600  # seconds per bar


# -- overview -----------------------------------------------------------------------------

def overview(request: Request) -> Response:
    return render(request, "overview.html", **live_context(request.app.state.ctx))


def live_fragment(request: Request) -> Response:
    return render(request, "_live.html", **live_context(request.app.state.ctx))


def live_context(ctx: Context) -> dict:
    journal = ctx.store.journal()
    now = time.time()
    first = (now // CHART_BUCKET - CHART_HOURS * 3600 // CHART_BUCKET + 1) * CHART_BUCKET
    buckets = journal.pages_per_bucket(first, CHART_BUCKET)
    count = CHART_HOURS * 3600 // CHART_BUCKET
    # each bar is pages per second over its own span; the last one is still running,
    # so it is divided by the seconds it has had, not by a whole bar's
    bars = [buckets.get(int(first + k * CHART_BUCKET), 0) /
            (CHART_BUCKET if k < count - 1 else max(60.0, now - (first + k * CHART_BUCKET)))
            for k in range(count)]
    per_inbox = {shown(inbox): {"queued": n.get("claiming", 0) + n.get("claimed", 0),
                                "converting": n.get("converting", 0) + n.get("finishing", 0)}
                 for inbox, n in journal.open_by_inbox().items()}
    live = ctx.live()
    return {
        "live": live,
        "per_inbox": per_inbox,
        "counts": journal.counts(),
        "recent_done": [job_facts(j) for j in journal.recent("done", 10)],
        "recent_failed": [job_facts(j) for j in journal.recent("failed", 10)],
        "waiting": waiting_list(live),
        "bars": bars, "bar_max": max(bars + [0.01]), "chart_hours": CHART_HOURS,
        "bar_minutes": CHART_BUCKET // 60,
        # the last bar's span so far: not "now" (the big figure is the last minute's)
        "bar_since": time.strftime("%H:%M", time.localtime(first + (count - 1) * CHART_BUCKET)),
    }


# -- files ----------------------------------------------------------------------------------

def files(request: Request) -> Response:
    ctx: Context = request.app.state.ctx
    q = request.query_params
    state = q.get("state") or None
    if state is not None and state not in LIST_STATES:
        return render(request, "files.html", status=400, jobs=[], total=0, page=1,
                      pages=1, where=FileFilter(), states=LIST_STATES, waiting=[],
                      inboxes=_inboxes(ctx), progress={}, link=lambda n: "/files",
                      error=f"There is no state {state!r}. The states are: "
                            f"{', '.join(LIST_STATES)}.", hidden={})
    where = FileFilter(state=state if state in FILTER_STATES else None,
                       inbox=q.get("inbox") or None, name=q.get("q") or None)
    page = int_param(q.get("page"), 1, 1, 10**7)
    live = ctx.live()
    waiting = [w for w in waiting_list(live)
               if (not where.inbox or w["inbox"] == where.inbox) and
               (not where.name or where.name.lower() in w["name"].lower())]
    if state == "waiting":
        jobs, total = [], len(waiting)
    else:
        jobs, total = ctx.store.find(where, PAGE_SIZE, (page - 1) * PAGE_SIZE)
        if state is not None or page > 1:
            waiting = []
    pages = max(1, math.ceil(total / PAGE_SIZE))
    base = {k: v for k, v in (("state", state), ("inbox", where.inbox),
                              ("q", where.name)) if v}
    progress = {f.job_id: f for f in (live.converting_files if live else ())}
    return render(request, "files.html", jobs=[job_facts(j) for j in jobs], total=total,
                  page=page, pages=pages, where=where, state=state, states=LIST_STATES,
                  inboxes=_inboxes(ctx), waiting=waiting, progress=progress, live=live,
                  link=lambda n: "/files?" + urlencode({**base, "page": n}), hidden=base)


def _inboxes(ctx: Context) -> list[str]:
    return [shown(str(b.path)) for b in ctx.cfg.inboxes]


def failed(request: Request) -> Response:
    ctx: Context = request.app.state.ctx
    reason = request.query_params.get("reason") or None
    page = int_param(request.query_params.get("page"), 1, 1, 10**7)
    where = FileFilter(state="failed", reason=reason)
    jobs, total = ctx.store.find(where, PAGE_SIZE, (page - 1) * PAGE_SIZE)
    base = {"reason": reason} if reason else {}
    reasons = ctx.store.journal().failures_by_reason()
    return render(request, "failed.html", jobs=[job_facts(j) for j in jobs], total=total,
                  page=page, pages=max(1, math.ceil(total / PAGE_SIZE)), reason=reason,
                  reasons=reasons, reason_helps={r: r in actions.RETRY_HELPS for r in reasons},
                  link=lambda n: "/failed?" + urlencode({**base, "page": n}), hidden=base)


def search(request: Request) -> Response:
    ctx: Context = request.app.state.ctx
    text = (request.query_params.get("q") or "").strip()
    page = int_param(request.query_params.get("page"), 1, 1, 10**6)
    results, total, error = search_results(ctx, text, SEARCH_PAGE_SIZE,
                                           (page - 1) * SEARCH_PAGE_SIZE)
    return render(request, "search.html", status=400 if error and text else 200, q=text,
                  results=results, total=total, page=page, error=error,
                  pages=max(1, math.ceil(min(total, COUNT_AT_MOST) / SEARCH_PAGE_SIZE)),
                  count_at_most=COUNT_AT_MOST,
                  link=lambda n: "/search?" + urlencode({"q": text, "page": n}),
                  hidden={"q": text})


# how the review page names an output the sidecar lists (others: by their name)
OUTPUT_LABELS = {"pdf": "searchable PDF", "hocr": "hOCR (.hocr)"}


def review(request: Request) -> Response:
    ctx: Context = request.app.state.ctx
    job = ctx.store.job(request.path_params["id"])
    if job is None or ctx.store.inbox(job) is None:
        return render(request, "missing.html", status=404)
    meta = ctx.store.sidecar(job)
    markdown = ctx.store.text(job, ".md")
    text = (request.query_params.get("q") or "").strip()
    terms = Query.parse(text).terms if text else ()
    pages = review_pages(markdown, meta, job.id, terms) if markdown is not None else []
    has_original = serve.closed(ctx.store.original(job, meta))
    # what the sidecar lists beside the Markdown, where it still is in the outbox
    outputs = [name for name in listed_outputs(meta)
               if serve.closed(ctx.store.output(job, meta, name))]
    previews = ctx.store.previews is not None and meta is not None
    live = ctx.live()
    progress = next((f for f in (live.converting_files if live else ())
                     if f.job_id == job.id), None)
    box = ctx.store.inbox(job)
    return render(request, "review.html", job=job_facts(job), meta=meta or {},
                  pages=pages, state=state_of(job), has_original=has_original,
                  outputs=[(name, OUTPUT_LABELS.get(name, name)) for name in outputs],
                  previews=previews and has_original,
                  cached=serve.cached_pages(ctx, meta) if previews and not has_original
                  else set(), q=text, live=live, progress=progress,
                  on_success=box.on_success if box else None)


def page_view(request: Request) -> Response:
    """One page's image at full size, with zoom steps (no script needed)."""
    ctx: Context = request.app.state.ctx
    job = ctx.store.job(request.path_params["id"])
    if job is None or ctx.store.inbox(job) is None:
        return render(request, "missing.html", status=404)
    meta = ctx.store.sidecar(job) or {}
    page = request.path_params["page"]
    count = int(meta.get("page_count") or 0)
    if not 1 <= page <= count:
        return render(request, "missing.html", status=404)
    zoom = request.query_params.get("zoom") or "fit"
    zoom = zoom if zoom in ZOOMS else "fit"
    info = next((p for p in meta.get("pages", []) if isinstance(p, dict)
                 and p.get("page") == page), {})
    rotation = info.get("rotation") if info.get("rotation") in turn.TURNS else None
    return render(request, "page.html", job=job_facts(job), page=page, count=count,
                  zoom=zoom, zooms=ZOOMS, rotation=rotation,
                  by_hand=info.get("turned_by") == "hand", turns=turn.offered(rotation),
                  cannot_turn=_cannot_turn(ctx, job, meta))


# "fit": the page as wide as the window at most; the others: the page image's own
# pixels times the factor (100: 1:1, one image pixel per CSS pixel)
ZOOMS = {"fit": "fit the window", "50": "50 %", "100": "1:1 (100 %)", "200": "200 %",
         "300": "300 %"}


def _cannot_turn(ctx: Context, job: Job, meta: dict) -> str | None:
    """Why a page of this file cannot be turned and converted again (None: it can)."""
    box = ctx.store.inbox(job)
    if job.state != "done" or box is None:
        return "only a converted file's pages can be turned"
    if box.on_success == "delete":
        return ("its original was deleted once it was converted (on_success: delete): drop "
                "it into the inbox again to convert it anew")
    original = ctx.store.original(job, meta)
    if original is None:
        return "its original is no longer where ocrd left it"
    os.close(original.fd)
    return None


def upload_page(request: Request) -> Response:
    ctx: Context = request.app.state.ctx
    return render(request, "upload.html", inboxes=_inboxes(ctx),
                  limit=ctx.cfg.web.upload_max_bytes)


def api_page(request: Request) -> Response:
    """The API, readable: every endpoint with what it says about itself."""
    spec = api.schemas.get_schema(routes=request.app.routes)
    endpoints = [{"path": path, "method": method.upper(), **(doc or {})}
                 for path, methods in sorted(spec.get("paths", {}).items())
                 if path.startswith("/api/") for method, doc in methods.items()]
    return render(request, "api.html", endpoints=endpoints, info=spec.get("info", {}))


async def login(request: Request) -> Response:
    guard: Guard = request.scope["state"]["guard"]
    if request.method == "GET":
        return render(request, "login.html", failed=False, live=None)
    form = await request.form()
    if guard.token is None:
        return RedirectResponse("/", status_code=303)
    if not guard.token_matches(str(form.get("token") or "").strip()):
        return render(request, "login.html", status=403, failed=True, live=None)
    response = RedirectResponse("/", status_code=303)
    response.set_cookie(COOKIE, guard.session or "", httponly=True, samesite="strict",
                        secure=request.url.scheme == "https", path="/")
    return response


def healthz(request: Request) -> Response:
    return PlainTextResponse("ok\n")


# -- requests that end early ----------------------------------------------------------------

async def too_large(request: Request, exc: Exception) -> Response:
    return PlainTextResponse(f"{exc}\n", status_code=413, headers=actions.CLOSE)


async def abandoned(request: Request, exc: Exception) -> Response:
    """The client went away while its request's body arrived: one line, no traceback."""
    log.info("request_abandoned", path=request.url.path, method=request.method)
    return Response(status_code=400)  # nobody is there to read it


def create_app(ctx: Context) -> Starlette:
    routes = [
        Route("/", overview),
        Route("/fragments/live", live_fragment),
        Route("/files", files),
        Route("/search", search),
        Route("/files/{id:id}", review),
        Route("/files/{id:id}/pages/{page:id}", page_view),
        Route("/files/{id:id}/pages/{page:id}/turn", turn.turn_form, methods=["POST"]),
        Route("/files/{id:id}/retry", actions.retry_form, methods=["POST"]),
        Route("/files/{id:id}/dismiss", actions.dismiss_form, methods=["POST"]),
        Route("/failed", failed),
        Route("/failed/retry", actions.retry_reason_form, methods=["POST"]),
        Route("/upload", upload_page),
        Route("/upload", actions.upload_form, methods=["POST"]),
        Route("/api", api_page),
        Route("/login", login, methods=["GET", "POST"]),
        Route("/healthz", healthz),
        *serve.routes(),
        *api.routes(),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    for route in routes:  # the pages are not the API (/api/openapi.json)
        if isinstance(route, Route) and not route.path.startswith("/api/"):
            route.include_in_schema = False
    app = Starlette(routes=routes, exception_handlers={BodyTooLarge: too_large,
                                                       ClientDisconnect: abandoned})
    app.state.ctx = ctx
    return Guard(app, ctx.token, ctx.secret, ctx.cfg.web.loopback,  # type: ignore[return-value]
                 upload_limit=lambda: ctx.cfg.web.upload_max_bytes + actions.FORM_OVERHEAD)
