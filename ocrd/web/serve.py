"""The files of a journal row, served: Markdown and sidecar (downloads), the original and
the searchable PDF (shown in the browser when they are a PDF or an image, downloaded
otherwise), figure crops, page images.

A file opened inline gets a content type from its first bytes (never from its name),
and a sandboxing Content-Security-Policy: a hostile PDF or SVG can run nothing in the
console's origin.
"""

from __future__ import annotations

import os

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from ocrd.names import shown
from ocrd.web.context import Context
from ocrd.web.pages import HERE
from ocrd.web.store import Opened, open_inside

_TYPES = {".md": "text/markdown; charset=utf-8", ".json": "application/json"}
# what a browser shows by itself, by the file's first bytes
_INLINE = ((b"%PDF-", "application/pdf"), (b"\x89PNG\r\n\x1a\n", "image/png"),
           (b"\xff\xd8\xff", "image/jpeg"), (b"GIF87a", "image/gif"),
           (b"GIF89a", "image/gif"))
SANDBOX = ("sandbox; default-src 'none'; img-src 'self' data:; "
           "style-src 'unsafe-inline'; frame-ancestors 'none'")
SANDBOX_PDF = ("default-src 'none'; img-src 'self' data:; style-src 'unsafe-inline'; "
               "object-src 'self'; script-src 'none'; form-action 'none'; "
               "frame-ancestors 'none'")


def closed(opened: Opened | None) -> bool:
    """True when the file could be opened (and is closed again)."""
    if opened is None:
        return False
    os.close(opened.fd)
    return True


def _disposition(kind: str, opened: Opened) -> str:
    name = shown(opened.name).encode("ascii", "replace").decode().replace('"', "_")
    return f'{kind}; filename="{name}"'


def _stream(opened: Opened, ctype: str, disposition: str,
            extra: dict[str, str] | None = None) -> Response:
    return StreamingResponse(opened.chunks(), media_type=ctype, headers={
        "content-length": str(opened.size), "content-disposition": disposition,
        **(extra or {})})


def sniff(opened: Opened) -> str | None:
    head = os.pread(opened.fd, 16, 0)
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "image/webp"
    return next((ctype for magic, ctype in _INLINE if head.startswith(magic)), None)


def download(request: Request) -> Response:
    ctx: Context = request.app.state.ctx
    job = ctx.store.job(request.path_params["id"])
    kind = request.path_params["kind"]
    if job is None:
        return PlainTextResponse("not found\n", status_code=404)
    if kind == "original":
        opened = ctx.store.original(job, ctx.store.sidecar(job))
        ctype = "application/octet-stream"
    elif kind not in ("md", "json"):  # an output the sidecar lists (pdf, hocr ...)
        opened = ctx.store.output(job, ctx.store.sidecar(job), kind)
        ctype = "application/pdf" if kind == "pdf" else "application/octet-stream"
    else:
        opened = ctx.store.open_output(job, "." + kind)
        ctype = _TYPES["." + kind]
    if opened is None:
        return PlainTextResponse("not found\n", status_code=404)
    return _stream(opened, ctype, _disposition("attachment", opened))


def inline(request: Request) -> Response:
    """The original (or the searchable PDF) shown in the browser: PDFs and images
    inline, sandboxed; anything else as a download."""
    ctx: Context = request.app.state.ctx
    job = ctx.store.job(request.path_params["id"])
    kind = request.path_params["kind"]
    if job is None:
        return PlainTextResponse("not found\n", status_code=404)
    meta = ctx.store.sidecar(job)
    opened = ctx.store.original(job, meta) if kind == "original" else \
        ctx.store.output(job, meta, kind)
    if opened is None:
        return PlainTextResponse("not found\n", status_code=404)
    ctype = sniff(opened)
    if ctype is None:
        return _stream(opened, "application/octet-stream", _disposition("attachment", opened))
    # Chromium's PDF viewer does not run in a sandboxed document; a PDF gets a policy
    # that allows no script, form or connection instead
    policy = SANDBOX_PDF if ctype == "application/pdf" else SANDBOX
    return _stream(opened, ctype, _disposition("inline", opened),
                   {"content-security-policy": policy})


def asset(request: Request) -> Response:
    ctx: Context = request.app.state.ctx
    job = ctx.store.job(request.path_params["id"])
    opened = ctx.store.asset(job, request.path_params["name"], ctx.store.sidecar(job)) \
        if job is not None else None
    if opened is None:
        return PlainTextResponse("not found\n", status_code=404)
    return Response(opened.read(), media_type="image/png")


def preview(request: Request) -> Response:
    """A page image, upright: cached, or rendered now from the original."""
    ctx: Context = request.app.state.ctx
    job = ctx.store.job(request.path_params["id"])
    size = request.query_params.get("size") or "page"
    data = ctx.store.preview(job, ctx.store.sidecar(job), request.path_params["page"],
                             size) if job is not None else None
    if data is None:
        return PlainTextResponse("no image of this page\n", status_code=404)
    return Response(data, media_type="image/jpeg",
                    headers={"cache-control": "private, max-age=3600"})


def cached_pages(ctx: Context, meta: dict | None) -> set[int]:
    """Pages whose image is in the cache (for a document whose original is gone)."""
    previews = ctx.store.previews
    sha = ((meta or {}).get("source") or {}).get("sha256")
    folder = previews.folder(sha) if previews is not None and isinstance(sha, str) else None
    if folder is None:
        return set()
    out = set()
    for page in range(1, int((meta or {}).get("page_count") or 0) + 1):
        path = previews.path(sha, page)  # type: ignore[union-attr]
        if path is not None and closed(open_inside(previews.root, path)):  # type: ignore[union-attr]
            out.add(page)
    return out


def favicon(request: Request) -> Response:
    return Response((HERE / "static" / "favicon.svg").read_bytes(),
                    media_type="image/svg+xml",
                    headers={"cache-control": "public, max-age=86400"})


def routes() -> list[Route]:
    return [
        Route("/files/{id:id}/download/{kind}", download),
        Route("/files/{id:id}/open/{kind}", inline),
        Route("/files/{id:id}/assets/{name}", asset),
        Route("/files/{id:id}/pages/{page:id}.jpg", preview),
        Route("/favicon.ico", favicon),
    ]
