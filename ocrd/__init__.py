"""ocrd: a folder-watching OCR daemon (inbox → Markdown) with DeepSeek-OCR-2 on vLLM."""

__version__ = "0.1.0"
