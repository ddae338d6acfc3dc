"""The doors for another engine and another model: `engine.kind` names an engine from
the table or by class path (`package.module:Class`, its settings in `engine.options`
checked by its Options model); `engine.recipe` names how a model on `vllm serve` is
asked — DeepSeek-OCR-2's recipe, or `page-markdown` for a model that answers a page image
with its Markdown (olmOCR's format, served here by a fake `vllm serve` that answers as
that model does: a YAML front matter, then the page). Keys that moved into their own
section are still read from their old place, with a note."""

from __future__ import annotations

import asyncio
import base64
import io
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from fake_vllm import FakeVllm, FakeVllmThread, engine_section, page
from helpers import Daemon, drop, make_pdf, sentence_lines, wait_for
from PIL import Image
from simulated_engines import SIMULATED, SimulatedEngine

from ocrd import cli
from ocrd.config.engine import EngineConfig
from ocrd.config.load import parse_config
from ocrd.config.settings import ConfigError
from ocrd.engines import create_engine, preflight
from ocrd.engines.page_markdown import PageMarkdown, front_matter
from ocrd.engines.remote import RemoteEngine

# ---- the engine table and class paths -----------------------------------------------


def test_an_engine_named_by_class_path_is_made_with_its_checked_options() -> None:
    cfg = EngineConfig.model_validate({"kind": SIMULATED, "options": {"max_batch": 3}})
    engine = create_engine(cfg)
    assert isinstance(engine, SimulatedEngine) and engine.cfg.max_batch == 3
    assert preflight(cfg) == []
    bad = EngineConfig.model_validate({"kind": SIMULATED, "options": {"max_bach": 3}})
    assert preflight(bad) == ["engine.options.max_bach: Extra inputs are not permitted"]


@pytest.mark.parametrize(("kind", "problem"), [
    ("nosuchmodule:Engine", "engine.kind = 'nosuchmodule:Engine': cannot import "
                            "'nosuchmodule'"),
    ("simulated_engines:Nothing", "engine.kind = 'simulated_engines:Nothing': "
                                  "'simulated_engines' has no 'Nothing'"),
    ("simulated_engines:SimulatedStats", "is not an ocrd engine (a subclass of "
                                         "ocrd.engines.base.Engine)"),
])
def test_a_class_path_that_is_not_an_engine_is_a_clear_problem(kind: str,
                                                               problem: str) -> None:
    problems = preflight(EngineConfig(kind=kind))
    assert len(problems) == 1 and problem in problems[0], problems
    with pytest.raises(ConfigError, match="engine.kind"):
        create_engine(EngineConfig(kind=kind))


def test_a_misspelt_engine_or_recipe_is_named_with_the_choices(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as e:
        parse_config({"state_dir": "s", "engine": {"kind": "teseract"}}, tmp_path)
    assert e.value.problems == [
        "engine.kind = 'teseract': not an engine: one of auto, tesseract, remote, vllm, or "
        "an engine's class path `package.module:Class`; did you mean 'tesseract'?"]
    with pytest.raises(ConfigError, match=r"engine.recipe = 'olmocr': not a recipe: one of "
                       r"deepseek-ocr-2, page-markdown"):
        parse_config({"state_dir": "s", "engine": {"recipe": "olmocr"}}, tmp_path)
    with pytest.raises(ConfigError, match="the vllm engine runs DeepSeek-OCR-2"):
        parse_config({"state_dir": "s", "engine": {"kind": "vllm",
                                                   "recipe": "page-markdown"}}, tmp_path)
    with pytest.raises(ConfigError, match="options are for an engine given by class path"):
        parse_config({"state_dir": "s", "engine": {"kind": "tesseract",
                                                   "options": {"x": 1}}}, tmp_path)


def test_a_recipe_of_ones_own_by_class_path() -> None:
    """The recipe door: a class path to a Recipe subclass of the user's is what the
    remote engine asks with."""
    cfg = EngineConfig.model_validate(engine_section("http://127.0.0.1:9/v1"))
    own = cfg.model_copy(update={"recipe": "ocrd.engines.page_markdown:PageMarkdown"})
    assert isinstance(RemoteEngine(own).recipe, PageMarkdown)
    with pytest.raises(ConfigError, match="is not a recipe"):
        RemoteEngine(cfg.model_copy(update={"recipe": "simulated_engines:SimulatedEngine"}))


# ---- keys in their old places ----------------------------------------------------------


OLD_REMOTE = {"kind": "remote", "urls": ["http://127.0.0.1:9/v1"], "queue_per_url": 0,
              "api_key": "k", "ngram": {"ngram_size": 20}}


def test_keys_in_their_old_place_still_work_and_check_config_says_where_they_live(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = parse_config({"state_dir": "s", "engine": OLD_REMOTE}, tmp_path).engine
    assert cfg.remote.urls == ["http://127.0.0.1:9/v1"] and cfg.remote.queue_per_url == 0
    assert cfg.remote.api_key == "k" and cfg.deepseek_ocr2.ngram.ngram_size == 20
    path = tmp_path / "c.yaml"
    for folder in ("out", "failed"):  # ocrd creates no missing destination
        (tmp_path / folder).mkdir()
    path.write_text(yaml.safe_dump({"state_dir": "s", "engine": OLD_REMOTE, "inboxes": [
        {"path": str(tmp_path), "outbox": str(tmp_path / "out"),
         "failed": str(tmp_path / "failed")}]}))
    assert cli.main(["check-config", "-c", str(path)]) == 0
    err = capsys.readouterr().err.splitlines()
    assert "ocrd: note: engine.urls is now engine.remote.urls; the old place is still " \
        "read, but move it: `remote:` with `urls:` under it" in err
    assert sum("ocrd: note: engine." in line for line in err) == 4  # one per moved key
    # a key given in both places is not guessed at: the old one is an unknown key
    with pytest.raises(ConfigError, match="engine.urls: unknown key"):
        parse_config({"state_dir": "s", "engine": {
            "urls": ["http://a/v1"], "remote": {"urls": ["http://b/v1"]}}}, tmp_path)


@pytest.mark.e2e
def test_the_daemon_logs_each_key_read_from_its_old_place(tmp_path: Path) -> None:
    with FakeVllmThread(FakeVllm(latency=0.01)) as server:
        engine = {"kind": "remote", "urls": [server.server.url]}
        with Daemon(tmp_path / "d", engine=engine) as d:
            d.start()
            moved = d.events("config_key_moved")
    assert [e["note"].split(" is now ")[0] for e in moved] == ["engine.urls"]


# ---- the second recipe: a page image -> Markdown model ----------------------------------


def _image_of(payload: dict[str, Any]) -> Image.Image:
    parts = payload["messages"][-1]["content"]
    url = next(p["image_url"]["url"] for p in parts if p.get("type") == "image_url")
    return Image.open(io.BytesIO(base64.b64decode(url.partition(",")[2])))


def olmocr_like(payload: dict[str, Any]) -> tuple[str, str]:
    """What an olmOCR-style model answers: a front matter (the page is upright when it is
    taller than wide; else it says the clockwise turn that would right it), then the
    page's Markdown; below temperature 0.3 it loops, as a model stuck on a phrase does."""
    image = _image_of(payload)
    upright = image.height >= image.width
    if payload.get("temperature", 0) < 0.3 and image.getpixel((0, 0)) == (1, 2, 3):
        return "| a |\n" * 500, "length"
    head = (f"---\nprimary_language: en\nis_rotation_valid: {upright}\n"
            f"rotation_correction: {0 if upright else 90}\nis_table: False\n"
            "is_diagram: False\n---\n")
    return head + (f"# Page {image.width}x{image.height}\n\nSome text of the page.\n\n"
                   "<table><tr><td>a</td><td>b</td></tr></table>"), "stop"


def page_markdown_engine(url: str, **fields: Any) -> RemoteEngine:
    return RemoteEngine(EngineConfig.model_validate(
        engine_section(url, recipe="page-markdown", **fields)))


def test_the_page_markdown_recipe_reads_the_models_answer_and_asks_in_its_way() -> None:
    async def run() -> tuple[Any, list[dict]]:
        server = await FakeVllm(latency=0.0, text=olmocr_like).start()
        engine = page_markdown_engine(server.url)
        await engine.start()
        try:
            return await engine.ocr(page(1, (200, 300))), server.requests
        finally:
            await engine.close()
            await server.stop()

    out, requests = asyncio.run(run())
    assert out.text.startswith("# Page 200x300\n\nSome text of the page.")
    assert "---" not in out.text and "primary_language" not in out.text
    assert out.rotation is None and out.extra["language"] == "en"
    (req,) = requests
    content = req["messages"][0]["content"]
    assert [p["type"] for p in content] == ["image_url", "text"]  # the page, then the ask
    assert "Markdown" in content[1]["text"] and "rotation_correction" in content[1]["text"]
    assert req["temperature"] == 0.0 and "vllm_xargs" not in req  # no DeepSeek n-gram ban
    assert req["model"] and req["max_tokens"] == 8192


def test_a_page_the_model_says_lies_turned_is_asked_again_turned() -> None:
    async def run() -> tuple[Any, list[dict]]:
        server = await FakeVllm(latency=0.0, text=olmocr_like).start()
        engine = page_markdown_engine(server.url)
        await engine.start()
        try:
            return await engine.ocr(page(1, (300, 200))), server.requests
        finally:
            await engine.close()
            await server.stop()

    out, requests = asyncio.run(run())
    assert [_image_of(r).size for r in requests] == [(300, 200), (200, 300)]
    assert out.rotation == 90 and out.text.startswith("# Page 200x300")
    assert "model_says_turned" not in out.extra  # the second read: upright


def test_a_looping_page_is_asked_again_warmer_and_the_best_text_kept() -> None:
    async def run() -> tuple[Any, list[dict]]:
        server = await FakeVllm(latency=0.0, text=olmocr_like).start()
        engine = page_markdown_engine(server.url, loop_retries=2)
        await engine.start()
        image = Image.new("RGB", (200, 300), "white")
        image.putpixel((0, 0), (1, 2, 3))  # the page this fake model loops on when cold
        try:
            from ocrd.engines.base import PageRequest

            return (await engine.ocr(PageRequest(image=image, page_no=1, doc_id="d")),
                    server.requests)
        finally:
            await engine.close()
            await server.stop()

    out, requests = asyncio.run(run())
    assert [r["temperature"] for r in requests] == [0.0, 0.2, 0.4]
    assert out.attempts == 3 and out.degraded is None and out.text.startswith("# Page")


def test_front_matter_is_read_line_by_line_and_never_evaluated() -> None:
    assert front_matter("---\nis_rotation_valid: False\nrotation_correction: 270\n---\nText") \
        == ({"is_rotation_valid": "False", "rotation_correction": "270"}, "Text")
    # not a front matter: no closing line, or text before it
    assert front_matter("---\nno end") == ({}, "---\nno end")
    assert front_matter("Intro\n---\na: b\n---\n")[0] == {}
    # YAML tags and anchors are words here, nothing more
    fields, rest = front_matter("---\nx: !!python/object:os.system ['id']\n---\nok")
    assert fields == {"x": "!!python/object:os.system ['id']"} and rest == "ok"
    recipe = PageMarkdown(EngineConfig())
    read = recipe.read("---\nis_rotation_valid: False\nrotation_correction: 45\n---\nT")
    assert read.turn is None and read.text == "T"  # 45 is no turn a page can take
    assert recipe.read("```markdown\n# Title\n\nText\n```").text == "# Title\n\nText"


@pytest.mark.e2e
def test_a_page_markdown_model_through_the_daemon(tmp_path: Path) -> None:
    """The second recipe end to end: the daemon with `engine.recipe: page-markdown`
    against a fake server answering in olmOCR's format: the Markdown holds the page's
    text and table, not the front matter; the sidecar names the recipe and records the
    turn of the page the model said lay turned."""
    src = make_pdf(tmp_path / "upright.pdf", [sentence_lines(1, 3)])
    with FakeVllmThread(FakeVllm(latency=0.01, text=olmocr_like)) as server:
        engine = engine_section(server.server.url, recipe="page-markdown")
        with Daemon(tmp_path / "d", engine=engine) as d:
            d.start()
            drop(src, d.inbox / "upright.pdf")
            md = d.outbox / "upright.md"
            wait_for(md.exists, 120, "upright.md")
            sidecar = yaml.safe_load((d.outbox / "upright.json").read_text())
    text = md.read_text()
    assert "Some text of the page." in text and "primary_language" not in text
    assert "<table><tr><td>a</td><td>b</td></tr></table>" in text  # kept: inert HTML
    assert sidecar["engine"]["recipe"] == "page-markdown"


@pytest.mark.e2e
def test_ocrd_convert_takes_an_engine_by_class_path(tmp_path: Path) -> None:
    """`ocrd convert --engine package.module:Class`: the door from the command line."""
    pdf = make_pdf(tmp_path / "a.pdf", [sentence_lines(1, 2)])
    r = subprocess.run([sys.executable, "-m", "ocrd", "convert", str(pdf), "-o",
                        str(tmp_path / "out"), "--engine", SIMULATED, "-q"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "page 1" in (tmp_path / "out" / "a.md").read_text()
