"""What `ocrd status` asks a running daemon: its /readyz and a few /metrics values."""

from __future__ import annotations

import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def daemon_metrics(listen: str, timeout: float = 2.0) -> dict | None:
    """Numbers from a running daemon, or None if it does not answer."""
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
                key = "pages_" + sample.labels.get("result", "?")
                out[key] = out.get(key, 0) + int(sample.value)
            elif sample.name == "ocrd_files_total":
                key = "files_" + sample.labels.get("result", "?")
                out[key] = out.get(key, 0) + int(sample.value)
            elif sample.name == "ocrd_inbox_paused" and sample.value:
                out.setdefault("paused_inboxes", []).append(
                    {"inbox": sample.labels.get("inbox", "?"),
                     "why": sample.labels.get("why", "?")})
    return out
