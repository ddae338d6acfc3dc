"""Page views as uint8 from vLLM's front end to its engine core (ocrd/vllm_model/dsocr2_pixels.py).

The processor registered with ocrd's model class must hand over the views vLLM's own
processor makes, as uint8, and `normalise` must turn them into vLLM's float views to the
bit (real page renders: text pages at 144 dpi, A4 portrait and landscape, and a small
page without tiles); vLLM's processor registry must give ocrd's class that processor
only when asked; and the real engine (CPU build, tiny model, bf16) must read pages the
same with uint8 views as with vLLM's.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fdlog import output_into  # tests/vllm_engine, on sys.path (conftest.py)
from needs import require_vllm
from PIL import Image

require_vllm()
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from helpers import sentence_lines, text_image  # noqa: E402
from test_vllm_engine import noise  # noqa: E402

from ocrd.config.settings import EngineConfig  # noqa: E402
from ocrd.engines.base import PageRequest  # noqa: E402
from ocrd.engines.vllm.inprocess import VllmEngine  # noqa: E402
from ocrd.vllm_model import dsocr2_pixels, plugin  # noqa: E402

pytestmark = pytest.mark.vllm


def page_renders() -> dict[str, Image.Image]:
    """Text pages as ocrd renders them for DeepSeek-OCR-2 (144 dpi), and a small one."""
    a4 = (1191, 1684)
    return {
        "a4": text_image(sentence_lines(1, 40), a4).convert("RGB"),
        "a4_landscape": text_image(sentence_lines(2, 20), a4[::-1]).convert("RGB"),
        "small": text_image(sentence_lines(3, 4), (700, 500)).convert("RGB"),
        "noise_letter": noise(4, 1224, 1584),
    }


@pytest.fixture(scope="module")
def processors(model_dir: Path) -> dict[str, Any]:
    """vLLM's processing info for ocrd's class, built through vLLM's own registry with
    OCRD_VLLM_PIXELS=float and =uint8 (the variable counts when vLLM builds it)."""
    from vllm.config import ModelConfig
    from vllm.multimodal import MULTIMODAL_REGISTRY

    plugin.use(True)
    model_config = ModelConfig(model=str(model_dir), dtype="bfloat16", max_model_len=2048)
    infos = {}
    mp = pytest.MonkeyPatch()
    for mode in ("float", "uint8"):
        mp.setenv(plugin.PIXELS_ENV, mode)
        infos[mode] = MULTIMODAL_REGISTRY.create_processor(model_config).info
    mp.undo()
    return infos


def run(info: Any, image: Image.Image) -> dict[str, Any]:
    """The processor as vLLM's front end calls it (with vLLM's cast to the model's dtype)."""
    hf = info.get_hf_processor()
    return dict(info.ctx.call_hf_processor(
        hf, {"prompt": "<image>\nFree OCR.", "images": [image]}, {}))


def test_ocrds_class_gets_the_uint8_processor_only_when_asked(
        processors: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    from ocrd.vllm_model import dsocr2_fast

    factories = dsocr2_fast.FastDeepseekOCR2ForCausalLM._processor_factory
    assert factories.info is dsocr2_pixels.Uint8ProcessingInfo
    vllms = processors["float"].get_hf_processor()
    assert not isinstance(vllms.image_transform, dsocr2_pixels.Uint8Views)
    twin = processors["uint8"].get_hf_processor()
    assert isinstance(twin.image_transform, dsocr2_pixels.Uint8Views)
    monkeypatch.setenv(plugin.PIXELS_ENV, "float")  # later changes do not count
    assert twin is processors["uint8"].get_hf_processor()  # one twin per cached processor
    assert not isinstance(vllms.image_transform, dsocr2_pixels.Uint8Views)  # untouched
    assert twin.tokenizer is vllms.tokenizer
    # vLLM's own class keeps vLLM's processing info
    from vllm.model_executor.models.deepseek_ocr2 import DeepseekOCR2ForCausalLM

    assert DeepseekOCR2ForCausalLM._processor_factory.info is not factories.info


@pytest.mark.parametrize("name", list(page_renders()))
def test_uint8_views_normalise_to_vllms_views_to_the_bit(
        processors: dict[str, Any], name: str) -> None:
    image = page_renders()[name]
    want = run(processors["float"], image)
    got = run(processors["uint8"], image)
    assert set(got) == set(want)
    for key in ("pixel_values", "images_crop"):
        assert want[key].dtype == torch.bfloat16  # vLLM's cast to the model's dtype
        assert got[key].dtype == torch.uint8, key  # left alone by that cast
        assert got[key].shape == want[key].shape
        assert torch.equal(dsocr2_pixels.normalise(got[key], torch.bfloat16), want[key]), key
    for key in set(want) - {"pixel_values", "images_crop"}:
        assert torch.equal(torch.as_tensor(got[key]), torch.as_tensor(want[key])), key
    tiles = int(want["images_spatial_crop"].prod()) if name != "small" else 0
    assert got["images_crop"].shape[0] == tiles
    # half the bytes cross to the engine core
    sent = sum(got[k].numel() * got[k].element_size() for k in ("pixel_values", "images_crop"))
    before = sum(want[k].numel() * want[k].element_size()
                 for k in ("pixel_values", "images_crop"))
    assert sent * 2 == before


def test_a_step_with_tiled_and_untiled_pages_stays_uint8(processors: dict[str, Any]) -> None:
    """A page without tiles has empty crops; they are uint8 too, so that the crops of an
    engine step (vLLM concatenates them) are not promoted to float."""
    renders = page_renders()
    tiled, small = run(processors["uint8"], renders["a4"]), run(processors["uint8"],
                                                                  renders["small"])
    assert small["images_crop"].shape[0] == 0 and small["images_crop"].dtype == torch.uint8
    step = torch.cat([small["images_crop"], tiled["images_crop"]])
    assert step.dtype == torch.uint8


def test_float_views_pass_normalise_unchanged() -> None:
    x = torch.randn(2, 3, 8, 8, dtype=torch.bfloat16)
    assert dsocr2_pixels.normalise(x, torch.bfloat16) is x
    u = torch.tensor([0, 1, 127, 128, 254, 255], dtype=torch.uint8)
    assert dsocr2_pixels.normalise(u, torch.float32).tolist() == pytest.approx(
        [(v / 255 - 0.5) / 0.5 for v in u.tolist()], abs=1e-7)


def test_environment_for_the_engines_ocrd_starts() -> None:
    env = plugin.environment
    assert env(True)[plugin.PIXELS_ENV] == "uint8"  # the default
    assert env(True, None, False)[plugin.PIXELS_ENV] == "float"
    assert env(False)[plugin.PIXELS_ENV] == "float"  # vLLM's own class: its own views
    from ocrd.config.engine import VllmConfig

    assert VllmConfig().uint8_pixels is True


# ---- the real engine ---------------------------------------------------------------------

def read(cfg: EngineConfig, loop_thread: Any, log: Path, images: list[Image.Image]) -> list[str]:
    """Start an in-process engine, read the images one after another (each alone in its
    steps), close it; the engine core's output (a process vLLM spawns) goes into `log`."""
    eng = VllmEngine(cfg)
    texts = []
    with output_into(log):
        try:
            loop_thread.run(eng.start())
            for n, image in enumerate(images, 1):
                page = PageRequest(image=image, page_no=n, doc_id="u8")
                texts.append(loop_thread.run(eng.ocr(page)).text)
        finally:
            loop_thread.run(eng.close())
    return texts


def test_the_engine_reads_the_same_with_uint8_views(
        tiny_config: Callable[..., EngineConfig], loop_thread: Any, vllm_env: dict[str, str],
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_CONFIGURE_LOGGING", "1")  # the engine core's INFO lines
    images = [page_renders()[k] for k in ("a4", "small", "a4_landscape")]
    texts = {}
    for uint8 in (True, False):
        cfg = tiny_config(max_tokens=24, loop_retries=0)
        cfg = cfg.model_copy(update={"vllm": cfg.vllm.model_copy(
            update={"uint8_pixels": uint8})})
        log = tmp_path / f"engine_{uint8}.log"
        texts[uint8] = read(cfg, loop_thread, log, images)
        arrived = dsocr2_pixels.ARRIVED_MARK in log.read_text(errors="replace")
        assert arrived is uint8, log.read_text(errors="replace")[-3000:]
    assert all(texts[True]), texts
    assert texts[True] == texts[False]
    assert len(set(texts[True])) == len(images)  # the pages were read, not ignored


def test_a_vllm_without_the_processors_names_keeps_its_float_views(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Another vLLM's DeepSeek-OCR-2 code laid out otherwise: ocrd's class is still
    built (with vLLM's processor) instead of failing to import."""
    class Model:
        pass

    monkeypatch.setattr(dsocr2_pixels, "MISSING", "cannot import name 'X'")
    assert dsocr2_pixels.register(Model) is Model
    assert "_processor_factory" not in Model.__dict__
    monkeypatch.setattr(dsocr2_pixels, "MISSING", None)
    assert dsocr2_pixels.register(Model) is Model
    assert Model.__dict__["_processor_factory"].info is dsocr2_pixels.Uint8ProcessingInfo
