"""DeepSeek-OCR-2 with a faster vision encoder, imported by vLLM when it builds the model.

vLLM's `DeepseekOCR2ForCausalLM` encodes the images of an engine step one page at a
time: SAM on the 1024 px global view (batch 1), a host sync (`.item()`) to see whether
there are tiles, SAM on the tiles, then the 24-layer Qwen2 "decoder as encoder" for each.
In vLLM ≤ 0.24 that encoder also builds its attention mask position by position: two
GPU index writes per query position (256 + 6 × 144 per A4 page), each from CPU indices.
On a big GPU that engine-side work capped the whole engine at a fraction of the pages
per second the same GPU decodes.

`FastDeepseekOCR2ForCausalLM` keeps vLLM's modules and weights and changes only how they
are called:
- where vLLM's encoder still has the per-position mask (no `compute_mask_base`, added
  upstream after 0.24), the mask is built once per sequence length with tensor ops —
  the same mask (tests/vllm_engine/test_fast_encoder.py checks it against 0.24's loop);
- one host sync per step (the pages' tile grids) instead of one or two per page;
- mode "page" (the default) then encodes page by page with the very shapes vLLM uses
  (global view alone, the page's tiles together): the same embeddings to the bit, and a
  page's embeddings never depend on which other pages share its engine step;
- mode "batched" puts the global views of every page in the step through SAM → Qwen2 →
  projector together, and all their tiles too, in padded calls of a few fixed sizes
  (`call_sizes`: 8, 4, 2 or 1 global views, 24, 12, 6 or 3 tiles — full calls, and the
  rest in the smallest size that holds it, filled up with blank views; the largest
  size also bounds the memory of SAM's attention): fewer, larger GPU calls, the same
  embeddings up to the rounding of the kernels of the larger shapes. The sizes are
  what makes a lone page cheap where pages trickle in (a served engine: one or two new
  pages per step), 1 global view and 6 tiles instead of 8 and 24.
  With `OCRD_VLLM_ENCODER_BUCKETS=0` every call has the full size: then a page's
  embeddings do not depend on the step's other pages, to the bit (with several sizes
  the kernels, and their rounding, may follow the size of the page's call — as vLLM's
  own decoder steps follow the batch size).

Two more changes, on a GPU only (measured faster on an H200):
- SAM's attention layers run ocrd's fused kernel (ocrd/vllm_model/relpos_attention.py):
  the relative-position bias is added inside a flash-attention kernel instead of being
  written out as a heads × tokens² tensor;
- in batched mode every padded call size is captured once as a CUDA graph
  (`EncoderGraphs`) and replayed: one launch instead of thousands, so the engine core's
  thread is free for the step's other work while the GPU encodes.
`OCRD_VLLM_FUSED_SAM=0` / `OCRD_VLLM_ENCODER_GRAPHS=0` turn them off (the graphs also
stay off where vLLM runs with `enforce_eager`).

ocrd registers the class for the architecture through its vLLM plugin
(`ocrd.vllm_model.plugin`) when `engine.vllm.fast_encoder` is on; the mode comes from
`engine.vllm.batch_encoder` through the same environment variable (default: batched on
a GPU, page by page on a CPU, where vLLM's own shapes cost no more and give its very
embeddings).
"""

from __future__ import annotations

import functools
import inspect
import os
from types import MethodType
from typing import Any

import torch
from vllm.logger import init_logger
from vllm.model_executor.models.deepseek_ocr2 import DeepseekOCR2ForCausalLM

from ocrd.vllm_model import dsocr2_pixels, relpos_attention
from ocrd.vllm_model.dsocr2_pixels import normalise
from ocrd.vllm_model.plugin import AUTO, BATCHED, ENV, LOADED_MARK
from ocrd.vllm_model.switches import BUCKETS_ENV, CHUNKS_ENV, FUSED_SAM_ENV, GRAPHS_ENV

# under "vllm.": vLLM's logging setup (handlers, level) covers it in every process
logger = init_logger("vllm.ocrd.dsocr2_fast")

# Views per SAM call. SAM's global-attention layers materialise a relative-position
# bias of heads × tokens² per view: ~0.4 GB for a 1024 px view (4096 tokens), ~0.13 GB
# for a 768 px tile (2304 tokens), in bf16. These chunks keep one call under ~3.5 GB,
# inside the memory vLLM leaves outside its KV cache (1 - gpu_memory_utilization).
# In mode "batched" every call is padded to this many views or to one of its halves
# (`call_sizes`). The benchmark switch CHUNKS_ENV overrides them (switches.py).
GLOBAL_VIEWS_PER_CALL = 8
TILES_PER_CALL = 24


def chunks_from_env() -> tuple[int, int]:
    value = os.environ.get(CHUNKS_ENV, "")
    try:
        g, t = (int(x) for x in value.lower().split("x"))
        if g > 0 and t > 0:
            return g, t
    except ValueError:
        pass
    return GLOBAL_VIEWS_PER_CALL, TILES_PER_CALL


def buckets_wanted() -> bool:
    return os.environ.get(BUCKETS_ENV) != "0"


def call_sizes(per_call: int, bucketed: bool = True) -> tuple[int, ...]:
    """The sizes a padded call may have, largest first: `per_call` and its halves while
    they divide evenly (8 → 8, 4, 2, 1; 24 → 24, 12, 6, 3), or `per_call` alone."""
    sizes = [per_call]
    while bucketed and sizes[-1] % 2 == 0:
        sizes.append(sizes[-1] // 2)
    return tuple(sizes)


@functools.lru_cache(maxsize=16)
def encoder_mask(sequence_length: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The Qwen2 encoder's additive mask for [n image tokens, n query tokens]: image
    tokens see every image token; query tokens see every image token and, causally,
    the query tokens up to themselves. Shape [1, 1, S, S]."""
    n = sequence_length // 2
    pos = torch.arange(sequence_length, device=device)
    image = pos < n
    query = ~image
    causal = pos[:, None] >= pos[None, :]
    allow = image[None, :] | (query[:, None] & query[None, :] & causal)
    blocked = torch.finfo(dtype).min
    return torch.where(allow, torch.zeros((), dtype=dtype, device=device),
                       torch.full((), blocked, dtype=dtype, device=device))[None, None]


def _fixed_pattern(token_type_ids: Any, sequence_length: int) -> bool:
    """True when every row is [0] * n + [1] * n, the only pattern vLLM's encoder makes."""
    if not isinstance(token_type_ids, torch.Tensor) or token_type_ids.dim() != 2:
        return False
    n = sequence_length // 2
    if token_type_ids.shape[1] != sequence_length or sequence_length != 2 * n:
        return False
    ids = token_type_ids if token_type_ids.device.type == "cpu" else token_type_ids.cpu()
    return bool((ids[:, :n] == 0).all() and (ids[:, n:] == 1).all())


def _vectorised_mask(self: Any, sequence_length: int, dtype: torch.dtype,
                     device: torch.device, batch_size: int, token_type_ids: Any) -> torch.Tensor:
    """Drop-in for vLLM ≤ 0.24's `_create_custom_4d_mask` (same signature, same mask)."""
    if not self._ocrd_fast or not _fixed_pattern(token_type_ids, sequence_length):
        return self._ocrd_slow_mask(sequence_length=sequence_length, dtype=dtype,
                                    device=device, batch_size=batch_size,
                                    token_type_ids=token_type_ids)
    return encoder_mask(sequence_length, dtype, torch.device(device)).expand(
        batch_size, 1, sequence_length, sequence_length)


def patch_mask(qwen2_encoder: Any) -> bool:  # a Qwen2Decoder2Encoder
    """Give an old (per-position mask) Qwen2 encoder the vectorised mask. Returns whether
    it was patched; encoders that already build it with tensor ops are left alone."""
    inner = getattr(getattr(qwen2_encoder, "model", None), "model", None)
    if inner is None or not hasattr(inner, "_create_custom_4d_mask"):
        return False
    if hasattr(type(inner), "compute_mask_base") or hasattr(inner, "_ocrd_slow_mask"):
        return False
    inner._ocrd_slow_mask = inner._create_custom_4d_mask
    inner._ocrd_fast = True
    inner._create_custom_4d_mask = MethodType(_vectorised_mask, inner)
    return True


def _encode(model: Any, views: torch.Tensor) -> torch.Tensor:
    return model.projector(model.qwen2_model(model.sam_model(views)))


class EncoderGraphs:
    """CUDA graphs of the encoder (SAM → Qwen2 → projector), one per padded call shape.

    A padded call has one of a few shapes, so its thousands of kernel launches (most of them
    small: the Qwen2 layers over 4,096 tokens) can be recorded once and replayed as one
    launch: the engine core's thread no longer spends the call launching kernels (and
    waiting for a full launch queue). The first call of a kind of view (1024 px global
    views, 768 px tiles) captures every call size of that kind, largest first — in
    vLLM's memory-profiling run at start, where their memory is counted — each after two
    warm-up runs that also compile the Triton kernels. The sizes of a kind share one
    input buffer (a size's input is its first rows) and one memory pool; the output is
    copied out of the graph's buffer."""

    def __init__(self) -> None:
        # (shape, dtype, device) → (graph, input, output), or False: run op by op
        self.graphs: dict[tuple, Any] = {}
        self.pool: Any = None

    @staticmethod
    def key(views: torch.Tensor) -> tuple:
        return (tuple(views.shape), views.dtype, views.device)

    def __call__(self, model: Any, views: torch.Tensor,
                 sizes: tuple[int, ...] = ()) -> torch.Tensor:
        """Encode `views` (a padded call) by its graph; `sizes`: the other call sizes
        of this kind of view, captured along with it on first use."""
        key = self.key(views)
        if key not in self.graphs:
            self._capture_sizes(model, views, sizes)
        entry = self.graphs[key]
        if entry is False:  # capture failed for this shape: plain calls
            return _encode(model, views)
        graph, static_in, static_out = entry
        static_in.copy_(views)
        graph.replay()
        return static_out.clone()

    def _capture_sizes(self, model: Any, views: torch.Tensor, sizes: tuple[int, ...]) -> None:
        counts = sorted({views.shape[0], *sizes}, reverse=True)
        buffer = views.new_zeros((counts[0], *views.shape[1:]))
        for n in counts:
            static_in = buffer[:n]
            key = self.key(static_in)
            if key in self.graphs:
                continue
            try:
                self.graphs[key] = self._capture(model, static_in)
                logger.info("ocrd encoder: CUDA graph captured for calls of shape %s",
                            list(static_in.shape))
            except RuntimeError as e:  # an op that cannot be captured: run it eagerly
                logger.warning("ocrd encoder: no CUDA graph for calls of shape %s (%s); "
                               "running them op by op", list(static_in.shape), e)
                torch.cuda.synchronize(views.device)
                self.graphs[key] = False

    def _capture(self, model: Any, static_in: torch.Tensor) -> tuple[Any, torch.Tensor,
                                                                       torch.Tensor]:
        side = torch.cuda.Stream(device=static_in.device)
        side.wait_stream(torch.cuda.current_stream(static_in.device))
        with torch.cuda.stream(side):
            for _ in range(2):
                _encode(model, static_in)
        torch.cuda.current_stream(static_in.device).wait_stream(side)
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            static_out = _encode(model, static_in)
        return graph, static_in, static_out


def _encode_views(model: Any, views: torch.Tensor, per_call: int,
                  padded: bool = False, bucketed: bool = False) -> torch.Tensor:
    """SAM → Qwen2 encoder → projector over views [N, 3, s, s]: [N, tokens, dim], in
    calls of up to `per_call` views. `padded`: every call gets exactly one of the sizes
    of `call_sizes(per_call, bucketed)` (the smallest that holds its views; the rest
    blank views), so the kernels, and with them each view's rounding, follow only that
    size (and, where the model has `ocrd_graphs`, the call replays a CUDA graph)."""
    graphs = getattr(model, "ocrd_graphs", None) if padded else None
    sizes = call_sizes(per_call, bucketed)
    parts = []
    for i in range(0, views.shape[0], per_call):
        # uint8 views (OCRD_VLLM_PIXELS=uint8) become the model's floats call by call
        chunk = normalise(views[i:i + per_call], model.view_seperator.dtype)
        n = chunk.shape[0]
        size = min(s for s in sizes if s >= n) if padded else n
        if size > n:
            chunk = torch.cat([chunk, chunk.new_zeros((size - n, *chunk.shape[1:]))])
        parts.append((graphs(model, chunk, sizes) if graphs else _encode(model, chunk))[:n])
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def page_embeddings(model: Any, pixel_values: torch.Tensor, images_crop: torch.Tensor,
                    images_spatial_crop: torch.Tensor, batched: bool,
                    padded: bool = False,
                    chunks: tuple[int, int] = (GLOBAL_VIEWS_PER_CALL, TILES_PER_CALL),
                    bucketed: bool = False) -> list[torch.Tensor]:
    """What vLLM's `_pixel_values_to_embedding` returns (per page: its tiles' tokens, its
    global view's tokens, the view separator): page by page with vLLM's own shapes, or
    with the step's pages batched together."""
    grids = images_spatial_crop.tolist()  # the step's only host sync
    tiles = [w * h if (w > 1 or h > 1) else 0 for w, h in grids]
    pages = len(grids)
    starts = [sum(tiles[:page]) for page in range(pages)]
    if batched:
        global_tokens = _encode_views(model, pixel_values[:pages], chunks[0], padded,
                                      bucketed)
        total_tiles = sum(tiles)
        local_tokens = (_encode_views(model, images_crop[:total_tiles], chunks[1], padded,
                                      bucketed) if total_tiles else None)
    separator = model.view_seperator[None, :]
    out: list[torch.Tensor] = []
    for page in range(pages):
        first, n = starts[page], tiles[page]
        if batched:
            g = global_tokens[page]
            local = local_tokens[first:first + n] if n else None
        else:  # vLLM's shapes: the global view alone, then the page's tiles together
            g = _encode_views(model, pixel_values[page:page + 1], 1)[0]
            local = _encode_views(model, images_crop[first:first + n], n) if n else None
        if local is not None:
            out.append(torch.cat([local.reshape(-1, local.shape[-1]), g, separator], dim=0))
        else:
            out.append(torch.cat([g, separator], dim=0))
    return out


def fused_sam_wanted() -> tuple[bool, str]:
    """Whether to give SAM the fused attention kernel, and why (for the log line)."""
    setting = os.environ.get(FUSED_SAM_ENV, "")
    if setting == "0":
        return False, f"{FUSED_SAM_ENV}=0"
    if not relpos_attention.available():
        return False, "Triton is not installed"
    if setting == "1":
        return True, f"{FUSED_SAM_ENV}=1"
    from vllm.platforms import current_platform

    if not current_platform.is_cuda_alike():
        return False, "not on a GPU"
    return True, "on a GPU"


def graphs_wanted(vllm_config: Any) -> bool:
    """CUDA graphs for the padded encoder calls: on a CUDA GPU, unless turned off with
    OCRD_VLLM_ENCODER_GRAPHS=0 or by vLLM's own `enforce_eager` (no graphs at all)."""
    if os.environ.get(GRAPHS_ENV) == "0":
        return False
    model_config = getattr(vllm_config, "model_config", None)
    if getattr(model_config, "enforce_eager", False):
        return False
    return torch.cuda.is_available()


def batched_mode(setting: str | None) -> bool:
    """The plugin's setting → batched or page by page ("auto": batched on a GPU)."""
    if setting == AUTO:
        from vllm.platforms import current_platform

        return current_platform.is_cuda_alike()
    return setting == BATCHED


def unsupported(model: Any) -> str | None:
    """Why the batched path cannot stand in for this model's own, or None. It relies on
    the modules vLLM 0.16-0.32 build and on the per-page method it replaces."""
    for name in ("sam_model", "qwen2_model", "projector", "view_seperator"):
        if not hasattr(model, name):
            return f"the model has no {name}"
    method = getattr(DeepseekOCR2ForCausalLM, "_pixel_values_to_embedding", None)
    if method is None:
        return "vLLM's model has no _pixel_values_to_embedding"
    params = list(inspect.signature(method).parameters)
    if params != ["self", "pixel_values", "images_crop", "images_spatial_crop"]:
        return f"_pixel_values_to_embedding takes {params[1:]}"
    return None


@dsocr2_pixels.register
class FastDeepseekOCR2ForCausalLM(DeepseekOCR2ForCausalLM):
    """vLLM's DeepSeek-OCR-2 with ocrd's encoder paths (see the module's text), and its
    processor handing the page views over as uint8 where OCRD_VLLM_PIXELS=uint8
    (ocrd/vllm_model/dsocr2_pixels.py).
    `ocrd_set_fast(False)` switches back to vLLM's own code path and `ocrd_batched` picks
    the mode (the GPU benchmark compares them inside one engine)."""

    def __init__(self, *, vllm_config: Any, prefix: str = "") -> None:
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        why_not = unsupported(self)
        self.ocrd_chunks = chunks_from_env()  # (global views, tiles) per call
        # batched mode in production is always padded: the kernels follow a few call
        # sizes, not the number of pages in the step (unpadded: the benchmark's control)
        self.ocrd_batched = self.ocrd_padded = batched_mode(os.environ.get(ENV))
        self.ocrd_bucketed = buckets_wanted()
        self.ocrd_fast = why_not is None
        self.ocrd_mask_patched = self.ocrd_fast and patch_mask(self.qwen2_model)
        fused, reason = fused_sam_wanted()
        self.ocrd_fused_layers = (relpos_attention.patch_sam(self.sam_model)
                                  if fused and self.ocrd_fast else 0)
        self.ocrd_graphs = (EncoderGraphs() if self.ocrd_padded and self.ocrd_fast
                            and graphs_wanted(vllm_config) else None)
        if why_not:
            logger.warning("ocrd's fast DeepSeek-OCR-2 encoder is off: %s (this vLLM's "
                           "model differs from the one it was written for); vLLM's own "
                           "encoder path is used", why_not)
            return
        sizes = ["/".join(map(str, call_sizes(n, self.ocrd_bucketed)))
                 for n in self.ocrd_chunks]
        logger.info("%s: %s; vectorised mask %s; SAM attention %s%s", LOADED_MARK,
                    f"pages batched, {sizes[0]} global views and {sizes[1]} tiles per "
                    "call" if self.ocrd_batched else "page by page",
                    "patched in" if self.ocrd_mask_patched else "not needed (vLLM has it)",
                    f"fused in {self.ocrd_fused_layers} layers ({reason})"
                    if self.ocrd_fused_layers else f"vLLM's ({reason})",
                    "; CUDA graphs" if self.ocrd_graphs else "")

    def ocrd_set_fast(self, on: bool) -> bool:
        on = on and unsupported(self) is None
        self.ocrd_fast = on
        if self.ocrd_mask_patched:
            self.qwen2_model.model.model._ocrd_fast = on
        self.ocrd_set_fused(on)
        return on

    def ocrd_set_fused(self, on: bool, blocks: tuple[int, int, int, int] | None = None,
                       lean: bool | None = None) -> bool:
        """SAM's attention: the fused kernel (where it was patched in) or vLLM's code;
        its block sizes and layout (relpos_attention.set_fused; None: the defaults)."""
        on = on and getattr(self, "ocrd_fused_layers", 0) > 0
        relpos_attention.set_fused(self.sam_model, on, blocks, lean)
        return on

    def _pixel_values_to_embedding(self, pixel_values: torch.Tensor,
                                   images_crop: torch.Tensor,
                                   images_spatial_crop: torch.Tensor) -> Any:
        if not self.ocrd_fast:
            dtype = self.view_seperator.dtype
            return super()._pixel_values_to_embedding(
                pixel_values=normalise(pixel_values, dtype),
                images_crop=normalise(images_crop, dtype),
                images_spatial_crop=images_spatial_crop)
        return page_embeddings(self, pixel_values, images_crop, images_spatial_crop,
                               self.ocrd_batched, self.ocrd_padded, self.ocrd_chunks,
                               self.ocrd_bucketed)
