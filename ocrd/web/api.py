"""The console's JSON API, for scripts and other tools; /api/openapi.json describes it
(from these docstrings, by Starlette's schema generator)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.schemas import SchemaGenerator

from ocrd import __version__
from ocrd.web import actions
from ocrd.web.auth import Guard
from ocrd.web.context import Context
from ocrd.web.pages import banners
from ocrd.web.queries import LIST_STATES, search_results, waiting_list
from ocrd.web.store import listed_outputs
from ocrd.web.views import job_facts
from ocrd.work.journal import FILTER_STATES, MAX_INTEGER, FileFilter

MAX_LIMIT = 500

schemas = SchemaGenerator({"openapi": "3.0.0", "info": {
    "title": "ocrd console API", "version": __version__,
    "description": "Off loopback every call needs `Authorization: Bearer TOKEN`. POST "
                   "calls need the bearer token or the `X-CSRF-Token` header (its value is "
                   "`csrf` in GET /api/status)."}})


def status(request: Request) -> Response:
    """
    summary: The daemon's state now, counts by state, failures by reason.
    responses:
      200:
        description: "`daemon` is null when the daemon's loop did not answer within a
          second; its `inboxes[].files` are the files seen and not yet claimed (why they
          wait, until when) and `converting_files` the documents being converted (page
          k of n, an estimate). `waiting` lists the former with their inbox. `counts`
          are journal states (claimed, converting, done, failed, retried, dismissed).
          `problems` are the console's banners (a missing inbox, the engine down)."
    """

    ctx: Context = request.app.state.ctx
    guard: Guard = request.scope["state"]["guard"]
    journal = ctx.store.journal()
    live = ctx.live()
    return JSONResponse({
        "version": __version__,
        "daemon": live.as_dict() if live is not None else None,
        "waiting": waiting_list(live),
        "converting": [f.__dict__ for f in live.converting_files] if live else [],
        "problems": banners(ctx, live),
        "counts": journal.counts(),
        "failures_by_reason": journal.failures_by_reason(),
        "csrf": guard.csrf,
    })


def files(request: Request) -> Response:
    """
    summary: Files the journal knows, newest first.
    parameters:
      - {name: state, in: query, schema: {type: string, enum: [waiting, queued, converting,
         done, degraded, failed, retried, dismissed]}, description: "waiting: files seen
         in an inbox, not yet claimed (`waiting` in the answer, not `files`)"}
      - {name: inbox, in: query, schema: {type: string}, description: the inbox's path}
      - {name: q, in: query, schema: {type: string}, description: part of the file's path}
      - {name: reason, in: query, schema: {type: string}, description: failure reason}
      - {name: limit, in: query, schema: {type: integer, default: 50, maximum: 500}}
      - {name: offset, in: query, schema: {type: integer, default: 0}}
    responses:
      200: {description: "{total, limit, offset, files: [...]} (state=waiting: waiting)"}
      400: {description: an unknown state or a bad number}
    """

    ctx: Context = request.app.state.ctx
    q = request.query_params
    state = q.get("state") or None
    if state is not None and state not in LIST_STATES:
        return JSONResponse({"error": f"unknown state {state!r}",
                             "states": LIST_STATES}, status_code=400)
    if state == "waiting":
        waiting = waiting_list(ctx.live())
        return JSONResponse({"total": len(waiting), "waiting": waiting, "files": []})
    window = _window(request, 50)
    if isinstance(window, Response):
        return window
    limit, offset = window
    where = FileFilter(state=state if state in FILTER_STATES else None,
                       inbox=q.get("inbox") or None, name=q.get("q") or None,
                       reason=q.get("reason") or None)
    jobs, total = ctx.store.find(where, limit, offset)
    return JSONResponse({"total": total, "limit": limit, "offset": offset,
                         "files": [job_facts(j) for j in jobs]})


def file(request: Request) -> Response:
    """
    summary: One file - the journal's facts and the sidecar (null until converted).
    responses:
      200: {description: "{file, sidecar, links}"}
      404: {description: "no such file, or its inbox is not configured"}
    """
    ctx: Context = request.app.state.ctx
    job_id = request.path_params["id"]
    job = ctx.store.job(job_id)
    if job is None or ctx.store.inbox(job) is None:
        return JSONResponse({"error": "no such file"}, status_code=404)
    base = f"/files/{job_id}"
    return JSONResponse({
        "file": job_facts(job), "sidecar": ctx.store.sidecar(job),
        "links": {"review": base, "markdown": f"{base}/download/md",
                  "sidecar": f"{base}/download/json", "original": f"{base}/download/original",
                  "original_inline": f"{base}/open/original", "pdf": f"{base}/open/pdf",
                  "outputs": {name: f"{base}/download/{name}"
                              for name in listed_outputs(ctx.store.sidecar(job))}},
    })


def search(request: Request) -> Response:
    """
    summary: Full-text search over every converted page.
    parameters:
      - {name: q, in: query, required: true, schema: {type: string}, description: "words
         (all must be on the page), a phrase in double quotes, word* for a prefix;
         CJK text as typed"}
      - {name: limit, in: query, schema: {type: integer, default: 20, maximum: 500}}
      - {name: offset, in: query, schema: {type: integer, default: 0}}
    responses:
      200: {description: "{total, hits: [{file, page, snippet (HTML, hits in <mark>),
        review}]}, best first (newest first when more than 1000 pages match); a total
        of 1001 means more than 1000"}
      400: {description: no words, or a bad number}
    """

    q = request.query_params
    window = _window(request, 20)
    if isinstance(window, Response):
        return window
    limit, offset = window
    hits, total, error = search_results(request.app.state.ctx, q.get("q") or "", limit,
                                        offset)
    if error or not (q.get("q") or "").strip():
        error = error or "q: type one or more words to find"
        return JSONResponse({"error": error}, status_code=400)
    return JSONResponse({"total": total, "limit": limit, "offset": offset, "hits": hits})


def _window(request: Request, default_limit: int) -> tuple[int, int] | Response:
    """(limit, offset) from the query, or the 400 that says what is wrong with them."""
    q = request.query_params
    try:
        limit = int(q.get("limit") or default_limit)
        offset = int(q.get("offset") or 0)
    except ValueError:
        return JSONResponse({"error": "limit and offset must be integers"}, status_code=400)
    if not 1 <= limit <= MAX_LIMIT or not 0 <= offset <= MAX_INTEGER:
        return JSONResponse({"error": f"limit must be 1..{MAX_LIMIT}, offset 0..{MAX_INTEGER}"},
                            status_code=400)
    return limit, offset


def _guarded(request: Request) -> Response | None:
    guard: Guard = request.scope["state"]["guard"]
    if not guard.check_csrf(request, None):
        return JSONResponse({"error": "missing or wrong X-CSRF-Token header"},
                            status_code=403)
    return None


async def retry_endpoint(request: Request) -> Response:
    """
    summary: Put a failed file's original back into its inbox, to be converted again.
    parameters:
      - {name: cause_gone, in: query, schema: {type: boolean}, description: "needed for
         reasons a retry of the same file cannot change (encrypted, empty, ...): the
         person says the cause is gone"}
    responses:
      200: {description: "{retried: true, put_back: PATH}"}
      403: {description: no CSRF token (and no bearer token)}
      409: {description: "not failed, its original is gone, or a retry cannot help:
        {error}"}
    """
    if (denied := _guarded(request)) is not None:
        return denied
    ok, text = await actions.retry(request.app.state.ctx, request.path_params["id"],
                                   _yes(request.query_params.get("cause_gone")))
    if ok:
        return JSONResponse({"retried": True, "put_back": text})
    return JSONResponse({"error": text}, status_code=409)


async def retry_reason_endpoint(request: Request) -> Response:
    """
    summary: Put every failed file of one reason back into its inbox.
    parameters:
      - {name: reason, in: query, required: true, schema: {type: string}}
      - {name: cause_gone, in: query, schema: {type: boolean}}
    responses:
      200: {description: "{retried: N, problems: [...]}"}
      403: {description: no CSRF token (and no bearer token)}
      409: {description: "nothing retried: {error}"}
    """
    if (denied := _guarded(request)) is not None:
        return denied
    done, problems = await actions.retry_reason(
        request.app.state.ctx, request.query_params.get("reason") or "",
        _yes(request.query_params.get("cause_gone")))
    if not done and problems:
        return JSONResponse({"error": problems[0], "problems": problems}, status_code=409)
    return JSONResponse({"retried": done, "problems": problems})


async def dismiss_endpoint(request: Request) -> Response:
    """
    summary: Set a failed file aside (off the Failed list; the original stays in failed/).
    responses:
      200: {description: "{dismissed: true}"}
      403: {description: no CSRF token (and no bearer token)}
      409: {description: "not failed: {error}"}
    """
    if (denied := _guarded(request)) is not None:
        return denied
    ok, text = await actions.dismiss(request.app.state.ctx, request.path_params["id"])
    if ok:
        return JSONResponse({"dismissed": True})
    return JSONResponse({"error": text}, status_code=409)


def _yes(value: str | None) -> bool:
    return (value or "").lower() in ("1", "true", "yes", "on")


def openapi(request: Request) -> Response:
    return JSONResponse(schemas.get_schema(routes=request.app.routes))


def routes() -> list[Route]:
    return [
        Route("/api/status", status),
        Route("/api/files", files),
        Route("/api/files/{id:id}", file),
        Route("/api/files/{id:id}/retry", retry_endpoint, methods=["POST"]),
        Route("/api/files/{id:id}/dismiss", dismiss_endpoint, methods=["POST"]),
        Route("/api/failed/retry", retry_reason_endpoint, methods=["POST"]),
        Route("/api/search", search),
        Route("/api/openapi.json", openapi, include_in_schema=False),
    ]
