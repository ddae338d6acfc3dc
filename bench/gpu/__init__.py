"""The GPU suite: DeepSeek-OCR-2 on vLLM, on a CUDA machine (bench/gpu/run.sh)."""
