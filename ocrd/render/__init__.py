"""Documents into page images: PDFium and poppler in worker processes, Pillow for images,
resolution and pixel packing."""
