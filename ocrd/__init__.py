"""ocrd: a folder-watching OCR daemon (inbox → Markdown) with DeepSeek-OCR-2 on vLLM.

The code says what is and why, not how it came to be: where a comment says a choice was
"measured" faster or smaller, the figures are in one place, bench/RESULTS.md (CPU) and
bench/GPU_RESULTS.md (GPU), never copied into the code."""

__version__ = "0.1.0"
