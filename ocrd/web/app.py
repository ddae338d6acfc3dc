"""The console's pages: overview, files, review, failed, login (Starlette + Jinja2).

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

import jinja2
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from .. import __version__
from ..journal import FILTER_STATES, FileFilter
from ..names import shown
from . import api
from .auth import COOKIE, Guard
from .context import Context
from .store import Opened
from .views import duration, job_facts, page_facts_text, review_pages, size_text, state_of, when

HERE = Path(__file__).parent
PAGE_SIZE = 50
CHART_HOURS = 6
CHART_BUCKET = 600  # seconds per bar

_env = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"),
                          autoescape=True, trim_blocks=True, lstrip_blocks=True)
_env.filters.update(when=when, size=size_text, shown=shown, duration=duration)
_env.globals.update(page_facts_text=page_facts_text)


def render(request: Request, name: str, status: int = 200, **context: object) -> Response:
    ctx: Context = request.app.state.ctx
    guard: Guard = request.scope["state"]["guard"]
    body = _env.get_template(name).render(
        request=request, csrf=guard.csrf, version=__version__, path=request.url.path,
        auth=ctx.token_required, **context)
    return HTMLResponse(body, status_code=status)


def _filters(request: Request) -> FileFilter:
    q = request.query_params
    state = q.get("state") or None
    return FileFilter(state=state if state in FILTER_STATES else None,
                      inbox=q.get("inbox") or None, name=q.get("q") or None,
                      reason=q.get("reason") or None)


def _int(value: str | None, default: int, low: int, high: int) -> int:
    try:
        return max(low, min(high, int(value or default)))
    except ValueError:
        return default


# -- overview -----------------------------------------------------------------------------

def overview(request: Request) -> Response:
    return render(request, "overview.html", **_live_context(request.app.state.ctx))


def live_fragment(request: Request) -> Response:
    return render(request, "_live.html", **_live_context(request.app.state.ctx))


def _live_context(ctx: Context) -> dict:
    journal = ctx.store.journal()
    now = time.time()
    since = (now // CHART_BUCKET - CHART_HOURS * 3600 // CHART_BUCKET + 1) * CHART_BUCKET
    buckets = journal.pages_per_bucket(since, CHART_BUCKET)
    bars = [buckets.get(int(since + k * CHART_BUCKET), 0) / CHART_BUCKET
            for k in range(CHART_HOURS * 3600 // CHART_BUCKET)]
    per_inbox = {shown(inbox): {"queued": n.get("claiming", 0) + n.get("claimed", 0),
                                "converting": n.get("converting", 0) + n.get("finishing", 0)}
                 for inbox, n in journal.open_by_inbox().items()}
    return {
        "live": ctx.live(),
        "per_inbox": per_inbox,
        "counts": journal.counts(),
        "recent_done": [job_facts(j) for j in journal.recent("done", 10)],
        "recent_failed": [job_facts(j) for j in journal.recent("failed", 10)],
        "bars": bars, "bar_max": max(bars + [0.01]), "chart_hours": CHART_HOURS,
    }


# -- files ----------------------------------------------------------------------------------

def files(request: Request) -> Response:
    ctx: Context = request.app.state.ctx
    where = _filters(request)
    page = _int(request.query_params.get("page"), 1, 1, 10**7)
    jobs, total = ctx.store.find(where, PAGE_SIZE, (page - 1) * PAGE_SIZE)
    pages = max(1, math.ceil(total / PAGE_SIZE))
    base = {k: v for k, v in (("state", where.state), ("inbox", where.inbox),
                              ("q", where.name)) if v}
    return render(request, "files.html", jobs=[job_facts(j) for j in jobs], total=total,
                  page=page, pages=pages, where=where, states=list(FILTER_STATES),
                  inboxes=[shown(str(b.path)) for b in ctx.cfg.inboxes],
                  link=lambda n: "/files?" + urlencode({**base, "page": n}))


def failed(request: Request) -> Response:
    ctx: Context = request.app.state.ctx
    reason = request.query_params.get("reason") or None
    page = _int(request.query_params.get("page"), 1, 1, 10**7)
    where = FileFilter(state="failed", reason=reason)
    jobs, total = ctx.store.find(where, PAGE_SIZE, (page - 1) * PAGE_SIZE)
    q = request.query_params
    return render(request, "failed.html", jobs=[job_facts(j) for j in jobs], total=total,
                  page=page, pages=max(1, math.ceil(total / PAGE_SIZE)), reason=reason,
                  reasons=ctx.store.journal().failures_by_reason(),
                  retried=q.get("retried"), put_back=q.get("put_back"),
                  error=q.get("error"))


def review(request: Request) -> Response:
    ctx: Context = request.app.state.ctx
    job = ctx.store.job(request.path_params["id"])
    if job is None or ctx.store.inbox(job) is None:
        return render(request, "missing.html", status=404)
    meta = ctx.store.sidecar(job)
    markdown = ctx.store.text(job, ".md")
    pages = review_pages(markdown, meta, job.id) if markdown is not None else []
    has_preview = {p.page for p in pages
                   if (o := ctx.store.preview(meta, p.page)) is not None and _closed(o)}
    return render(request, "review.html", job=job_facts(job), meta=meta or {},
                  pages=pages, has_preview=has_preview, state=state_of(job),
                  has_original=_closed(ctx.store.original(job, meta)))


def _closed(opened: Opened | None) -> bool:
    """True when the file could be opened (and is closed again)."""
    if opened is None:
        return False
    os.close(opened.fd)
    return True


# -- files of a row -----------------------------------------------------------------------

_TYPES = {".md": "text/markdown; charset=utf-8", ".json": "application/json"}


def download(request: Request) -> Response:
    ctx: Context = request.app.state.ctx
    job = ctx.store.job(request.path_params["id"])
    kind = request.path_params["kind"]
    if job is None or kind not in ("md", "json", "original"):
        return PlainTextResponse("not found\n", status_code=404)
    if kind == "original":
        opened = ctx.store.original(job, ctx.store.sidecar(job))
        ctype = "application/octet-stream"
    else:
        opened = ctx.store.open_output(job, "." + kind)
        ctype = _TYPES["." + kind]
    if opened is None:
        return PlainTextResponse("not found\n", status_code=404)
    name = shown(opened.name).encode("ascii", "replace").decode().replace('"', "_")
    return StreamingResponse(opened.chunks(), media_type=ctype, headers={
        "content-length": str(opened.size),
        "content-disposition": f'attachment; filename="{name}"'})


def asset(request: Request) -> Response:
    ctx: Context = request.app.state.ctx
    job = ctx.store.job(request.path_params["id"])
    opened = ctx.store.asset(job, request.path_params["name"], ctx.store.sidecar(job)) \
        if job is not None else None
    if opened is None:
        return PlainTextResponse("not found\n", status_code=404)
    return Response(opened.read(), media_type="image/png")


def preview(request: Request) -> Response:
    ctx: Context = request.app.state.ctx
    job = ctx.store.job(request.path_params["id"])
    opened = ctx.store.preview(ctx.store.sidecar(job), request.path_params["page"]) \
        if job is not None else None
    if opened is None:
        return PlainTextResponse("not found\n", status_code=404)
    return Response(opened.read(), media_type="image/jpeg")


# -- actions ----------------------------------------------------------------------------------

async def retry_form(request: Request) -> Response:
    form = await request.form()
    guard: Guard = request.scope["state"]["guard"]
    if not guard.check_csrf(request, str(form.get("csrf") or "")):
        return PlainTextResponse("missing or wrong CSRF token: reload the page\n",
                                 status_code=403)
    ok, text = await api.retry(request.app.state.ctx, request.path_params["id"])
    query = {"retried": request.path_params["id"], "put_back": text} if ok else \
        {"error": text}
    return RedirectResponse("/failed?" + urlencode(query), status_code=303)


async def login(request: Request) -> Response:
    guard: Guard = request.scope["state"]["guard"]
    if request.method == "GET":
        return render(request, "login.html", failed=False)
    form = await request.form()
    if guard.token is None:
        return RedirectResponse("/", status_code=303)
    if not guard.token_matches(str(form.get("token") or "").strip()):
        return render(request, "login.html", status=403, failed=True)
    response = RedirectResponse("/", status_code=303)
    response.set_cookie(COOKIE, guard.session or "", httponly=True, samesite="strict",
                        secure=request.url.scheme == "https", path="/")
    return response


def healthz(request: Request) -> Response:
    return PlainTextResponse("ok\n")


def create_app(ctx: Context) -> Starlette:
    routes = [
        Route("/", overview),
        Route("/fragments/live", live_fragment),
        Route("/files", files),
        Route("/files/{id:int}", review),
        Route("/files/{id:int}/download/{kind}", download),
        Route("/files/{id:int}/assets/{name}", asset),
        Route("/files/{id:int}/pages/{page:int}.jpg", preview),
        Route("/files/{id:int}/retry", retry_form, methods=["POST"]),
        Route("/failed", failed),
        Route("/login", login, methods=["GET", "POST"]),
        Route("/healthz", healthz),
        *api.routes(),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    app = Starlette(routes=routes)
    app.state.ctx = ctx
    return Guard(app, ctx.token, ctx.secret, ctx.cfg.web.loopback)  # type: ignore[return-value]
