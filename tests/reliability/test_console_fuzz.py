"""The console against random requests: thousands of random methods, paths, ids, query
strings, headers and bodies thrown at every route, signed in and signed out, sent over
raw sockets to a running daemon's console. Whatever comes, the console answers (a
redirect, 4xx, 200), never 500, and its log holds no traceback.

Seeded (the same requests each run); OCRD_FUZZ_REQUESTS sets how many (default 5,000),
OCRD_FUZZ_SEED another seed."""

from __future__ import annotations

import json
import os
import random
import select
import socket
import struct
import time
import urllib.parse
from pathlib import Path

import pytest
from helpers import Daemon, free_port, make_pdf, sentence_lines, wait_for

pytestmark = [pytest.mark.reliability, pytest.mark.e2e, pytest.mark.slow]

TOKEN = "fuzz-token-0123456789abcdef"
REQUESTS = int(os.environ.get("OCRD_FUZZ_REQUESTS") or 5000)
SEED = int(os.environ.get("OCRD_FUZZ_SEED") or 42)

GET_ROUTES = [
    "/", "/fragments/live", "/files", "/search", "/files/{id}", "/files/{id}/pages/{page}",
    "/failed", "/upload", "/api", "/login", "/healthz", "/favicon.ico",
    "/files/{id}/download/{kind}", "/files/{id}/open/{kind}", "/files/{id}/assets/{name}",
    "/files/{id}/pages/{page}.jpg", "/api/status", "/api/files", "/api/files/{id}",
    "/api/search", "/api/openapi.json", "/static/{name}",
]
POST_ROUTES = [
    "/files/{id}/retry", "/files/{id}/dismiss", "/failed/retry", "/upload", "/login",
    "/files/{id}/pages/{page}/turn",
    "/api/files/{id}/retry", "/api/files/{id}/dismiss", "/api/failed/retry",
]
METHODS = ["GET"] * 6 + ["POST"] * 6 + ["HEAD", "PUT", "DELETE", "OPTIONS", "PATCH",
                                         "TRACE", "FOO"]
HOSTILE = ["", "0", "-1", "1", "2", "99999999999999999999", str(2**63), str(2**63 - 1),
           str(2**64), "1" * 300, "1e9", "0x10", "NaN", "inf", "-0", " 1", "1_000",
           "%00", "%ff%fe", "%2e%2e", "..", "../../etc/passwd", "ü", "\u202efdp.exe",
           "\x1b[2J", "a" * 3000, '"', "'", "<script>alert(1)</script>", "*", '"x', "a*",
           "NEAR(a b)", "a OR b", "東京", "done", "failed", "waiting", "degraded", "queued",
           "engine_failed", "unsupported_format", "fit", "100", "thumb", "page", "1",
           "true", "yes", "/files", "//evil.example", "https://evil.example/", "\\\\x",
           "\u00b2", "90", "180", "9" * 4400]
NUMBERS = ["0", "-1", "1", "2", "50", "500", "501", "99999999999999999999", str(2**63),
           str(2**63 - 1), str(2**64), "-" + str(2**63 + 1), "1" * 300, "1e9", "0x10",
           "NaN", " 1", "1_000", "\u0661", "\u00b2", "9" * 4400, "", "x"]
QUERY_KEYS = ["state", "inbox", "q", "page", "limit", "offset", "reason", "size", "zoom",
              "cause_gone", "back", "csrf", "token", "rotation", "x"]
NUMBER_KEYS = ("page", "limit", "offset")


class Fuzzer:
    def __init__(self, port: int, seed: int, ids: dict[str, int], inbox: str,
                 csrf: str, session: str) -> None:
        self.port = port
        self.rnd = random.Random(seed)
        self.ids = ids
        self.inbox = inbox
        self.csrf = csrf
        self.session = session
        self.statuses: dict[int, int] = {}
        self.server_errors: list[str] = []
        self.no_answer: list[str] = []
        self.abandoned = 0

    def value(self, number: bool = False) -> str:
        r = self.rnd.random()
        if number and r < 0.6:
            return self.rnd.choice(NUMBERS)
        if r < 0.3:
            return str(self.rnd.choice(list(self.ids.values())))
        if r < 0.4:
            return self.inbox
        return self.rnd.choice(HOSTILE)

    def quoted(self, text: str) -> str:
        return urllib.parse.quote(text, safe="" if self.rnd.random() < 0.5 else "/%")

    def path(self, method: str) -> str:
        routes = POST_ROUTES if method == "POST" and self.rnd.random() < 0.8 else GET_ROUTES
        template = self.rnd.choice(routes)
        fill = {
            "id": self.value(number=True) if self.rnd.random() < 0.6 else
            str(self.rnd.choice(list(self.ids.values()))),
            "page": self.value(number=True),
            "kind": self.rnd.choice(["md", "json", "original", "pdf", "x", "", "%2e%2e"]),
            "name": self.rnd.choice(["p0001-1.png", "style.css", "console.js", "..%2f..",
                                     "a" * 300, "x.png%00", "%ff"]),
        }
        path = template.format(**{k: self.quoted(v) if k in ("id", "page") else v
                                  for k, v in fill.items()})
        if self.rnd.random() < 0.6:
            keys = [self.rnd.choice(QUERY_KEYS) for _ in range(self.rnd.randint(1, 4))]
            pairs = [(k, self.value(number=k in NUMBER_KEYS)) for k in keys]
            path += "?" + "&".join(f"{self.quoted(k)}={self.quoted(v)}" for k, v in pairs)
        if self.rnd.random() < 0.02:
            path += "\u00e9"  # a raw non-ASCII byte in the request line
        return path

    def body(self, headers: dict[str, str]) -> bytes:
        r = self.rnd.random()
        if r < 0.25:
            return b""
        if r < 0.45:
            fields = {self.rnd.choice(QUERY_KEYS + ["file"]): self.value()
                      for _ in range(self.rnd.randint(0, 4))}
            if self.rnd.random() < 0.5:
                fields["csrf"] = self.csrf
            headers["Content-Type"] = "application/x-www-form-urlencoded"
            return urllib.parse.urlencode(fields).encode()
        if r < 0.8:
            boundary = self.rnd.choice(["b0undary", "x" * 80, "", "a b"])
            parts = []
            if self.rnd.random() < 0.6:
                parts.append(("csrf", None, self.csrf.encode()))
            if self.rnd.random() < 0.7:
                parts.append(("inbox", None, self.value().encode("utf-8", "replace")))
            if self.rnd.random() < 0.8:
                name = self.rnd.choice(["scan.pdf", "../../x.pdf", "a\u202eb.pdf", "",
                                        ".hidden.pdf", "x" * 400 + ".pdf", "t.part",
                                        "\x00.pdf", "\u00e9t\u00e9.png"])
                data = self.rnd.choice([b"%PDF-1.4 fuzz", b"", os.urandom(300),
                                        b"\x89PNG\r\n\x1a\n" + os.urandom(50)])
                parts.append(("file", name, data))
            out = b""
            for field, filename, data in parts:
                disp = f'form-data; name="{field}"'
                if filename is not None:
                    disp += f'; filename="{filename}"'
                out += (f"--{boundary}\r\nContent-Disposition: {disp}\r\n\r\n"
                        .encode("utf-8", "replace") + data + b"\r\n")
            if self.rnd.random() < 0.8:
                out += f"--{boundary}--\r\n".encode()
            headers["Content-Type"] = self.rnd.choice([
                f"multipart/form-data; boundary={boundary}", "multipart/form-data",
                f'multipart/form-data; boundary="{boundary}"; charset=bogus'])
            return out
        headers["Content-Type"] = self.rnd.choice(["application/json", "text/plain",
                                                   "multipart/mixed", "\x7f"])
        return os.urandom(self.rnd.randint(1, 20_000))

    def headers(self, signed_in: bool) -> dict[str, str]:
        h = {"Host": f"127.0.0.1:{self.port}" if self.rnd.random() < 0.95 else
             self.rnd.choice(["evil.example", "", "127.0.0.1:1:2", "[::1"])}
        if signed_in:
            if self.rnd.random() < 0.5:
                h["Authorization"] = f"Bearer {TOKEN}"
            else:
                h["Cookie"] = f"ocrd_console={self.session}"
            if self.rnd.random() < 0.5:
                h["X-CSRF-Token"] = self.csrf
        else:
            r = self.rnd.random()
            if r < 0.2:
                h["Authorization"] = self.rnd.choice(["Bearer ", "Bearer x", "Basic Zm9v",
                                                      "Bearer " + "a" * 5000])
            elif r < 0.4:
                h["Cookie"] = self.rnd.choice(["ocrd_console=x", "ocrd_console=",
                                               "ocrd_flash=!!!", "a=" + "b" * 5000,
                                               'ocrd_flash="eyJ4Ijo="'])
        for name, choices in (("Range", ["bytes=0-1", "bytes=-5", "bytes=x"]),
                              ("Accept-Encoding", ["gzip", "br, *"]),
                              ("X-Forwarded-For", ["1.2.3.4"]),
                              ("Origin", ["https://evil.example", "null"])):
            if self.rnd.random() < 0.1:
                h[name] = self.rnd.choice(choices)
        return h

    def request(self, signed_in: bool) -> bytes:
        method = self.rnd.choice(METHODS)
        path = self.path(method)
        headers = self.headers(signed_in)
        body = self.body(headers) if method != "GET" or self.rnd.random() < 0.1 else b""
        framing = self.rnd.random()
        if framing < 0.08:  # chunked (and sometimes a length as well)
            headers["Transfer-Encoding"] = "chunked"
            if framing < 0.03:
                headers["Content-Length"] = str(len(body))
            body = (f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n") if body \
                else b"0\r\n\r\n"
        elif framing < 0.1 and body:  # a length shorter than the body
            headers["Content-Length"] = str(self.rnd.randint(0, len(body) - 1))
        elif body or method == "POST":
            headers["Content-Length"] = str(len(body))
        headers["Connection"] = "close"
        head = f"{method} {path} HTTP/1.1\r\n" + "".join(
            f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
        return head.encode("utf-8", "surrogateescape") + body

    def send(self, raw: bytes) -> int | None:
        """The answer's status (None: no answer within 15 s; 0: closed without one).
        The answer is read while the request is still being sent: a server that answers
        before it has read the whole body must not have its answer lost."""
        deadline = time.monotonic() + 15
        with socket.create_connection(("127.0.0.1", self.port), timeout=15) as s:
            s.setblocking(False)
            todo, got = memoryview(raw), b""
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                readable, writable, _ = select.select([s], [s] if todo else [], [], left)
                if readable:
                    try:
                        chunk = s.recv(65536)
                    except OSError:
                        break
                    if not chunk:
                        break
                    got += chunk
                elif writable:
                    try:
                        todo = todo[s.send(todo[:65536]):]
                    except OSError:
                        todo = todo[:0]  # the server closed its side: read what it said
        line = got.split(b"\r\n", 1)[0].split()
        return int(line[1]) if len(line) >= 2 and line[1].isdigit() else 0

    def abandon(self, raw: bytes) -> None:
        """Send the head and part of the body, then go (a tab closed mid-upload)."""
        head, _, body = raw.partition(b"\r\n\r\n")
        with socket.create_connection(("127.0.0.1", self.port), timeout=15) as s:
            s.sendall(head + b"\r\n\r\n" + body[:len(body) // 2])
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.abandoned += 1

    def run(self, n: int) -> None:
        for k in range(n):
            raw = self.request(signed_in=k % 2 == 0)
            if b"Content-Length: " in raw and b"\r\n\r\n" in raw and \
                    self.rnd.random() < 0.05:
                self.abandon(raw)
                continue
            status = self.send(raw)
            first = raw.split(b"\r\n", 1)[0].decode("utf-8", "replace")[:300]
            if status is None:
                self.no_answer.append(first)
                continue
            self.statuses[status] = self.statuses.get(status, 0) + 1
            if status >= 500:
                self.server_errors.append(f"{status} {first}")


def _session(port: int) -> str:
    """The cookie /login sets for the token."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("POST", "/login", urllib.parse.urlencode({"token": TOKEN}),
                     {"Host": f"127.0.0.1:{port}",
                      "Content-Type": "application/x-www-form-urlencoded"})
        resp = conn.getresponse()
        resp.read()
        cookie = resp.getheader("set-cookie") or ""
    finally:
        conn.close()
    name, _, value = cookie.split(";")[0].partition("=")
    assert resp.status == 303 and name == "ocrd_console", (resp.status, cookie)
    return value


def _bearer(port: int, path: str) -> dict:
    import urllib.request

    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}",
                                 headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def test_thousands_of_random_requests_get_no_500_and_log_no_traceback(
        tmp_path: Path) -> None:
    port = free_port()
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    token.chmod(0o600)
    with Daemon(tmp_path / "d", web={"listen": f"127.0.0.1:{port}",
                                     "token_file": str(token),
                                     "upload_max_bytes": 64 * 1024}) as d:
        d.start()
        make_pdf(d.inbox / ".report.pdf.part", [sentence_lines(1)])
        os.rename(d.inbox / ".report.pdf.part", d.inbox / "report.pdf")
        (d.inbox / "notes.pdf").write_bytes(b"not a document at all\n" * 20)
        wait_for(lambda: d.event("file_converted") and d.event("file_failed"), 120,
                 "one file converted, one failed")
        status = _bearer(port, "/api/status")
        files = _bearer(port, "/api/files")["files"]
        ids = {f["state"]: f["id"] for f in files}
        fuzzer = Fuzzer(port, SEED, ids, str(d.inbox), status["csrf"], _session(port))
        t0 = time.monotonic()
        fuzzer.run(REQUESTS)
        seconds = time.monotonic() - t0
        assert not d.died()
        log = d.log_text()
    tracebacks = log.count("Traceback")
    exceptions = sum(1 for line in log.splitlines() if '"exception"' in line)
    print(f"\nconsole fuzz: {REQUESTS} requests in {seconds:.0f} s, statuses "
          f"{dict(sorted(fuzzer.statuses.items()))}, 500s {len(fuzzer.server_errors)}, "
          f"no answer {len(fuzzer.no_answer)}, abandoned {fuzzer.abandoned}, "
          f"tracebacks {tracebacks}, "
          f"exception events {exceptions}")
    assert fuzzer.server_errors == [], fuzzer.server_errors[:20]
    assert fuzzer.no_answer == [], fuzzer.no_answer[:20]
    assert tracebacks == 0 and exceptions == 0, [
        line[:500] for line in log.splitlines() if "Traceback" in line or
        '"exception"' in line][:10]
