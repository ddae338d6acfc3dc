"""The console's "turn this page": a person says which way up a page of a converted file
is, and the file is converted again with that page read so.

The turn is kept in the journal by the document's content (`Journal.set_turn`, keyed by
the sidecar's sha256): every later conversion of that document reads the page turned so,
without the engine's own orientation detection (pipeline/pages.py hands the engine the
turned image, `PageRequest.turned`; the sidecar says `rotation` and `turned_by: hand`).
The original then goes back through the daemon's normal intake (`work/retry.py`'s
`convert_again`): from the archive into its inbox, or, kept in the inbox, marked as
changed; the new outputs replace the old ones (the same document from the same path).
The page's cached previews, drawn turned the old way, are dropped.

A POST carrying the CSRF token, answered by a redirect with a one-time message, like
every form of the console (actions.py).
"""

from __future__ import annotations

import asyncio
import contextlib

from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response

from ocrd.names import number, shown
from ocrd.render.previews import SIZES
from ocrd.web.auth import Guard
from ocrd.web.context import Context
from ocrd.web.pages import set_flash
from ocrd.work.journal import Journal
from ocrd.work.retry import RetryError, convert_again

TURNS = (0, 90, 180, 270)


def offered(rotation: int | None) -> list[tuple[int, str]]:
    """The turns offered for a page shown upright after `rotation` degrees (clockwise):
    (the rotation the page gets, what the button says)."""
    now = rotation or 0
    return [((now + 90) % 360, "90° clockwise"), ((now + 180) % 360, "upside down (180°)"),
            ((now + 270) % 360, "90° counter-clockwise")]


async def turn_form(request: Request) -> Response:
    ctx: Context = request.app.state.ctx
    guard: Guard = request.scope["state"]["guard"]
    form = await request.form()
    values = {k: v for k, v in form.items() if isinstance(v, str)}
    if not guard.check_csrf(request, values.get("csrf")):
        return PlainTextResponse("missing or wrong CSRF token: reload the page\n",
                                 status_code=403)
    job_id, page = request.path_params["id"], request.path_params["page"]
    back = f"/files/{job_id}/pages/{page}"
    rotation = number(values.get("rotation", ""))
    if rotation not in TURNS:
        return _back(back, "bad", "Choose how the page is to be turned.")
    ok, text = await turn(ctx, job_id, page, rotation)
    return _back(back, "good" if ok else "bad", text)


def _back(to: str, kind: str, text: str) -> Response:
    return set_flash(RedirectResponse(to, status_code=303), kind, text)


async def turn(ctx: Context, job_id: int, page: int, rotation: int) -> tuple[bool, str]:
    """(True, what happens now) or (False, why not)."""
    def work() -> tuple[bool, str]:
        with ctx.retry_lock:  # one action at a time: two clicks must not both move it
            job = ctx.store.job(job_id)
            if job is None or ctx.store.inbox(job) is None:
                return False, "No such file."
            if job.state != "done":
                return False, f"{shown(job.relpath)} is not converted (state: {job.state})."
            meta = ctx.store.sidecar(job) or {}
            sha = (meta.get("source") or {}).get("sha256")
            if not isinstance(sha, str) or not 1 <= page <= int(meta.get("page_count") or 0):
                return False, "That page is not in the file's results."
            journal = Journal(ctx.store.journal_path)
            try:
                before = journal.turns(sha).get(page)
                # recorded first: the daemon may take the file in the moment it is back
                journal.set_turn(sha, page, rotation)
                try:
                    where = convert_again(ctx.cfg, journal, job)
                except RetryError as e:
                    journal.set_turn(sha, page, before)
                    return False, f"Not turned: {e}."
            finally:
                journal.close()
            _forget_previews(ctx, sha, page)
            return True, (f"Page {page} is read turned {rotation}° from how it lies in the "
                          f"original: {shown(job.relpath)} is converted again (back in its "
                          f"inbox as {shown(str(where))}); its new results replace these.")

    return await asyncio.to_thread(work)


def _forget_previews(ctx: Context, sha: str, page: int) -> None:
    """The page's cached images, drawn turned as it was read before."""
    previews = ctx.store.previews
    if previews is None:
        return
    for size in SIZES:
        path = previews.path(sha, page, size)
        if path is not None:
            with contextlib.suppress(OSError):
                path.unlink()
