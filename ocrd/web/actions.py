"""What the console's forms do: retry a failed file (one, or every file of a reason),
dismiss one, upload a file into an inbox. Each is a POST carrying the CSRF token,
answered by a redirect to a page (POST-redirect-GET) with a one-time message that lives
in a cookie, not in the URL: a reload shows the page, not the message again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

import structlog
from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response

from ocrd.names import number, printable, shown
from ocrd.web.auth import BodyTooLarge, Guard
from ocrd.web.context import Context
from ocrd.web.pages import set_flash
from ocrd.web.upload import (
    UploadError,
    UploadForm,
    UploadRefused,
    UploadTooLarge,
    save,
    too_large,
)
from ocrd.web.views import CAUSE, RETRY_HELPS
from ocrd.work.journal import FileFilter, Journal
from ocrd.work.retry import RetryError, retry_job

log = structlog.get_logger("ocrd.web")

FORM_OVERHEAD = 64 * 1024  # multipart headers and the other fields, beside the file
MAX_RETRY_ALL = 10_000
# an answer given before the request's body was read to its end: the connection ends
# with it (the rest of the body is not read)
CLOSE = {"connection": "close"}


def _denied(headers: dict[str, str] | None = None) -> Response:
    return PlainTextResponse("missing or wrong CSRF token: reload the page\n",
                             status_code=403, headers=headers)


def _back(to: str, kind: str, text: str, headers: dict[str, str] | None = None
          ) -> Response:
    return set_flash(RedirectResponse(to, status_code=303, headers=headers), kind, text)


def _local(target: str, default: str) -> str:
    """Where to go back to: one of the console's own pages, never elsewhere."""
    ok = target.startswith("/") and not target.startswith("//") and "\\" not in target
    return target if ok and len(target) < 500 else default


async def _form(request: Request) -> tuple[dict, bool]:
    form = await request.form()
    guard: Guard = request.scope["state"]["guard"]
    values = {k: v for k, v in form.items() if isinstance(v, str)}
    return values, guard.check_csrf(request, values.get("csrf"))


async def retry_form(request: Request) -> Response:
    form, ok = await _form(request)
    if not ok:
        return _denied()
    ok, text = await retry(request.app.state.ctx, request.path_params["id"],
                           cause_gone=bool(form.get("cause_gone")))
    back = _local(form.get("back", ""), "/failed")
    if ok:
        return _back(back, "good", f"Put back into its inbox as {text}; the daemon "
                                   "converts it again.")
    return _back(back, "bad", text)


async def retry_reason_form(request: Request) -> Response:
    form, ok = await _form(request)
    if not ok:
        return _denied()
    reason = form.get("reason") or ""
    done, problems = await retry_reason(request.app.state.ctx, reason,
                                        bool(form.get("cause_gone")))
    if problems and not done:
        return _back("/failed", "bad", problems[0])
    text = f"{done} file(s) of reason {reason} put back into their inboxes."
    if problems:
        text += f" {len(problems)} could not be: {problems[0]}"
    return _back("/failed", "good" if not problems else "warn", text)


async def dismiss_form(request: Request) -> Response:
    form, ok = await _form(request)
    if not ok:
        return _denied()
    ok, text = await dismiss(request.app.state.ctx, request.path_params["id"])
    return _back(_local(form.get("back", ""), "/failed"), "good" if ok else "bad", text)


async def upload_form(request: Request) -> Response:
    ctx: Context = request.app.state.ctx
    guard: Guard = request.scope["state"]["guard"]
    limit = ctx.cfg.web.upload_max_bytes
    length = number(request.headers.get("content-length", ""))
    if length is None:
        return PlainTextResponse("an upload needs a Content-Length\n", status_code=411,
                                 headers=CLOSE)
    if length > limit + FORM_OVERHEAD:
        return _back("/upload", "bad", str(too_large(limit)), CLOSE)
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        return PlainTextResponse("an upload is a multipart/form-data form\n",
                                 status_code=400, headers=CLOSE)
    parser = UploadForm(request.headers, request.stream(), limit,
                        lambda fields: guard.check_csrf(request, fields.get("csrf")))
    try:
        form = await parser.parse()
    except UploadRefused:
        return _denied(CLOSE)
    except (UploadTooLarge, BodyTooLarge):
        return _back("/upload", "bad", str(too_large(limit)), CLOSE)
    except MultiPartException as e:
        return PlainTextResponse(f"not a form the console reads: {e.message}\n",
                                 status_code=400, headers=CLOSE)
    except ClientDisconnect:
        log.info("upload_abandoned", received_bytes=parser.file_bytes,
                 why="the browser went away before the whole file had arrived")
        return Response(status_code=400)
    try:
        if not guard.check_csrf(request, str(form.get("csrf") or "")):
            return _denied()
        file = form.get("file")
        inbox = str(form.get("inbox") or "")
        box = next((b for b in ctx.cfg.inboxes if shown(str(b.path)) == inbox), None)
        if box is None:
            return _back("/upload", "bad", "Choose one of the configured inboxes.")
        if not isinstance(file, UploadFile) or not file.filename:
            return _back("/upload", "bad", "Choose a file to upload.")
        try:
            name = await asyncio.to_thread(save, box, file.filename, file.file, limit)
        except UploadError as e:
            return _back("/upload", "bad", printable(str(e)))
        except OSError as e:
            return _back("/upload", "bad", f"Cannot write into {printable(inbox)}: "
                                           f"{e.strerror or e}")
    finally:
        await form.close()
    return _back("/files?state=waiting", "good", f"Uploaded into {printable(inbox)} as "
                                                 f"{printable(name)}; it is converted once "
                                                 "it is checked.")


# -- the work, shared with the JSON API -----------------------------------------------------

def refusal(reason: str | None, cause_gone: bool) -> str | None:
    """Why a retry is not offered for this reason (None: go ahead)."""
    if reason in RETRY_HELPS or cause_gone:
        return None
    hint = CAUSE.get(reason or "", "change what caused it")
    return (f"A retry of the same file fails the same way ({reason}): {hint}. If you "
            "have, confirm that the cause is gone.")


T = TypeVar("T")


async def _with_journal(ctx: Context, work: Callable[[Journal], T]) -> T:
    """work(journal) in a thread, one action at a time (two clicks on the same file
    must not both move it), on a writable connection of its own."""
    def run() -> T:
        with ctx.retry_lock:
            journal = Journal(ctx.store.journal_path)
            try:
                return work(journal)
            finally:
                journal.close()

    return await asyncio.to_thread(run)


async def retry(ctx: Context, job_id: int, cause_gone: bool = False) -> tuple[bool, str]:
    """(True, where it went) or (False, why not)."""
    def work(journal: Journal) -> tuple[bool, str]:
        job = journal.get(job_id)
        if job is None or ctx.store.inbox(job) is None:
            return False, "no such file"
        if job.state == "failed" and (why := refusal(job.reason, cause_gone)):
            return False, why
        try:
            return True, printable(str(retry_job(ctx.cfg, journal, job)))
        except RetryError as e:
            return False, printable(str(e))

    return await _with_journal(ctx, work)


async def retry_reason(ctx: Context, reason: str, cause_gone: bool
                       ) -> tuple[int, list[str]]:
    """Every failed file of `reason` back into its inbox: (how many, problems)."""
    if not reason:
        return 0, ["Choose a reason."]
    if why := refusal(reason, cause_gone):
        return 0, [why]

    def work(journal: Journal) -> tuple[int, list[str]]:
        jobs = journal.find(FileFilter(state="failed", reason=reason), MAX_RETRY_ALL)
        if not jobs:
            return 0, [f"No failed file has the reason {reason}."]
        done, problems = 0, []
        for job in jobs:
            if ctx.store.inbox(job) is None:
                problems.append(f"{printable(job.relpath)}: its inbox is no longer configured")
                continue
            try:
                retry_job(ctx.cfg, journal, job)
                done += 1
            except RetryError as e:
                problems.append(printable(str(e)))
        return done, problems

    return await _with_journal(ctx, work)


async def dismiss(ctx: Context, job_id: int) -> tuple[bool, str]:
    def work(journal: Journal) -> tuple[bool, str]:
        job = journal.get(job_id)
        if job is None or ctx.store.inbox(job) is None:
            return False, "no such file"
        if not journal.dismiss(job_id):
            return False, f"{printable(job.relpath)} is not failed (state: {job.state})"
        return True, (f"{printable(job.relpath)} dismissed: off the Failed list; its original "
                      "stays in the failed folder.")

    return await _with_journal(ctx, work)
