"""The console's JSON API, for scripts and other tools; /api/openapi.json describes it
(from these docstrings, by Starlette's schema generator)."""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.schemas import SchemaGenerator

from .. import __version__
from ..journal import FILTER_STATES, FileFilter, Journal
from ..names import shown
from ..retry import RetryError, retry_job
from .auth import Guard
from .context import Context
from .views import job_facts

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
          second. `counts` are journal states (claimed, converting, done, failed,
          retried ...)."
    """
    ctx: Context = request.app.state.ctx
    guard: Guard = request.scope["state"]["guard"]
    journal = ctx.store.journal()
    live = ctx.live()
    return JSONResponse({
        "version": __version__,
        "daemon": live.as_dict() if live is not None else None,
        "counts": journal.counts(),
        "failures_by_reason": journal.failures_by_reason(),
        "csrf": guard.csrf,
    })


def files(request: Request) -> Response:
    """
    summary: Files the journal knows, newest first.
    parameters:
      - {name: state, in: query, schema: {type: string, enum: [waiting, converting, done,
         degraded, failed, retried]}}
      - {name: inbox, in: query, schema: {type: string}, description: the inbox's path}
      - {name: q, in: query, schema: {type: string}, description: part of the file's path}
      - {name: reason, in: query, schema: {type: string}, description: failure reason}
      - {name: limit, in: query, schema: {type: integer, default: 50, maximum: 500}}
      - {name: offset, in: query, schema: {type: integer, default: 0}}
    responses:
      200: {description: "{total, limit, offset, files: [...]}"}
      400: {description: an unknown state or a bad number}
    """
    ctx: Context = request.app.state.ctx
    q = request.query_params
    state = q.get("state") or None
    if state is not None and state not in FILTER_STATES:
        return JSONResponse({"error": f"unknown state {state!r}",
                             "states": list(FILTER_STATES)}, status_code=400)
    try:
        limit = int(q.get("limit") or 50)
        offset = int(q.get("offset") or 0)
    except ValueError:
        return JSONResponse({"error": "limit and offset must be integers"}, status_code=400)
    if not 1 <= limit <= MAX_LIMIT or offset < 0:
        return JSONResponse({"error": f"limit must be 1..{MAX_LIMIT}, offset >= 0"},
                            status_code=400)
    where = FileFilter(state=state, inbox=q.get("inbox") or None, name=q.get("q") or None,
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
                  "sidecar": f"{base}/download/json", "original": f"{base}/download/original"},
    })


async def retry_endpoint(request: Request) -> Response:
    """
    summary: Put a failed file's original back into its inbox, to be converted again.
    responses:
      200: {description: "{retried: true, put_back: PATH}"}
      403: {description: no CSRF token (and no bearer token)}
      409: {description: "not failed, or its original is gone: {error}"}
    """
    guard: Guard = request.scope["state"]["guard"]
    if not guard.check_csrf(request, None):
        return JSONResponse({"error": "missing or wrong X-CSRF-Token header"},
                            status_code=403)
    ok, text = await retry(request.app.state.ctx, request.path_params["id"])
    if ok:
        return JSONResponse({"retried": True, "put_back": text})
    return JSONResponse({"error": text}, status_code=409)


async def retry(ctx: Context, job_id: int) -> tuple[bool, str]:
    """(True, where it went) or (False, why not); the work runs in a thread."""
    def run() -> tuple[bool, str]:
        with ctx.retry_lock:
            journal = Journal(ctx.store.journal_path)
            try:
                job = journal.get(job_id)
                if job is None or ctx.store.inbox(job) is None:
                    return False, "no such file"
                return True, shown(str(retry_job(ctx.cfg, journal, job)))
            except RetryError as e:
                return False, str(e)
            finally:
                journal.close()

    return await asyncio.to_thread(run)


def openapi(request: Request) -> Response:
    return JSONResponse(schemas.get_schema(routes=request.app.routes))


def routes() -> list[Route]:
    return [
        Route("/api/status", status),
        Route("/api/files", files),
        Route("/api/files/{id:int}", file),
        Route("/api/files/{id:int}/retry", retry_endpoint, methods=["POST"]),
        Route("/api/openapi.json", openapi, include_in_schema=False),
    ]
