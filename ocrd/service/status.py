"""What `ocrd status` asks a running daemon: its /readyz and a few /metrics values, and
its console's /api/status for the files by name (waiting, converting)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from ocrd.config.settings import ConfigError, WebConfig
from ocrd.web.auth import load_token


def daemon_metrics(listen: str, timeout: float = 2.0) -> dict | None:
    """Numbers from a running daemon, or None if it does not answer. Its counters are
    since it started, and named so (`files_failed_since_start` counts every failure of
    this run, also of a file retried since; the journal's `failed` counts the files in
    the failed folders now)."""
    host, _, port = listen.rpartition(":")
    if host in ("", "0.0.0.0", "::", "[::]"):
        host = "127.0.0.1"
    base = f"http://{host}:{port}"
    try:
        with urllib.request.urlopen(base + "/metrics", timeout=timeout) as resp:
            text = resp.read().decode()
    except (OSError, urllib.error.URLError):
        return None
    try:
        with urllib.request.urlopen(base + "/readyz", timeout=timeout) as resp:
            ready = resp.status == 200
    except urllib.error.HTTPError:
        ready = False
    except (OSError, urllib.error.URLError):
        return None
    out: dict = {"ready": ready}
    names = {"ocrd_queue_depth": "queue", "ocrd_active_files": "active",
             "ocrd_pages_in_flight": "in_flight", "ocrd_candidates": "waiting_in_inbox"}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            # every one of these counts files or pages: whole numbers
            if sample.name in names:
                out[names[sample.name]] = int(sample.value)
            elif sample.name == "ocrd_pages_total":
                key = f"pages_{sample.labels.get('result', '?')}_since_start"
                out[key] = out.get(key, 0) + int(sample.value)
            elif sample.name == "ocrd_files_total":
                key = f"files_{sample.labels.get('result', '?')}_since_start"
                out[key] = out.get(key, 0) + int(sample.value)
            elif sample.name == "ocrd_inbox_unread_files" and sample.value:
                out.setdefault("unread_in_subfolders", []).append(
                    {"inbox": sample.labels.get("inbox", "?"), "files": int(sample.value)})
            elif sample.name == "ocrd_inbox_paused" and sample.value:
                out.setdefault("paused_inboxes", []).append(
                    {"inbox": sample.labels.get("inbox", "?"),
                     "why": sample.labels.get("why", "?")})
    return out


def console_status(web: WebConfig, timeout: float = 2.0) -> dict | None:
    """The console's /api/status of a running daemon (None: no console, or no answer)."""
    if web.listen is None:
        return None
    host, _, port = web.listen.rpartition(":")
    if host in ("", "0.0.0.0", "::", "[::]"):
        host = "127.0.0.1"
    headers = {"Host": f"{host}:{port}"}
    try:
        token = load_token(web)
    except ConfigError:
        token = None
    if token:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(f"http://{host}:{port}/api/status", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return json.loads(resp.read())
    except (OSError, urllib.error.URLError, ValueError):
        return None


def file_lines(status: dict) -> list[str]:
    """The files by name: converting (page k of n), then waiting (why, until when)."""
    lines = []
    for f in status.get("converting") or []:
        eta = f" (about {f['eta_seconds']:.0f} s left)" if f.get("eta_seconds") else ""
        lines.append(f"  converting  {f['name']}  page {f['pages_done']} of "
                     f"{f['pages']}{eta}")
    for w in status.get("waiting") or []:
        until = ""
        if w.get("until") and not w.get("fails_then"):
            until = f" (until {time.strftime('%H:%M:%S', time.localtime(w['until']))})"
        lines.append(f"  waiting     {w['name']}  {w['why']}{until}  [{w['inbox']}]")
    for p in status.get("problems") or []:
        lines.append(f"  PROBLEM     {p['text']}")
    return lines
