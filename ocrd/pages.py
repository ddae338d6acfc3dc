"""Documents → page images: probing, completeness checks and rendering.

These functions run in worker processes (ocrd/render_pool.py's `RenderPool`); the
pixels come back as `RenderedPage`s through tmpfs (ocrd/pagepixels.py). Both are
re-exported here, as the rest of ocrd and the tests know them as `pages.*`.
"""

from __future__ import annotations

import ctypes
import os
import stat
from dataclasses import dataclass
from typing import Any, Literal

from PIL import Image, ImageOps

from . import errors, formats, modes, pagepixels, pdffaults, resolution, safefs
from .pagepixels import (  # noqa: F401 - re-exported: pages.RenderedPage, pages.SHARED_DIR
    SHARED_DIR,
    SHARED_PREFIX,
    RenderedPage,
    _shared_dir_usable,
)
from .render_pool import RenderPool  # noqa: F401 - re-exported: pages.RenderPool
from .resolution import Resolution

# Formats accepted as images (Pillow's names). Anything else is unsupported_format.
IMAGE_FORMATS = {"PNG", "JPEG", "MPO", "TIFF", "WEBP", "BMP", "GIF", "PPM", "JPEG2000"}
# Formats whose frames are pages of one document; other multi-frame images (animated
# GIF/WebP/APNG) contribute their first frame only.
PAGED_FORMATS = {"TIFF"}
PDF_EOF_WINDOW = 4096


def _open_formats() -> list[str]:
    """Pillow plugin ids to try when opening (MPO, a JPEG variant, opens via JPEG)."""
    Image.init()
    return sorted(f for f in IMAGE_FORMATS if f in Image.OPEN)

Kind = Literal["pdf", "image"]


@dataclass(frozen=True)
class DocInfo:
    """What probing a file found: enough to schedule it and to render its pages."""

    kind: Kind
    format: str  # "PDF", "PNG", "JPEG", "TIFF", ...
    pages: int
    renderer: str  # "pypdfium2", "pdf2image" or "pillow"
    pixels: int  # estimated pixels of all pages at the render dpi (for ordering)


# A render worker's pixel buffer for PDFium, kept between pages: a fresh 6 MB buffer per
# page costs as much in page faults as rendering a text page. Pages larger than this
# get a buffer of their own, so one huge page does not pin its size in every worker.
SCRATCH_MAX_BYTES = 64 * 2**20
_scratch: Any = None


def _scratch_bitmap(width: int, height: int, format: int, rev_byteorder: bool = False) -> Any:
    """Worker side: a PDFium bitmap maker that renders into the reused buffer."""
    import pypdfium2 as pdfium
    import pypdfium2.raw as pdfium_c

    global _scratch
    size = width * height * 3
    if format != pdfium_c.FPDFBitmap_BGR or size > SCRATCH_MAX_BYTES:
        return pdfium.PdfBitmap.new_native(width, height, format, rev_byteorder)
    if _scratch is None or len(_scratch) < size:
        _scratch = (ctypes.c_ubyte * size)()
    return pdfium.PdfBitmap.new_native(width, height, format, rev_byteorder,
                                       buffer=_scratch, stride=width * 3)


# ---------------------------------------------------------------------------------------
# Worker-side functions (picklable, module level)


def _open_regular(path: str) -> int:
    """Open without following symlinks or blocking on a FIFO, and insist on a regular
    file: the path may have been swapped since the caller looked at it. A file the
    daemon holds open (safefs.fd_path) is opened through /proc, which names that open
    file itself."""
    nofollow = 0 if safefs.is_fd_path(path) else os.O_NOFOLLOW
    try:
        fd = os.open(path, os.O_RDONLY | nofollow | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise errors.Unreadable("the file disappeared before it could be read",
                                reason="vanished") from None
    except PermissionError:
        raise errors.Unreadable("ocrd has no permission to read the file "
                                "(check its owner and mode)") from None
    except OSError as e:
        if e.errno == 40:  # ELOOP: a symlink
            raise errors.NotRegularFile("the file is a symbolic link; ocrd only reads "
                                        "regular files") from None
        raise errors.Unreadable(f"the file cannot be opened: {e.strerror}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise errors.NotRegularFile("not a regular file (a FIFO, socket, device or folder)")
    return fd


def _reader(path: str) -> Any:
    """The file as a Python file object, opened the safe way (`_open_regular`). PDFium
    and Pillow get this, never the path: pypdfium2 resolves a path string (following
    /proc/PID/fd/N back to whatever now has the file's old name) and reopens it."""
    return os.fdopen(_open_regular(path), "rb")


def _sniff(path: str) -> tuple[bytes, bytes, int]:
    fd = _open_regular(path)
    try:
        size = os.fstat(fd).st_size
        head = os.pread(fd, 1024, 0)
        tail = os.pread(fd, PDF_EOF_WINDOW, max(0, size - PDF_EOF_WINDOW))
    finally:
        os.close(fd)
    return head, tail, size


def probe(path: str, dpi: int, max_pages: int, max_bytes: int, max_pixels: int) -> DocInfo:
    """Decide whether the file is a complete, supported document and how big it is.

    Raises `errors.EmptyFile` / `errors.Truncated` for files that may still be being
    written, and the other `OcrdError`s for files that will never convert."""
    head, tail, size = _sniff(path)
    if size == 0:
        raise errors.EmptyFile("the file is empty (0 bytes)")
    if size > max_bytes:
        raise errors.TooLarge(f"the file has {size} bytes, more than limits.max_file_bytes "
                              f"({max_bytes})")
    if b"%PDF-" in head:
        return _probe_pdf(path, tail, dpi, max_pages)
    return _probe_image(path, head, tail, max_pages, max_pixels)


def _probe_pdf(path: str, tail: bytes, dpi: int, max_pages: int) -> DocInfo:
    if b"%%EOF" not in tail:
        raise errors.Truncated("the PDF ends without its trailer (%%EOF): it is truncated "
                               "or still being written")
    pages, pixels, renderer = None, 0, "pypdfium2"
    try:
        pages, pixels = _pdfium_count(path, dpi)
    except errors.Encrypted:
        raise
    except errors.OcrdError:
        # PDFium refuses some damaged files that poppler repairs: try it before giving up.
        renderer = "pdf2image"
        pages = _poppler_count(path)
        pixels = pages * int(8.27 * dpi) * int(11.69 * dpi)
    if pages == 0:
        raise errors.Unreadable("the PDF has no pages")
    if pages > max_pages:
        raise errors.TooManyPages(f"the PDF has {pages} pages, more than limits.max_pages "
                                  f"({max_pages})")
    return DocInfo("pdf", "PDF", pages, renderer, pixels)


def _pdfium_count(path: str, dpi: int) -> tuple[int, int]:
    import pypdfium2 as pdfium

    try:
        doc = pdfium.PdfDocument(_reader(path), autoclose=True)
    except pdfium.PdfiumError as e:
        raise _pdf_error(str(e)) from None
    try:
        n = len(doc)
        if n:
            w, h = doc.get_page_size(0)
            pixels = int(w * dpi / 72) * int(h * dpi / 72) * n
        else:
            pixels = 0
        return n, pixels
    finally:
        doc.close()


def _poppler_count(path: str) -> int:
    from pdf2image import pdfinfo_from_path
    from pdf2image.exceptions import PDFInfoNotInstalledError, PDFPageCountError

    try:
        info = pdfinfo_from_path(path, timeout=60)
    except PDFInfoNotInstalledError:
        raise errors.Unreadable("PDFium cannot read this PDF and poppler (pdfinfo) is not "
                                "installed to try it") from None
    except PDFPageCountError as e:
        raise _pdf_error(str(e)) from None
    except Exception as e:  # noqa: BLE001 - poppler's failures are reported as text
        raise errors.Unreadable(f"the PDF cannot be read: {e}") from None
    return int(info.get("Pages", 0))


def _pdf_error(text: str) -> errors.OcrdError:
    return pdffaults.pdf_error(text)


def _probe_image(path: str, head: bytes, tail: bytes, max_pages: int,
                 max_pixels: int) -> DocInfo:
    try:
        with _reader(path) as f, Image.open(f, formats=_open_formats()) as im:
            fmt = im.format or "?"
            w, h = im.size
            if w * h > max_pixels:
                raise errors.TooLarge(
                    f"the image is {w}×{h} = {w * h} pixels, more than limits.max_pixels "
                    f"({max_pixels}); it may be a decompression bomb")
            frames = getattr(im, "n_frames", 1) if fmt in PAGED_FORMATS else 1
            if frames > max_pages:
                raise errors.TooManyPages(f"the image has {frames} pages, more than "
                                          f"limits.max_pages ({max_pages})")
            # Decoding the last page proves the file is complete (a truncated image
            # fails here).
            if frames > 1:
                im.seek(frames - 1)
            im.load()
            return DocInfo("image", fmt, frames, "pillow", w * h * frames)
    except errors.OcrdError:
        raise
    except Image.DecompressionBombError as e:
        raise errors.TooLarge(f"the image is too large to decode safely ({e})") from None
    except (Image.UnidentifiedImageError, ValueError) as e:
        if _image_magic(head):
            raise errors.Truncated(f"the {_image_magic(head)} image is damaged or incomplete "
                                   "(its header cannot be read)") from None
        raise errors.UnsupportedFormat(formats.unsupported(head, tail)) from e
    except (OSError, SyntaxError, EOFError) as e:
        raise errors.Truncated(f"the image cannot be decoded completely ({e})") from None


_MAGIC = [(b"\x89PNG\r\n\x1a\n", "PNG"), (b"\xff\xd8\xff", "JPEG"), (b"GIF8", "GIF"),
          (b"II*\x00", "TIFF"), (b"MM\x00*", "TIFF"), (b"BM", "BMP"),
          (b"\x00\x00\x00\x0cjP  ", "JPEG 2000")]


def _image_magic(head: bytes) -> str | None:
    """The image format a file's first bytes claim, if any."""
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "WebP"
    for magic, name in _MAGIC:
        if head.startswith(magic):
            return name
    return None


# One open PDF per worker process: pages of one document usually come in order. Keyed
# by the file's identity, not only its path: /proc/PID/fd/N names another file once the
# daemon has closed N and opened the next document.
_open_pdf: dict[tuple, Any] = {}


def _doc_key(path: str) -> tuple:
    try:
        st = os.stat(path)
    except OSError:
        return (path,)
    return (path, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _pdfium_doc(path: str) -> Any:
    import pypdfium2 as pdfium

    key = _doc_key(path)
    doc = _open_pdf.get(key)
    if doc is None:
        for old in _open_pdf.values():
            old.close()
        _open_pdf.clear()
        try:
            doc = pdfium.PdfDocument(_reader(path), autoclose=True)
        except pdfium.PdfiumError as e:
            raise _pdf_error(str(e)) from None
        _open_pdf[key] = doc
    return doc


def forget(path: str) -> None:
    """Close the cached documents of a path (worker side)."""
    for key in [k for k in _open_pdf if k[0] == path]:
        _open_pdf.pop(key).close()


def render_page(path: str, info: DocInfo, index: int, dpi: float | Resolution,
                max_pixels: int, renderer: str | None = None) -> RenderedPage:
    """Render page `index` (0-based) as RGB at `dpi` (with a `Resolution`, a scanned page
    at about its image's own resolution), lowered for oversized pages so the image stays
    within `max_pixels`."""
    renderer = renderer or info.renderer
    res = dpi if isinstance(dpi, Resolution) else Resolution(dpi, dpi, dpi)
    if info.kind == "image":
        return _render_image(path, index, max_pixels, res.grey)
    if renderer == "pypdfium2":
        try:
            return _render_pdfium(path, index, res, max_pixels)
        except errors.Encrypted:
            raise
        except errors.OcrdError:
            return _render_poppler(path, index, res, max_pixels)
    return _render_poppler(path, index, res, max_pixels)


def _fit_dpi(width_pt: float, height_pt: float, dpi: float, max_pixels: int) -> float:
    px = (width_pt * dpi / 72) * (height_pt * dpi / 72)
    if px <= max_pixels or px <= 0:
        return dpi
    return dpi * (max_pixels / px) ** 0.5 * 0.999


def _render_pdfium(path: str, index: int, res: Resolution, max_pixels: int) -> RenderedPage:
    import pypdfium2 as pdfium

    doc = _pdfium_doc(path)
    try:
        page = doc[index]
        w, h = page.get_size()
        found = None if res.fixed else resolution.scan(page)
        one_bit = res.grey and found is not None and found[1] == 1
        mode = "1" if one_bit else "L" if res.grey else "RGB"
        dpi = _fit_dpi(w, h, res.for_scan(found[0] if found else None),
                       res.max_pixels(mode, max_pixels))
        if res.grey:  # in its own mode, for an engine that reads grey
            width, height, data, mode = modes.render_grey(page, dpi, one_bit)
            pdffaults.check_page_size(width, height, index, "PDFium")
            page.close()
            return RenderedPage(index, width, height, data, dpi, mode=mode)
        maker = {"bitmap_maker": _scratch_bitmap} if pagepixels._shared_tag is not None else {}
        bitmap = page.render(scale=dpi / 72, rev_byteorder=True, may_draw_forms=True,
                             **maker)
        pdffaults.check_page_size(bitmap.width, bitmap.height, index, "PDFium")
        if bitmap.mode != "RGB":
            img = bitmap.to_pil()
            page.close()
            return _pack(img, index, dpi)
        # Straight from PDFium's buffer: going through Pillow (3 → 4 → 3 bytes a pixel)
        # cost as much as rendering a text page.
        width, height, stride = bitmap.width, bitmap.height, bitmap.stride
        view = memoryview(bitmap.buffer).cast("B")
        shared = None
        if stride == width * 3 and pagepixels._shared_tag is not None:
            shared = pagepixels._to_shared(view[:stride * height])
        raw = b"" if shared is not None else _rgb_rows(view, width, height, stride)
        page.close()
        return RenderedPage(index, width, height, raw, dpi, shared=shared)
    except pdfium.PdfiumError as e:
        raise errors.RenderFailed(f"page {index + 1} cannot be rendered: {e}") from None


def _rgb_rows(buf: memoryview, width: int, height: int, stride: int) -> bytes:
    """Packed RGB rows from a buffer whose rows may be padded to `stride` bytes."""
    row = width * 3
    if stride == row:
        return bytes(buf[:row * height])
    return b"".join(buf[y * stride:y * stride + row] for y in range(height))


def _render_poppler(path: str, index: int, res: Resolution, max_pixels: int) -> RenderedPage:
    from pdf2image import convert_from_path

    dpi = res.dpi
    max_pixels = res.max_pixels("L" if res.grey else "RGB", max_pixels)
    try:
        imgs = convert_from_path(path, dpi=dpi, first_page=index + 1, last_page=index + 1,
                                 fmt="ppm", timeout=600, grayscale=res.grey)
    except Exception as e:  # noqa: BLE001 - poppler reports everything as text
        raise _pdf_error(str(e)) from None
    if not imgs:
        raise errors.RenderFailed(f"page {index + 1} rendered to nothing")
    img = imgs[0]
    pdffaults.check_page_size(img.width, img.height, index, "poppler")
    if img.width * img.height > max_pixels:
        scale = (max_pixels / (img.width * img.height)) ** 0.5
        img = img.resize((max(1, int(img.width * scale)), max(1, int(img.height * scale))))
        dpi *= scale
    return _pack(img, index, dpi, res.grey)


def _render_image(path: str, index: int, max_pixels: int, grey: bool = False) -> RenderedPage:
    try:
        with _reader(path) as f, Image.open(f, formats=_open_formats()) as im:
            if im.width * im.height > max_pixels:
                raise errors.TooLarge(f"the image has more than {max_pixels} pixels")
            if index:
                im.seek(index)
            im.load()
            img = to_rgb(ImageOps.exif_transpose(im) or im)
    except errors.OcrdError:
        raise
    except (OSError, SyntaxError, EOFError, ValueError) as e:
        raise errors.Truncated(f"page {index + 1} of the image cannot be decoded ({e})") \
            from None
    return _pack(img, index, 0.0, grey)


def to_rgb(im: Image.Image) -> Image.Image:
    """Any Pillow mode → 8-bit RGB: transparency on white, 16-bit scaled (not clipped)."""
    if im.mode in ("I;16", "I;16B", "I;16L", "I;16N", "I"):
        # Scale by the actual maximum: 16-bit scans rarely use the full range, and
        # Pillow's plain convert clips everything above 255 to white.
        arr = im.convert("I")
        lo, hi = arr.getextrema()
        span = max(1, hi - lo)
        im = arr.point(lambda v: (v - lo) * 255 / span).convert("L")
    elif im.mode == "F":
        im = im.convert("L")
    if im.mode == "P":
        im = im.convert("RGBA" if "transparency" in im.info else "RGB")
    if im.mode in ("RGBA", "LA", "PA", "RGBa", "La"):
        rgba = im.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        im = Image.alpha_composite(background, rgba)
    return im.convert("RGB") if im.mode != "RGB" else im


def _pack(img: Image.Image, index: int, dpi: float, grey: bool = False) -> RenderedPage:
    img = to_rgb(img)
    if grey:
        img = img.convert("L")
    return RenderedPage(index, img.width, img.height, img.tobytes(), dpi, mode=img.mode)
