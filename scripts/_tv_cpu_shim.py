"""Lets PyPI's CUDA-built torchvision import beside a CPU build of torch (test venvs only).

PyPI's torchvision wheel links its C++ ops against CUDA torch, so with torch 2.13.0+cpu
its `_C.so` does not load and `import torchvision` dies with "operator torchvision::nms
does not exist" (torchvision registers fake kernels for nms/qnms unconditionally). This
module declares those two op schemas right before torchvision is first imported, and only
when the real extension fails to load. vLLM's DeepSeek-OCR image processor needs only the
pure-Python `torchvision.transforms`. It is imported from a `.pth` file (installed by
scripts/setup-vllm-cpu.sh) so that processes vLLM spawns get it too.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

# Keeps the op library alive: torch drops the definitions when it is garbage-collected.
_LIB: Any = None


def _declare_ops() -> None:
    global _LIB
    import torch

    _LIB = torch.library.Library("torchvision", "FRAGMENT")
    _LIB.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _LIB.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")


def _load_or_declare() -> None:
    import torch

    spec = importlib.util.find_spec("torchvision")
    if spec is None or spec.origin is None:
        return
    try:
        # A torchvision built for this torch loads fine: then nothing is patched.
        torch.ops.load_library(os.path.join(os.path.dirname(spec.origin), "_C.so"))
    except (OSError, ImportError, RuntimeError):
        _declare_ops()


class _BeforeTorchvision(importlib.abc.MetaPathFinder):
    """Runs once, at the first `import torchvision`, then steps aside."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None = None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname == "torchvision":
            sys.meta_path.remove(self)
            _load_or_declare()
        return None  # the normal finders import the module itself


if not any(isinstance(f, _BeforeTorchvision) for f in sys.meta_path):
    sys.meta_path.insert(0, _BeforeTorchvision())
