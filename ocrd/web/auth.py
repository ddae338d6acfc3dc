"""Who may use the console, and what a browser may do with its pages.

- Off loopback a token is required for everything but `/healthz`, `/login` and the
  static assets: `Authorization: Bearer TOKEN` (scripts) or the cookie `/login` sets
  (browsers; HttpOnly, SameSite=Strict, holding a value derived from the token).
- On loopback the Host header must name a loopback address, so that a web page whose
  host name resolves to 127.0.0.1 (DNS rebinding) cannot read the console.
- Actions are POST only and carry a CSRF token (form field `csrf` or header
  `X-CSRF-Token`), unless they come with the bearer token, which a browser never adds
  on its own.
- Every answer carries a Content-Security-Policy that allows scripts, styles and images
  from the console alone and no inline script, so text that slipped through as HTML
  still could not run.
- A request's body is counted as it arrives, whatever its headers say: more than the
  upload limit (POST /upload) or than SMALL_BODY (anything else) ends the request
  (`BodyTooLarge`). A body sent with Transfer-Encoding is refused before it is read (411):
  every form of the console is sent with a Content-Length.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import secrets
from collections.abc import Callable
from pathlib import Path

from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ocrd.config.settings import ConfigError, WebConfig

COOKIE = "ocrd_console"
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
       "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
]
OPEN_PATHS = ("/healthz", "/login", "/favicon.ico")
MIN_TOKEN_CHARS = 16
# the most body any request but an upload may send (the console's own forms are far smaller)
SMALL_BODY = 64 * 1024
UPLOAD_PATH = "/upload"


class BodyTooLarge(Exception):
    """A request's body went past its limit while it arrived (the request ends there)."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"the request's body is larger than {limit} bytes")
        self.limit = limit


def load_token(cfg: WebConfig) -> str | None:
    """The token from `web.token_file`: a bare name is looked up in systemd's
    $CREDENTIALS_DIRECTORY (LoadCredential=) first. Raises ConfigError when it is set
    but missing, unreadable, empty or short — the daemon then does not start."""
    if cfg.token_file is None:
        return None
    path = cfg.token_file
    creds = os.environ.get("CREDENTIALS_DIRECTORY")
    if creds and len(path.parts) == 1 and (Path(creds) / path).exists():
        path = Path(creds) / path
    try:
        token = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"web.token_file = {str(cfg.token_file)!r}: cannot be read "
                          f"({getattr(e, 'strerror', None) or e})") from None
    if len(token) < MIN_TOKEN_CHARS:
        raise ConfigError(f"web.token_file = {str(cfg.token_file)!r}: the token must have "
                          f"at least {MIN_TOKEN_CHARS} characters (e.g. the output of "
                          "`openssl rand -hex 32`)")
    return token


def load_secret(state_dir: Path) -> bytes:
    """A random key kept under state_dir (mode 0600): CSRF tokens survive restarts."""
    path = state_dir / "web-secret"
    try:
        data = path.read_bytes()
        if len(data) >= 32:
            return data
    except FileNotFoundError:
        pass
    data = secrets.token_bytes(32)
    tmp = path.with_name(f".web-secret-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
    return data


def _derive(key: bytes, what: str) -> str:
    return hmac.new(key, what.encode(), hashlib.sha256).hexdigest()


def _loopback_host(host: str) -> bool:
    name = host.rsplit(":", 1)[0] if not host.startswith("[") else host[1:].split("]")[0]
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


class Guard:
    """ASGI middleware: host check, token check, bounded bodies, security headers."""

    def __init__(self, app: ASGIApp, token: str | None, secret: bytes,
                 loopback: bool, upload_limit: Callable[[], int] = lambda: 0) -> None:
        """`upload_limit`: the most bytes an upload's body may have, asked per request
        (a reload may change it)."""
        self.app = app
        self.token = token
        self.loopback = loopback
        self.upload_limit = upload_limit
        self.csrf = _derive(secret, "csrf")
        self.session = _derive(token.encode(), "session") if token else None

    def authorized(self, headers: Headers, cookies: dict[str, str]) -> bool:
        if self.token is None:
            return True
        return self.bearer(headers) or hmac.compare_digest(
            cookies.get(COOKIE, ""), self.session or "")

    def bearer(self, headers: Headers) -> bool:
        given = headers.get("authorization", "")
        return given.startswith("Bearer ") and self.token_matches(given[7:].strip())

    def token_matches(self, given: str) -> bool:
        return self.token is not None and hmac.compare_digest(given.encode(),
                                                              self.token.encode())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        scope.setdefault("state", {})["guard"] = self
        if self.loopback and not _loopback_host(request.headers.get("host", "")):
            response = PlainTextResponse("this console answers to loopback host names "
                                         "only\n", status_code=421)
        elif "transfer-encoding" in request.headers:
            response = PlainTextResponse("send the body with a Content-Length (no "
                                         "Transfer-Encoding)\n", status_code=411,
                                         headers={"connection": "close"})
        elif request.url.path in OPEN_PATHS or request.url.path.startswith("/static/") or \
                self.authorized(request.headers, request.cookies):
            response = None
        elif request.url.path.startswith("/api/"):
            response = JSONResponse({"error": "token required"}, status_code=401,
                                    headers={"WWW-Authenticate": "Bearer"})
        else:
            response = RedirectResponse("/login", status_code=303)
        if response is not None:
            if request.headers.get("content-length", "0") != "0":
                response.headers["connection"] = "close"  # its body is not read
            await response(scope, receive, _with_headers(send, static=False))
            return
        static = request.url.path.startswith("/static/")
        upload = scope["method"] == "POST" and request.url.path == UPLOAD_PATH
        most = self.upload_limit() if upload else SMALL_BODY
        await self.app(scope, _counted(receive, most), _with_headers(send, static))

    def check_csrf(self, request: Request, form_value: str | None) -> bool:
        """A POST that may act: bearer-authenticated, or carrying the CSRF token."""
        if self.bearer(request.headers):
            return True
        given = form_value or request.headers.get("x-csrf-token", "")
        return hmac.compare_digest(given.encode(), self.csrf.encode())


def _counted(receive: Receive, most: int) -> Receive:
    """`receive`, raising BodyTooLarge once the body has gone past `most` bytes."""
    got = 0

    async def counted() -> Message:
        nonlocal got
        message = await receive()
        if message["type"] == "http.request":
            got += len(message.get("body", b""))
            if got > most:
                raise BodyTooLarge(most)
        return message
    return counted


def _with_headers(send: Send, static: bool) -> Send:
    async def wrapped(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = list(message.get("headers", []))
            own_policy = any(k.lower() == b"content-security-policy" for k, _ in headers)
            # a file shown inline brings its own, stricter policy (ocrd/web/serve.py)
            headers += [h for h in HEADERS if not (own_policy and h[0] == HEADERS[0][0])]
            if not static:
                headers.append((b"cache-control", b"no-store"))
            message["headers"] = headers
        await send(message)
    return wrapped
