"""What every console page shares: its template rendering, the banners that say what is
wrong now (a missing inbox, the engine down, the daemon not answering), the one-time
message an action leaves (flash), and small parsing helpers."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import jinja2
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from ocrd import __version__
from ocrd.live import InboxLive, Live
from ocrd.names import shown
from ocrd.web.auth import Guard
from ocrd.web.context import Context
from ocrd.web.views import duration, eta_text, page_facts_text, size_text, when

HERE = Path(__file__).parent
FLASH = "ocrd_flash"
FLASH_MAX = 600  # characters of a flash message

_env = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"),
                          autoescape=True, trim_blocks=True, lstrip_blocks=True)
_env.filters.update(when=when, size=size_text, shown=shown, eta=eta_text, duration=duration)
_env.globals.update(page_facts_text=page_facts_text)


def banners(ctx: Context, live: Live | None) -> list[dict]:
    """What is wrong now, for the top of every page."""
    if live is None:
        return [{"kind": "bad", "id": "daemon-state",
                 "text": "The daemon does not answer (starting, stalled or stopped). "
                         "What the journal knows is shown."}]
    out = []
    if live.state == "ready" and not live.engine_ready:
        out.append({"kind": "bad", "id": "engine-down",
                    "text": f"The {live.engine_kind} engine is unavailable: pages wait until "
                            "it answers again (nothing fails for it)."})
    elif live.state == "starting":
        out.append({"kind": "warn", "id": "engine-loading",
                    "text": f"The {live.engine_kind} engine is loading."})
    for box in live.inboxes:
        if not box.available:
            out.append({"kind": "bad", "id": "inbox-missing",
                        "text": f"Inbox {box.path} is missing (an unmounted share?): files "
                                "put there are not seen until it is back."})
        elif box.paused:
            why = box.why or "its destination failed; new files are taken again shortly"
            out.append({"kind": "warn", "id": "inbox-paused",
                        "text": f"Inbox {box.path} is paused: {why}."})
        if box.unread:
            out.append({"kind": "warn", "id": "inbox-subfolders", "text": unread_text(box)})
    return out


def unread_text(box: InboxLive) -> str:
    """Files waiting in subfolders that a non-recursive inbox does not read, and why."""
    many = f"{box.unread}" if box.unread_complete else f"at least {box.unread}"
    files = "file waits" if box.unread == 1 and box.unread_complete else "files wait"
    return (f"Inbox {box.path}: {many} {files} in its subfolders (such as "
            f"{box.unread_first}) and {'is' if files == 'file waits' else 'are'} not read: "
            "the inbox is not recursive. Move them into the inbox folder itself, or set "
            "recursive: true for the inbox.")


def render(request: Request, name: str, status: int = 200, **context: object) -> Response:
    ctx: Context = request.app.state.ctx
    guard: Guard = request.scope["state"]["guard"]
    if "live" not in context:
        context["live"] = ctx.live()
    live = context["live"]
    flash = read_flash(request)
    body = _env.get_template(name).render(
        request=request, csrf=guard.csrf, version=__version__, path=request.url.path,
        auth=ctx.token_required, banners=banners(ctx, live),  # type: ignore[arg-type]
        flash=flash, search_on=ctx.cfg.web.search, **context)
    response = HTMLResponse(body, status_code=status)
    if flash is not None:
        response.delete_cookie(FLASH, path="/")
    return response


def set_flash(response: Response, kind: str, text: str) -> Response:
    """A message for the next page shown (after the redirect), in an HttpOnly cookie:
    not in the URL, so a reload does not show it again."""
    value = base64.urlsafe_b64encode(json.dumps(
        {"kind": kind, "text": text[:FLASH_MAX]}).encode()).decode()
    response.set_cookie(FLASH, value, max_age=120, path="/", httponly=True,
                        samesite="strict")
    return response


def read_flash(request: Request) -> dict | None:
    raw = request.cookies.get(FLASH)
    if not raw:
        return None
    try:
        value = json.loads(base64.urlsafe_b64decode(raw.encode()))
    except ValueError:
        return None
    if not isinstance(value, dict) or value.get("kind") not in ("good", "bad", "warn"):
        return None
    return {"kind": value["kind"], "text": str(value.get("text", ""))[:FLASH_MAX]}


def int_param(value: str | None, default: int, low: int, high: int) -> int:
    try:
        return max(low, min(high, int(value or default)))
    except ValueError:
        return default
