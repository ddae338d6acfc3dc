"""Benchmark switches: environment variables that reshape or turn off parts of ocrd's
fast DeepSeek-OCR-2 encoder, so that the GPU benchmarks (bench/gpu/) and the engine's
tests can measure each part against vLLM's own code side by side. Production sets none
of them: what runs without them is what ocrd ships. The variables that carry ocrd's
settings into vLLM's processes (engine.vllm.fast_encoder, uint8_pixels, the start gate)
are not switches; they live in plugin.py.
"""

from __future__ import annotations

# "GxT": global views and tiles per padded encoder call (default: dsocr2_fast's
# GLOBAL_VIEWS_PER_CALL x TILES_PER_CALL)
CHUNKS_ENV = "OCRD_VLLM_ENCODER_CHUNKS"
# "0": every padded call of the full size, so that a page's embeddings never depend on
# the step's other pages (batch invariance); default: several sizes
BUCKETS_ENV = "OCRD_VLLM_ENCODER_BUCKETS"
# SAM's attention with the relative-position bias fused (relpos_attention.py): unset =
# where vLLM runs on CUDA/ROCm and Triton is there; "0" never; "1" wherever Triton runs
# (the tests use Triton's CPU interpreter)
FUSED_SAM_ENV = "OCRD_VLLM_FUSED_SAM"
# "0": padded encoder calls without CUDA graphs
GRAPHS_ENV = "OCRD_VLLM_ENCODER_GRAPHS"
# "0": the fused kernel's layers with the copies around the kernel (the older layout)
SAM_LEAN_ENV = "OCRD_VLLM_SAM_LEAN"
