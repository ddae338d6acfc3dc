"""DeepSeek-OCR-2 on vLLM: in ocrd's process, or as supervised local `vllm serve` processes; the
layout chosen for the GPUs found."""
