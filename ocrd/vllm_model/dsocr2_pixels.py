"""DeepSeek-OCR-2's page views cross vLLM's processes as uint8 and are normalised on the GPU.

vLLM's DeepSeek-OCR-2 processor (its front end, one per API server) resizes, pads and
cuts a page into views with Pillow, turns every view into float32 (`ToTensor`,
`Normalize(0.5, 0.5)`) and casts it to the model's dtype: an A4 page (one 1024 px global
view, six 768 px tiles) becomes 27.5 MB of bf16 that is sent to the engine core,
decoded there (msgpack, a copy), stacked with the step's other pages on the engine
core's one thread (`MultiModalFlatField/BatchedField._reduce_data`, a large share of
that thread's time in a served run) and copied to the GPU. The
engine core's thread is what limits one served engine.

With `OCRD_VLLM_PIXELS=uint8` (set by ocrd for the engines it starts when
`engine.vllm.fast_encoder` is on) the same Pillow views leave the processor as uint8
CHW tensors — 13.8 MB per A4 page, half the bytes, and no float passes in the front end
— and `normalise` turns them into what vLLM's processor would have made, on the GPU,
call by call: the same float32 operations in the same order (x / 255, - 0.5, / 0.5)
and the same cast, so the model sees the very same bf16 values (tested against vLLM's
processor on real page renders, tests/vllm_engine/test_uint8_pixels.py).

Only ocrd's model class (`FastDeepseekOCR2ForCausalLM`) is registered with this
processor, so vLLM's own class, and other users' engines, are left alone; a front end
and an engine core always agree because the processor is registered on the class that
the engine core builds. Pixels are either all uint8 or all float within one server (the
variable is read when vLLM builds its processor, at the engine's start): vLLM stacks the
pages of an engine step into one tensor, and a mixed stack would lose the difference.
"""

from __future__ import annotations

import copy
import os
import threading
from typing import Any

import numpy as np
import torch
from vllm.logger import init_logger

from ocrd.vllm_model.plugin import PIXELS_ENV

try:  # vLLM 0.24-0.32's names; another vLLM keeps its own processor (float views)
    from vllm.model_executor.models.deepseek_ocr2 import (
        DeepseekOCR2DummyInputsBuilder,
        DeepseekOCR2MultiModalProcessor,
        DeepseekOCR2ProcessingInfo,
    )
    from vllm.multimodal import MULTIMODAL_REGISTRY
    MISSING: str | None = None
except ImportError as e:
    MISSING = str(e)

ENV = PIXELS_ENV
UINT8 = "uint8"
FLOAT = "float"
# logged by the engine core at its first uint8 views (the managed server's output shows it)
ARRIVED_MARK = "ocrd page views arrive as uint8"

logger = init_logger("vllm.ocrd.dsocr2_pixels")
_arrived = threading.Event()


def wanted() -> bool:
    """Whether OCRD_VLLM_PIXELS asks for uint8 views."""
    return os.environ.get(ENV, FLOAT) == UINT8


class Uint8Views:
    """Stands in for the processor's `image_transform` (ToTensor + Normalize): a PIL
    view → uint8 [3, H, W]. `mean` stays: the processor pads the global view with it."""

    def __init__(self, transform: Any) -> None:
        self.mean = transform.mean
        self.std = transform.std
        if tuple(self.mean) != (0.5, 0.5, 0.5) or tuple(self.std) != (0.5, 0.5, 0.5):
            raise ValueError(f"normalise() is written for mean = std = 0.5, not "
                             f"{self.mean} / {self.std}")

    def __call__(self, image: Any) -> torch.Tensor:
        if image.mode != "RGB":  # vLLM hands over RGB; anything else as ToTensor would see it
            image = image.convert("RGB")
        return torch.from_numpy(np.asarray(image).copy()).permute(2, 0, 1)


def _uint8_copy(processor: Any) -> Any:
    """A shallow copy of vLLM's DeepseekOCRProcessor that emits uint8 views (the
    tokenizer and everything else shared)."""
    twin = copy.copy(processor)
    twin.image_transform = Uint8Views(processor.image_transform)
    method = type(processor).tokenize_with_images

    def tokenize_with_images(*args: Any, **kwargs: Any) -> tuple:
        out = list(method(twin, *args, **kwargs))
        # (input_ids, pixel_values, images_crop, ...): a page without tiles gets an
        # empty float images_crop; an empty uint8 one instead, or the step's stack of
        # crops would come out float
        pixel_values, crops = out[1], out[2]
        if pixel_values.dtype == torch.uint8 and crops.dtype != torch.uint8:
            out[2] = crops.to(torch.uint8)
        return tuple(out)

    twin.tokenize_with_images = tokenize_with_images
    return twin


if MISSING is None:
    class Uint8ProcessingInfo(DeepseekOCR2ProcessingInfo):
        """vLLM's processing info, with the processor swapped for its uint8 twin where
        OCRD_VLLM_PIXELS=uint8. vLLM caches its processors; the twins are cached with them."""

        _twins: dict[int, tuple[Any, Any]] = {}
        _lock = threading.Lock()

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            # decided when vLLM builds its processor, at the engine's start: ocrd's
            # in-process engine sets the variable only while vLLM builds the engine
            self.ocrd_uint8 = wanted()

        def get_hf_processor(self, **kwargs: object) -> Any:
            processor = super().get_hf_processor(**kwargs)
            if not self.ocrd_uint8:
                return processor
            with self._lock:
                entry = self._twins.get(id(processor))
                if entry is None or entry[0] is not processor:
                    entry = (processor, _uint8_copy(processor))
                    self._twins[id(processor)] = entry
                return entry[1]


def register(model_cls: Any) -> Any:
    """Class decorator: `model_cls` (ocrd's model class) gets vLLM's DeepSeek-OCR-2
    processor with `Uint8ProcessingInfo`; where this vLLM lacks the names it is built
    from, the class keeps vLLM's processor and its float views (logged)."""
    if MISSING is not None:
        logger.warning("ocrd's uint8 page views are off: this vLLM's DeepSeek-OCR-2 code "
                       "differs (%s); vLLM's float views are used", MISSING)
        return model_cls
    return MULTIMODAL_REGISTRY.register_processor(
        DeepseekOCR2MultiModalProcessor, info=Uint8ProcessingInfo,
        dummy_inputs=DeepseekOCR2DummyInputsBuilder)(model_cls)


def normalise(views: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """uint8 views → what vLLM's processor makes of them: ToTensor (float32, / 255),
    Normalize(0.5, 0.5) ((x - 0.5) / 0.5, float32), then the cast to the model's dtype.
    Float views (vLLM's processor ran) pass unchanged."""
    if views.dtype != torch.uint8:
        return views
    if not _arrived.is_set():
        _arrived.set()
        logger.info("%s (%s, normalised on %s)", ARRIVED_MARK, list(views.shape),
                    views.device)
    x = views.to(torch.float32).div_(255.0)
    return x.sub_(0.5).div_(0.5).to(dtype)
