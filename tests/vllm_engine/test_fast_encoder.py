"""ocrd's fast DeepSeek-OCR-2 encoder (ocrd/vllm_model/dsocr2_fast.py) against vLLM's own code.

The batched path must give the embeddings vLLM's per-page loop gives, with vLLM's own
modules (tiny instances, CPU, float32); the vectorised mask must be the mask vLLM 0.24
builds position by position (its loop is copied below as the reference); the plugin must
register the class only when ocrd asks for it.
"""

from __future__ import annotations

import copy
from functools import partial
from typing import Any

import pytest
from needs import require_vllm  # tests/vllm_engine, on sys.path (conftest.py)

require_vllm()
import torch  # noqa: E402

from ocrd.vllm_model import dsocr2_fast, plugin, switches  # noqa: E402

pytestmark = pytest.mark.vllm


def mask_vllm_024(sequence_length: int, dtype: Any, device: Any, batch_size: int,
                  token_type_ids: Any) -> Any:
    """vLLM 0.24.0's CustomQwen2ModelInner._create_custom_4d_mask, verbatim but for `self`."""
    min_dtype = torch.finfo(dtype).min
    masks = []
    for b in range(batch_size):
        mask = torch.full((sequence_length, sequence_length), fill_value=min_dtype,
                          dtype=dtype, device=device)
        type_ids = token_type_ids[b]
        image_positions = (type_ids == 0).nonzero(as_tuple=True)[0]
        text_positions = (type_ids == 1).nonzero(as_tuple=True)[0]
        if len(image_positions) > 0:
            mask[image_positions[:, None], image_positions] = 0.0
        for i, text_pos in enumerate(text_positions):
            if len(image_positions) > 0:
                mask[text_pos, image_positions] = 0.0
            mask[text_pos, text_positions[: i + 1]] = 0.0
        masks.append(mask)
    return torch.stack(masks, dim=0).unsqueeze(1)


class OldInner:
    """Stands for vLLM 0.24's encoder inner model: the per-position mask method only."""

    def _create_custom_4d_mask(self, sequence_length: int, dtype: Any, device: Any,
                               batch_size: int, token_type_ids: Any) -> Any:
        self.slow_calls = getattr(self, "slow_calls", 0) + 1
        return mask_vllm_024(sequence_length, dtype, device, batch_size, token_type_ids)


def old_encoder() -> Any:
    inner = OldInner()
    return type("Encoder", (), {"model": type("Decoder", (), {"model": inner})()})(), inner


def token_types(batch: int, n: int) -> Any:
    return torch.cat([torch.zeros(batch, n, dtype=torch.long),
                      torch.ones(batch, n, dtype=torch.long)], dim=1)


@pytest.mark.parametrize("n", [144, 256, 5])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_vectorised_mask_is_vllm_024s_mask(n: int, dtype: str) -> None:
    dt = getattr(torch, dtype)
    encoder, inner = old_encoder()
    assert dsocr2_fast.patch_mask(encoder)
    for batch in (1, 3):
        ids = token_types(batch, n)
        want = mask_vllm_024(2 * n, dt, "cpu", batch, ids)
        got = inner._create_custom_4d_mask(2 * n, dt, torch.device("cpu"), batch, ids)
        assert got.shape == want.shape == (batch, 1, 2 * n, 2 * n)
        assert got.dtype == dt
        assert torch.equal(got, want)
    assert getattr(inner, "slow_calls", 0) == 0  # the fixed pattern never took the loop


def test_other_patterns_and_the_switch_use_the_original_mask() -> None:
    encoder, inner = old_encoder()
    assert dsocr2_fast.patch_mask(encoder)
    assert not dsocr2_fast.patch_mask(encoder)  # once only
    odd = torch.tensor([[0, 1, 0, 1, 1, 0]])
    got = inner._create_custom_4d_mask(6, torch.float32, torch.device("cpu"), 1, odd)
    assert inner.slow_calls == 1
    assert torch.equal(got, mask_vllm_024(6, torch.float32, "cpu", 1, odd))
    inner._ocrd_fast = False  # what FastDeepseekOCR2ForCausalLM.ocrd_set_fast(False) does
    inner._create_custom_4d_mask(8, torch.float32, torch.device("cpu"), 1, token_types(1, 4))
    assert inner.slow_calls == 2


def test_encoders_with_the_mask_built_by_tensor_ops_are_left_alone() -> None:
    class NewInner(OldInner):
        compute_mask_base = staticmethod(lambda *a: None)

    encoder = type("E", (), {"model": type("D", (), {"model": NewInner()})()})()
    assert not dsocr2_fast.patch_mask(encoder)


# ---- batched encoding against vLLM's per-page loop ---------------------------------------

@pytest.fixture(scope="module")
def tiny_model() -> Any:
    """vLLM's own encoder classes, tiny (as tests/vllm_engine/plugin builds them), in a
    FastDeepseekOCR2ForCausalLM shell (the language model is not needed here)."""
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.models.deepencoder import ImageEncoderViT
    from vllm.model_executor.models.deepencoder2 import build_qwen2_decoder_as_encoder

    torch.manual_seed(0)
    with set_current_vllm_config(VllmConfig()):
        model = object.__new__(dsocr2_fast.FastDeepseekOCR2ForCausalLM)
        torch.nn.Module.__init__(model)
        model.sam_model = ImageEncoderViT(
            depth=2, embed_dim=64, img_size=1024, mlp_ratio=4,
            norm_layer=partial(torch.nn.LayerNorm, eps=1e-6), num_heads=2, patch_size=16,
            qkv_bias=True, use_rel_pos=True, global_attn_indexes=(1,), window_size=14,
            out_chans=256, last_conv_output=64)
        model.qwen2_model = build_qwen2_decoder_as_encoder(
            decoder_layer=1, hidden_dimension=64, num_attention_heads=2,
            num_key_value_heads=1, intermediate_size=128)
    model.projector = torch.nn.Linear(64, 32)
    model.view_seperator = torch.nn.Parameter(torch.randn(32))
    with torch.no_grad():  # vLLM allocates its weights uninitialised: give them values
        for p in model.parameters():
            if p.dim() > 1:
                p.copy_(torch.randn_like(p) * (1.0 / max(1, p[0].numel())) ** 0.5)
            else:  # norms and biases
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
    model.ocrd_fast = True
    model.ocrd_batched = False
    model.ocrd_padded = False
    model.ocrd_bucketed = False
    model.ocrd_chunks = (dsocr2_fast.GLOBAL_VIEWS_PER_CALL, dsocr2_fast.TILES_PER_CALL)
    model.ocrd_mask_patched = False
    return model.eval()


def pages(grids: list[tuple[int, int]]) -> tuple[Any, Any, Any]:
    g = torch.Generator().manual_seed(7)
    n_tiles = sum(w * h for w, h in grids if w > 1 or h > 1)
    pixel_values = torch.randn(len(grids), 3, 1024, 1024, generator=g)
    crops = torch.randn(n_tiles, 3, 768, 768, generator=g)  # [0, ...] when none is tiled
    return pixel_values, crops, torch.tensor(grids)


@pytest.mark.parametrize(("batched", "padded", "bucketed"),
                         [(False, False, False), (True, False, False), (True, True, False),
                          (True, True, True)],
                         ids=["page", "batched", "batched_padded", "batched_bucketed"])
@pytest.mark.parametrize("grids", [[(2, 3), (1, 1), (1, 2)], [(1, 1)], [(3, 2)]])
def test_fast_embeddings_are_vllms(tiny_model: Any, grids: list[tuple[int, int]],
                                   batched: bool, padded: bool, bucketed: bool,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm.model_executor.models.deepseek_ocr2 import DeepseekOCR2ForCausalLM

    monkeypatch.setattr(tiny_model, "ocrd_chunks", (2, 4))  # chunking runs too
    monkeypatch.setattr(tiny_model, "ocrd_batched", batched)
    monkeypatch.setattr(tiny_model, "ocrd_padded", padded)
    monkeypatch.setattr(tiny_model, "ocrd_bucketed", bucketed)
    pixel_values, crops, spatial = pages(grids)
    with torch.no_grad():
        want = DeepseekOCR2ForCausalLM._pixel_values_to_embedding(
            tiny_model, pixel_values=pixel_values, images_crop=crops,
            images_spatial_crop=spatial)
        got = tiny_model._pixel_values_to_embedding(pixel_values, crops, spatial)
        tiny_model.ocrd_set_fast(False)
        again = tiny_model._pixel_values_to_embedding(pixel_values, crops, spatial)
        tiny_model.ocrd_set_fast(True)
    assert len(got) == len(want) == len(grids)
    for g, w, a, (cols, rows) in zip(got, want, again, grids, strict=True):
        tiles = cols * rows if cols > 1 or rows > 1 else 0
        assert g.shape == w.shape == (tiles * 144 + 256 + 1, 32)
        if batched:  # other shapes, other rounding
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
        else:  # vLLM's shapes: the same numbers
            assert torch.equal(g, w)
        assert torch.equal(a, w)  # switched off: vLLM's own path
    assert not torch.allclose(got[0][:128], got[0][128:256])  # tokens are not all alike


def uint8_pages(grids: list[tuple[int, int]]) -> tuple[Any, Any, Any, Any, Any]:
    """Random uint8 views, and what vLLM's own ImageTransform (ToTensor + Normalize)
    makes of the same pixels as PIL images: the float views its processor sends."""
    from PIL import Image
    from vllm.transformers_utils.processors.deepseek_ocr import ImageTransform

    g = torch.Generator().manual_seed(11)
    n_tiles = sum(w * h for w, h in grids if w > 1 or h > 1)
    pv = torch.randint(0, 256, (len(grids), 3, 1024, 1024), generator=g, dtype=torch.uint8)
    crops = torch.randint(0, 256, (n_tiles, 3, 768, 768), generator=g, dtype=torch.uint8)
    vllm_transform = ImageTransform()

    def as_vllm(views: Any) -> Any:
        if not len(views):
            return torch.zeros((0, *views.shape[1:]))
        return torch.stack([vllm_transform(Image.fromarray(v.permute(1, 2, 0).numpy()))
                            for v in views])

    return pv, crops, as_vllm(pv), as_vllm(crops), torch.tensor(grids)


@pytest.mark.parametrize(("batched", "padded"), [(False, False), (True, True)],
                         ids=["page", "batched_padded"])
@pytest.mark.parametrize("grids", [[(2, 3), (1, 1), (1, 2)], [(1, 1)]])
def test_uint8_views_give_the_embeddings_of_vllms_float_views(
        tiny_model: Any, grids: list[tuple[int, int]], batched: bool, padded: bool,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """OCRD_VLLM_PIXELS=uint8: the model normalises uint8 views itself, into the very
    values of vLLM's processor (float32 here, the tiny model's dtype), so the embeddings
    are those of vLLM's own code on vLLM's float views, to the bit."""
    from vllm.model_executor.models.deepseek_ocr2 import DeepseekOCR2ForCausalLM

    monkeypatch.setattr(tiny_model, "ocrd_chunks", (2, 4))
    monkeypatch.setattr(tiny_model, "ocrd_batched", batched)
    monkeypatch.setattr(tiny_model, "ocrd_padded", padded)
    pv8, crops8, pv, crops, spatial = uint8_pages(grids)
    with torch.no_grad():
        want = DeepseekOCR2ForCausalLM._pixel_values_to_embedding(
            tiny_model, pixel_values=pv, images_crop=crops, images_spatial_crop=spatial)
        got = tiny_model._pixel_values_to_embedding(pv8, crops8, spatial)
        tiny_model.ocrd_set_fast(False)  # vLLM's path behind ocrd's class: normalised too
        again = tiny_model._pixel_values_to_embedding(pv8, crops8, spatial)
        tiny_model.ocrd_set_fast(True)
    assert len(got) == len(want) == len(again) == len(grids)
    for g, w, a in zip(got, want, again, strict=True):
        assert g.shape == w.shape
        if batched:
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
        else:
            assert torch.equal(g, w)
        assert torch.equal(a, w)


@pytest.mark.parametrize("padded", [False, True], ids=["page", "batched_padded"])
def test_a_page_ignores_the_other_pages_of_the_step(tiny_model: Any, padded: bool,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A page's embeddings are the same alone and among others (batch invariance): page
    by page, and batched in calls padded to the full size (OCRD_VLLM_ENCODER_BUCKETS=0).
    In bf16, as served: batched without padding fails this on a 2-core x86 machine (max
    difference 0.03; other shapes, other rounding)."""
    model = copy.deepcopy(tiny_model).to(torch.bfloat16)
    model.ocrd_chunks = (2, 4)
    model.ocrd_batched = model.ocrd_padded = padded
    model.ocrd_bucketed = False
    pixel_values, crops, spatial = pages([(1, 2), (2, 3), (1, 1)])
    pixel_values, crops = pixel_values.bfloat16(), crops.bfloat16()
    with torch.no_grad():
        together = model._pixel_values_to_embedding(pixel_values, crops, spatial)
        alone = model._pixel_values_to_embedding(pixel_values[1:2], crops[2:8], spatial[1:2])
    assert torch.equal(alone[0], together[1])


def test_vectorised_mask_is_upstreams_cached_mask(tiny_model: Any) -> None:
    """vLLM after 0.24 builds the same mask itself (compute_mask_base); this vLLM does."""
    upstream = type(tiny_model.qwen2_model.model.model).compute_mask_base
    for n in (144, 256):
        for dt in (torch.bfloat16, torch.float32):
            assert torch.equal(dsocr2_fast.encoder_mask(2 * n, dt, torch.device("cpu")),
                               upstream(2 * n, dt, torch.device("cpu")))


# ---- the plugin ------------------------------------------------------------------------

def test_plugin_registers_only_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm import ModelRegistry

    def registered() -> str:
        entry = ModelRegistry.models[plugin.ARCHITECTURE]
        return f"{getattr(entry, 'module_name', '')}:{getattr(entry, 'class_name', '')}"

    before = registered()
    try:
        monkeypatch.delenv(plugin.ENV, raising=False)
        plugin.use(False)
        plugin.register()
        assert registered() == plugin.VLLM_CLASS
        for setting in ("0", "off"):
            monkeypatch.setenv(plugin.ENV, setting)
            plugin.register()
            assert registered() == plugin.VLLM_CLASS
        for setting in ("1", "batched", "auto"):
            plugin.use(False)
            monkeypatch.setenv(plugin.ENV, setting)
            plugin.register()
            assert registered() == plugin.MODEL_CLASS, setting
    finally:
        if before.partition(":")[0]:
            ModelRegistry.register_model(plugin.ARCHITECTURE, before)


def test_encoder_mode_settings() -> None:
    """engine.vllm.fast_encoder / batch_encoder → the variable → the model's mode."""
    def env(*args: bool | None) -> str:
        return plugin.environment(*args)[plugin.ENV]

    assert env(False, True) == env(False) == "0"
    assert env(True, None) == "auto"  # the default
    assert env(True, True) == "batched"
    assert env(True, False) == "1"
    assert dsocr2_fast.batched_mode("batched") is True
    assert dsocr2_fast.batched_mode("1") is False
    # auto: batched on a GPU; page by page (vLLM's shapes) on the CPU this vLLM runs on
    assert dsocr2_fast.batched_mode("auto") is False
    from ocrd.config.engine import VllmConfig

    assert VllmConfig().batch_encoder is None and VllmConfig().fast_encoder is True


def test_padded_calls_take_the_smallest_size_that_holds_them(
        tiny_model: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Bucketed: full calls, then the rest in the smallest of the full size's halves that
    holds it; without buckets every call has the full size. The shapes SAM sees, for
    2 global views and 4 tiles per call."""
    calls: list[tuple[int, int]] = []
    real = dsocr2_fast._encode

    def encode(model: Any, views: torch.Tensor) -> torch.Tensor:
        calls.append((views.shape[0], views.shape[-1]))
        return real(model, views)

    monkeypatch.setattr(dsocr2_fast, "_encode", encode)
    assert dsocr2_fast.call_sizes(8) == (8, 4, 2, 1)
    assert dsocr2_fast.call_sizes(24) == (24, 12, 6, 3)
    assert dsocr2_fast.call_sizes(24, bucketed=False) == (24,)
    assert dsocr2_fast.call_sizes(5) == (5,)
    for bucketed, grids, want in [
            (True, [(1, 2)], [(1, 1024), (2, 768)]),
            (True, [(1, 1)], [(1, 1024)]),
            (True, [(1, 3), (1, 1), (1, 1)], [(2, 1024), (1, 1024), (4, 768)]),
            (True, [(2, 3)], [(1, 1024), (4, 768), (2, 768)]),
            (True, [(1, 3)], [(1, 1024), (4, 768)]),  # 3 tiles: not a size, the next one
            (False, [(1, 2)], [(2, 1024), (4, 768)]),
            (False, [(2, 3)], [(2, 1024), (4, 768), (4, 768)])]:
        pixel_values, crops, spatial = pages(grids)
        calls.clear()
        with torch.no_grad():
            out = dsocr2_fast.page_embeddings(tiny_model, pixel_values, crops, spatial,
                                              batched=True, padded=True, chunks=(2, 4),
                                              bucketed=bucketed)
        assert calls == want, (bucketed, grids)
        assert [o.shape[0] for o in out] == [
            (w * h if w > 1 or h > 1 else 0) * 144 + 257 for w, h in grids]


def test_encoder_graphs_capture_every_call_size_of_a_view_kind_at_once(
        tiny_model: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """EncoderGraphs' bookkeeping, with the CUDA capture replaced by a stand-in that
    records and replays the encoder call the way a graph does (on its own input and
    output buffers): the first call of a kind of view captures all its sizes, largest
    first, on one shared input buffer; later calls of any size capture nothing; each
    call gives what the plain encoder gives; a size whose capture fails runs op by op."""
    captured: list[list[int]] = []

    class Replay:
        def __init__(self, model: Any, static_in: torch.Tensor) -> None:
            self.model, self.static_in = model, static_in
            self.static_out = dsocr2_fast._encode(model, static_in)

        def replay(self) -> None:
            self.static_out.copy_(dsocr2_fast._encode(self.model, self.static_in))

    def capture(self: Any, model: Any, static_in: torch.Tensor) -> tuple:
        captured.append(list(static_in.shape))
        if static_in.shape[0] == 2 and static_in.shape[-1] == 768:
            raise RuntimeError("operation not permitted when stream is capturing")
        graph = Replay(model, static_in)
        return graph, static_in, graph.static_out

    monkeypatch.setattr(dsocr2_fast.EncoderGraphs, "_capture", capture)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    graphs = dsocr2_fast.EncoderGraphs()
    model = copy.deepcopy(tiny_model)
    model.ocrd_chunks = (2, 4)
    model.ocrd_batched = model.ocrd_padded = model.ocrd_bucketed = True
    model.ocrd_graphs = graphs
    with torch.no_grad():
        for grids in ([(1, 2)], [(2, 3), (1, 1), (1, 2)], [(1, 1)], [(1, 3)]):
            pixel_values, crops, spatial = pages(grids)
            got = model._pixel_values_to_embedding(pixel_values, crops, spatial)
            model.ocrd_graphs = None
            want = model._pixel_values_to_embedding(pixel_values, crops, spatial)
            model.ocrd_graphs = graphs
            for g, w in zip(got, want, strict=True):
                assert torch.equal(g, w), grids
    assert captured == [[2, 3, 1024, 1024], [1, 3, 1024, 1024],
                        [4, 3, 768, 768], [2, 3, 768, 768], [1, 3, 768, 768]]
    entries = {k[0]: v for k, v in graphs.graphs.items()}
    assert entries[(2, 3, 768, 768)] is False  # failed: runs op by op
    big, small = entries[(4, 3, 768, 768)][1], entries[(1, 3, 768, 768)][1]
    assert small.data_ptr() == big.data_ptr()  # one input buffer per kind of view


def test_encoder_chunks_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(switches.CHUNKS_ENV, raising=False)
    assert dsocr2_fast.chunks_from_env() == (8, 24)
    monkeypatch.setenv(switches.CHUNKS_ENV, "4x12")
    assert dsocr2_fast.chunks_from_env() == (4, 12)
    for bad in ("0x12", "4", "ax3", "-1x4"):
        monkeypatch.setenv(switches.CHUNKS_ENV, bad)
        assert dsocr2_fast.chunks_from_env() == (8, 24), bad
    monkeypatch.delenv(switches.BUCKETS_ENV, raising=False)
    assert dsocr2_fast.buckets_wanted()
    monkeypatch.setenv(switches.BUCKETS_ENV, "0")
    assert not dsocr2_fast.buckets_wanted()


def test_plugin_stays_out_of_a_vllm_without_the_model(monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm import ModelRegistry

    assert plugin.has_model_code()  # this vLLM has it
    before = ModelRegistry.models[plugin.ARCHITECTURE]
    monkeypatch.setenv(plugin.ENV, "1")
    monkeypatch.setattr(plugin, "has_model_code", lambda: False)
    plugin.register()
    assert ModelRegistry.models[plugin.ARCHITECTURE] is before


def test_a_model_unlike_vllms_keeps_vllms_path(tiny_model: Any) -> None:
    assert dsocr2_fast.unsupported(tiny_model) is None
    shell = object.__new__(dsocr2_fast.FastDeepseekOCR2ForCausalLM)
    torch.nn.Module.__init__(shell)
    for name in ("sam_model", "qwen2_model", "projector"):
        setattr(shell, name, getattr(tiny_model, name))
    assert dsocr2_fast.unsupported(shell) == "the model has no view_seperator"
    shell.ocrd_mask_patched = False
    assert shell.ocrd_set_fast(True) is False  # cannot be switched on


def test_plugin_is_installed_with_ocrd() -> None:
    """scripts/test installs ocrd with pip: vLLM finds the entry point."""
    assert plugin.installed()
