"""Code that runs inside vLLM's processes: DeepSeek-OCR-2's faster vision encoder
(`dsocr2_fast`, with SAM's fused attention kernel in `relpos_attention`), the cheap
n-gram ban (`ngram`) and the vLLM plugin that registers the encoder (`plugin`).

vLLM loads these by name (the `vllm.general_plugins` entry point in pyproject.toml, the
model class and the logits processor named in the engine's arguments), in the engine
core it starts and in every `vllm serve` process. The daemon's engine adapters
(ocrd/engines/) import only `plugin`, which is light, to tell those processes what to
load; and the in-process engine hands `ngram`'s class to vLLM when it starts vLLM in the
daemon's own process. This file imports nothing: the plugin runs in every vLLM process.
"""
