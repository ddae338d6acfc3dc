"""/metrics, /healthz and /readyz of a running daemon, read the way an operator would."""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path

import pytest
from helpers import Daemon, drop, make_pdf, sentence_lines, wait_for
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.e2e


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def values(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            key = s.name + ("{" + ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
                            + "}" if s.labels else "")
            out[key] = s.value
    return out


def test_metrics_move_during_a_conversion(tmp_path: Path) -> None:
    pdf = make_pdf(tmp_path / "long.pdf", [sentence_lines(i, 6) for i in range(12)])
    with Daemon(tmp_path / "d") as d:
        d.start()
        base = f"http://127.0.0.1:{d.port}"
        assert get(base + "/readyz")[0] == 200 and get(base + "/healthz")[0] == 200
        first = values(get(base + "/metrics")[1])
        assert first["ocrd_engine_ready"] == 1
        drop(pdf, d.inbox / "long.pdf")
        samples = []

        def sample() -> bool:
            samples.append(values(get(base + "/metrics")[1]))
            return (d.outbox / "long.md").exists()

        wait_for(sample, 120, "long.md", every=0.2)
        # the file is counted once its original is archived too, a moment after long.md
        wait_for(lambda: sample() and samples[-1].get("ocrd_files_total{result=ok}") == 1,
                 30, "the file counted", every=0.2)
        status = get(base + "/nope")[0]
    pages = [s.get("ocrd_pages_total{result=ok}", 0) for s in samples]
    assert pages[-1] == 12
    assert len(set(pages)) >= 3, pages  # seen moving, not jumping from 0 to 12
    assert max(s["ocrd_pages_in_flight"] for s in samples) >= 1
    assert samples[-1]["ocrd_files_total{result=ok}"] == 1
    assert samples[-1]["ocrd_claims_total"] == 1
    assert samples[-1]["ocrd_rescans_total"] >= 1
    assert samples[-1]["ocrd_last_success_timestamp_seconds"] > 0
    assert samples[-1]["ocrd_file_duration_seconds_count"] == 1
    assert samples[-1]["ocrd_page_duration_seconds_count"] == 12
    assert samples[-1]["process_resident_memory_bytes"] > 10e6
    assert not [k for k in samples[-1] if k.split("{")[0].endswith("_created")]
    assert "ocrd_build_info{engine=tesseract,model=tesseract:eng,version=0.1.0}" in samples[-1]
    assert status == 404
