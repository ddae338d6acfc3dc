"""The daemon end to end on the real vLLM engine (CPU build, tiny DeepSeek-OCR-2): in
process (`engine.kind: vllm`) and through a real `vllm serve` (`engine.kind: remote`),
including a server outage that files wait out."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import Daemon, drop, files_under, make_pdf, sentence_lines, wait_for
from serve import SERVED_NAME, VllmServer

from ocrd.config.settings import EngineConfig

pytestmark = [pytest.mark.vllm, pytest.mark.e2e]


def probe(url: str) -> int | None:
    """HTTP status of url, None while nothing listens."""
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


def daemon_engine(cfg: EngineConfig) -> dict:
    return cfg.model_dump(mode="json")


def test_three_page_pdf_through_the_vllm_engine(
        tmp_path: Path, tiny_config: Callable[..., EngineConfig],
        vllm_env: dict[str, str]) -> None:
    engine = daemon_engine(tiny_config(max_tokens=24, loop_retries=0))
    src = tmp_path / "src"
    src.mkdir()
    three = make_pdf(src / "three.pdf", [sentence_lines(i, 3) for i in range(3)])
    other = make_pdf(src / "other.pdf", [sentence_lines(9 + i, 3) for i in range(2)])
    with Daemon(tmp_path / "d", engine=engine, env=vllm_env,
                schedule={"pages_in_flight": 4}) as d:
        d.start(wait_ready=False)
        readyz = f"http://127.0.0.1:{d.port}/readyz"
        seen = wait_for(lambda: probe(readyz), 120, "the metrics server to answer", every=0.05)
        assert seen == 503, "ready before the engine loaded"  # the engine is still loading
        wait_for(lambda: d.event("ready"), 240, "ready")
        assert probe(readyz) == 200
        assert d.event("engine_started")["seconds"] > 1  # it really was loading
        drop(three, d.inbox / "three.pdf")
        drop(other, d.inbox / "other.pdf")
        wait_for((d.outbox / "three.md").exists, 240, "three.md")
        wait_for((d.outbox / "other.md").exists, 240, "other.md")
    md = (d.outbox / "three.md").read_text()
    assert [md.count(f"<!-- page {n}") for n in (1, 2, 3)] == [1, 1, 1]
    assert md.index("<!-- page 1") < md.index("<!-- page 2") < md.index("<!-- page 3")
    meta = json.loads((d.outbox / "three.json").read_text())
    assert meta["engine"]["kind"] == "vllm"
    assert meta["engine"]["model"] == engine["model"]
    assert meta["page_count"] == 3 and len(meta["pages"]) == 3
    for page in meta["pages"]:
        assert page["finish_reason"] in ("stop", "length", "repetition")
        assert isinstance(page["tokens"], int) and 0 <= page["tokens"] <= 24
        assert page["prompt_tokens"] > 1000  # an A4 page is tiled: ~1.1k image tokens
        # a page cut at max_tokens is kept and flagged, never dropped
        assert (page["status"] == "degraded") == (page["finish_reason"] != "stop")
    # pages of the two files were in the engine at the same time
    other_meta = json.loads((d.outbox / "other.json").read_text())
    spans_a = [(p["started_at"], p["finished_at"]) for p in meta["pages"]]
    spans_b = [(p["started_at"], p["finished_at"]) for p in other_meta["pages"]]
    overlap = [(a, b) for a in spans_a for b in spans_b if a[0] < b[1] and b[0] < a[1]]
    assert overlap, (spans_a, spans_b)


def test_remote_engine_daemon_waits_out_a_server_outage(
        tmp_path: Path, server: VllmServer, vllm_env: dict[str, str]) -> None:
    engine = {"kind": "remote", "remote": {"urls": [server.url], "concurrency_per_url": 4},
              "model": SERVED_NAME, "max_tokens": 16, "loop_retries": 0}
    src = tmp_path / "src"
    src.mkdir()
    first = make_pdf(src / "first.pdf", [sentence_lines(20, 3)] * 2)
    later = make_pdf(src / "later.pdf", [sentence_lines(21, 3)])
    with Daemon(tmp_path / "d", engine=engine, env=vllm_env) as d:
        d.start(timeout=120)
        drop(first, d.inbox / "first.pdf")
        wait_for((d.outbox / "first.md").exists, 180, "first.md through vllm serve")
        meta = json.loads((d.outbox / "first.json").read_text())
        assert meta["engine"]["kind"] == "remote" and meta["page_count"] == 2
        server.stop()  # the GPU machine goes away
        drop(later, d.inbox / "later.pdf")
        wait_for(lambda: d.event("engine_unavailable"), 120, "engine_unavailable")
        assert not (d.outbox / "later.md").exists()
        assert files_under(d.failed) == []  # waiting, not failing
        server.start()
        server.wait_ready()
        wait_for((d.outbox / "later.md").exists, 240, "later.md after the server returned")
        assert d.event("engine_available")
    assert files_under(d.failed) == []
    later_meta = json.loads((d.outbox / "later.json").read_text())
    assert later_meta["pages"][0]["finish_reason"] in ("stop", "length")
