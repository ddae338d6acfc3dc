"""Documents → page images: probing, completeness checks and rendering.

These functions run in worker processes (ocrd/render/pool.py's `RenderPool`); the
pixels come back as `RenderedPage`s through tmpfs (ocrd/render/pixels.py). Both are
re-exported here, as the rest of ocrd and the tests know them as `pages.*`.
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any, Literal

from PIL import Image, ImageOps

from ocrd import errors, safefs
from ocrd.render import formats, modes, pdffaults, resolution
from ocrd.render import pixels as pagepixels
from ocrd.render.pixels import RenderedPage
from ocrd.render.resolution import Resolution

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
    # False: the file's end is missing (a PDF without %%EOF) although it reads; such a
    # file is converted only once it has stopped changing (ocrd/intake/readiness.py)
    complete: bool = True
    warnings: tuple[str, ...] = ()  # for the sidecar: what was odd about the file
    # the PDF did not open as it is and is read from the copy qpdf repaired (in memory)
    repaired: bool = False

# A PDF without its end marker that opens and has pages: read as far as it goes.
NO_TRAILER = ("the PDF ends without its trailer (%%EOF); it was read as far as its "
              "pages go")


# A PDF that neither PDFium nor poppler opens is given to qpdf, which rebuilds a missing
# or broken cross-reference table (a file cut off before its end, offsets that are
# wrong): up to this size, the repaired copy is kept in memory by the worker that reads it.
REPAIR_MAX_BYTES = 128 * 2**20


def repaired_warning(why: str, trailer: bool, pages: int) -> str:
    """The sidecar's sentence for a PDF read from its repaired copy."""
    cut = "" if trailer else "; it ends without its trailer (%%EOF): it was cut off"
    return (f"the PDF could not be opened as it was ({why}){cut}; qpdf repaired it and "
            f"{pages} page{'s' * (pages != 1)} were read from the repaired copy")


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
        if errors.shortage(e):
            raise  # the daemon's trouble (no descriptor to spare …), not the file's
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


def probe(path: str, dpi: int, max_pages: int, max_bytes: int, max_pixels: int,
          finished: bool = False) -> DocInfo:
    """Decide whether the file is a complete, supported document and how big it is.

    Raises `errors.EmptyFile` / `errors.Truncated` for files that may still be being
    written, and the other `OcrdError`s for files that will never convert. Nothing else:
    a library's unexpected exception becomes `errors.InternalError`, with its traceback.
    A PDF that does not open is repaired (qpdf) when it has its end, or when the caller
    knows the file is `finished` (claimed, or given to `ocrd convert`); a PDF without its
    end is not, while it may still be being written."""
    try:
        return _probe(path, dpi, max_pages, max_bytes, max_pixels, finished)
    except errors.OcrdError:
        raise
    except MemoryError:
        raise errors.TooLarge("the file is too large to read in memory") from None
    except Exception as e:  # noqa: BLE001 - one file's surprise must stay that file's
        raise errors.internal(e, "reading the file") from None


def _probe(path: str, dpi: int, max_pages: int, max_bytes: int, max_pixels: int,
           finished: bool) -> DocInfo:
    head, tail, size = _sniff(path)
    if size == 0:
        raise errors.EmptyFile("the file is empty (0 bytes)")
    if size > max_bytes:
        raise errors.TooLarge(f"the file has {size} bytes, more than limits.max_file_bytes "
                              f"({max_bytes})")
    if b"%PDF" in head:  # some writers leave out the version's dash: PDFium reads them
        return _probe_pdf(path, tail, dpi, max_pages, finished)
    return _probe_image(path, head, tail, max_pages, max_pixels)


def _probe_pdf(path: str, tail: bytes, dpi: int, max_pages: int, finished: bool) -> DocInfo:
    """A PDF with its trailer, or without one that still opens or (`finished`) that qpdf
    repairs (then `complete` is False: whether it is whole is for the caller to judge,
    from whether it still changes)."""
    trailer = b"%%EOF" in tail
    try:
        info = _count_pdf(path, dpi)
    except errors.Encrypted:
        raise
    except errors.OcrdError as failed:
        info = _repaired_or_raise(path, dpi, trailer, finished, failed)
    if info.pages > max_pages:
        raise errors.TooManyPages(f"the PDF has {info.pages} pages, more than "
                                  f"limits.max_pages ({max_pages})")
    if info.repaired or trailer:
        return info
    return replace(info, complete=False, warnings=(NO_TRAILER,))


def _repaired_or_raise(path: str, dpi: int, trailer: bool, finished: bool,
                       failed: errors.OcrdError) -> DocInfo:
    """Before calling a PDF that does not open damaged or truncated: what qpdf can
    repair, once the file is known to be finished (its end there, or the caller says
    so). A repaired file without its end stays incomplete."""
    info = _count_repaired(path, dpi) if trailer or finished else None
    if info is not None:
        said = re.search(r"\((.+)\)$", str(failed))
        why = said.group(1) if said else str(failed)
        return replace(info, complete=trailer,
                       warnings=(repaired_warning(why, trailer, info.pages),))
    if trailer:
        raise failed
    if finished:
        raise errors.Truncated("the PDF ends without its trailer (%%EOF) and qpdf cannot "
                               "repair it: it is truncated")
    raise errors.Truncated("the PDF ends without its trailer (%%EOF): it is truncated or "
                           "still being written")


def _count_pdf(path: str, dpi: int) -> DocInfo:
    try:
        pages, pixels = _pdfium_count(path, dpi)
        renderer = "pypdfium2"
    except errors.Encrypted as locked:
        # PDFium asks for a password that poppler may not need (an empty user password
        # under a security handler PDFium lacks): encrypted only if poppler asks too.
        try:
            pages = _poppler_count(path)
        except errors.OcrdError:
            raise locked from None
        renderer = "pdf2image"
        pixels = pages * int(8.27 * dpi) * int(11.69 * dpi)
    except errors.OcrdError:
        # PDFium refuses some damaged files that poppler repairs: try it before giving up.
        renderer = "pdf2image"
        pages = _poppler_count(path)
        pixels = pages * int(8.27 * dpi) * int(11.69 * dpi)
    if pages == 0:
        raise errors.Unreadable("the PDF has no pages")
    return DocInfo("pdf", "PDF", pages, renderer, pixels)


def _count_repaired(path: str, dpi: int) -> DocInfo | None:
    """The PDF's pages as qpdf repairs it, read by PDFium; None when it cannot be."""
    try:
        data = _repaired(path)
        pages, pixels = _pdfium_count(path, dpi, data)
    except errors.OcrdError:
        return None
    if pages == 0:
        return None
    return DocInfo("pdf", "PDF", pages, "pypdfium2", pixels, repaired=True)


def _repaired(path: str) -> bytes:
    """The PDF at `path` as qpdf repairs it when opening (a rebuilt cross-reference
    table, what the objects found say), written anew; Damaged when it cannot be."""
    import pikepdf

    with _reader(path) as f:
        size = os.fstat(f.fileno()).st_size
        if size > REPAIR_MAX_BYTES:
            raise errors.Damaged(f"the PDF is too large ({size} bytes) to be repaired")
        try:
            with pikepdf.open(f) as pdf:
                if len(pdf.pages) == 0:
                    raise errors.Damaged("qpdf finds no pages in the PDF")
                if pdf.is_encrypted or _encryption_dictionary(f):
                    # cut off before the trailer that names its encryption: what qpdf
                    # would write is the ciphertext
                    raise errors.Damaged("the PDF is encrypted and cannot be repaired")
                out = io.BytesIO()
                pdf.save(out)
        except errors.OcrdError:
            raise
        except Exception as e:  # noqa: BLE001 - qpdf's failures: it cannot be repaired
            if errors.shortage(e):
                raise
            raise errors.Damaged(f"qpdf cannot repair the PDF ({_said(e)})") from None
    return out.getvalue()


_STANDARD_SECURITY = re.compile(rb"/Filter\s*/Standard\b")


def _encryption_dictionary(f: Any) -> bool:
    """Whether the file holds a standard security handler's dictionary (an encrypted
    PDF's, wherever its trailer went)."""
    f.seek(0)
    tail = b""
    while chunk := f.read(1 << 20):
        if _STANDARD_SECURITY.search(tail + chunk):
            return True
        tail = chunk[-64:]
    return False


def _pdfium_count(path: str, dpi: int, data: bytes | None = None) -> tuple[int, int]:
    doc = open_pdfium(path) if data is None else open_pdfium_bytes(data)
    try:
        n = len(doc)
        pixels = 0
        if n:  # the first page's size (some damaged files have none: poppler is asked)
            w, h = doc.get_page_size(0)
            pixels = int(w * dpi / 72) * int(h * dpi / 72) * n
        return n, pixels
    except Exception as e:  # noqa: BLE001 - PDFium's failures on a damaged page tree
        raise _pdf_error(f"PDFium cannot read the pages: {e}") from None
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
        if errors.shortage(e):  # pdfinfo could not be started
            raise
        raise errors.Unreadable(f"the PDF cannot be read: {e}") from None
    return int(info.get("Pages", 0))


def _pdf_error(text: str) -> errors.OcrdError:
    return pdffaults.pdf_error(text)


def _probe_image(path: str, head: bytes, tail: bytes, max_pages: int,
                 max_pixels: int) -> DocInfo:
    try:
        return _read_image(path, max_pages, max_pixels)
    except errors.Truncated as cut:
        # Read as far as it goes: an image whose last bytes are missing (Pillow's
        # "truncated") mostly decodes; whether it is whole is the caller's to judge.
        try:
            with _lenient():
                info = _read_image(path, max_pages, max_pixels)
        except Exception:  # noqa: BLE001 - not even that: it fails as it is
            raise cut from None
        return replace(info, complete=False, warnings=(NO_IMAGE_END,))
    except errors.OcrdError:
        raise
    except Image.DecompressionBombError as e:
        raise errors.TooLarge(f"the image is too large to decode safely ({e})") from None
    except (Image.UnidentifiedImageError, ValueError) as e:
        if _image_magic(head):
            raise errors.Truncated(f"the {_image_magic(head)} image is damaged or incomplete "
                                   "(its header cannot be read)") from None
        raise errors.UnsupportedFormat(formats.unsupported(head, tail)) from e
    except MemoryError:
        raise
    except Exception as e:  # noqa: BLE001 - Pillow refused it while opening it
        if errors.shortage(e):
            raise
        raise _undecodable(e, _image_magic(head) or "image") from None


def _read_image(path: str, max_pages: int, max_pixels: int) -> DocInfo:
    """Open and decode the whole image (its last page too); an image Pillow opens but
    cannot decode raises its OcrdError (`_undecodable`)."""
    with _reader(path) as f, Image.open(f, formats=_open_formats()) as im:
        try:
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
        except (errors.OcrdError, Image.DecompressionBombError, MemoryError):
            raise
        except Exception as e:  # noqa: BLE001 - decoders raise many kinds on a damaged file
            if errors.shortage(e):
                raise  # the daemon's trouble (no descriptor to spare …), not the file's
            raise _undecodable(e, im.format or "image") from None


# An image whose last bytes are missing that decodes as far as it goes.
NO_IMAGE_END = ("the image ends early; it was read as far as it goes (what is missing "
                "shows as grey)")


def _undecodable(e: Exception, fmt: str) -> errors.OcrdError:
    """The failure of an image Pillow opened but could not decode: truncated when its
    bytes stop, unsupported_format for a variant Pillow does not read, else damaged.
    Each may also be a file still being written (`cut_short`): readiness waits for it to
    stop changing before failing it."""
    said = _said(e)
    low = said.lower()
    if isinstance(e, EOFError) or "truncated" in low or "premature end" in low:
        err: errors.OcrdError = errors.Truncated(
            f"the {fmt} image cannot be decoded completely ({said})")
    elif "unsupported" in low or "not supported" in low or "unknown" in low:
        err = errors.UnsupportedFormat(f"the {fmt} image is of a kind ocrd cannot read "
                                       f"({said})")
    else:
        err = errors.Damaged(f"the {fmt} image is damaged and cannot be decoded ({said})")
    err.cut_short = True
    return err


@contextlib.contextmanager
def _lenient() -> Iterator[None]:
    """Pillow decodes an image whose end is missing as far as it goes (worker side: one
    call at a time, so the switch is the call's alone)."""
    from PIL import ImageFile

    before = ImageFile.LOAD_TRUNCATED_IMAGES
    ImageFile.LOAD_TRUNCATED_IMAGES = True
    try:
        yield
    finally:
        ImageFile.LOAD_TRUNCATED_IMAGES = before


def _said(e: BaseException) -> str:
    """An exception as one short clause: its text, else its kind."""
    lines = str(e).strip().splitlines()
    return lines[0][:160] if lines else type(e).__name__


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
# The file this worker works for (ocrd/render/pool.py names it with every call), and
# whether PDFium has been used since the worker last started clean.
_document: int | None = None
_pdfium_used = False
# A PDF that PDFium refuses at once with a format error: loaded (and refused) before
# each real load, so that PDFium's "last error" is never one an earlier file left.
_NOT_A_PDF = b"%PDF-1.0\n"


def begin_document(document: int) -> None:
    """Worker side: the next calls are for `document`. A worker that served another
    file starts clean: its open documents closed, PDFium's state (errors, caches, fonts)
    made anew."""
    global _document, _pdfium_used, _repaired_bytes
    if document == _document:
        return
    _document = document
    for old in _open_pdf.values():
        old.close()
    _open_pdf.clear()
    _repaired_bytes = None
    if _pdfium_used:
        from pypdfium2 import _library_scope as pdfium_library

        pdfium_library.destroy_lib()  # closes whatever PDFium object is still open
        pdfium_library.init_lib()
        _pdfium_used = False


def open_pdfium(path: str) -> Any:
    """The PDF at `path` as a PDFium document (opened the safe way, `_reader`); a PDF
    PDFium cannot open raises its OcrdError (Encrypted only for a password it asked
    for on this very file)."""
    import pypdfium2 as pdfium
    import pypdfium2.raw as pdfium_c

    global _pdfium_used
    _pdfium_used = True
    pdfium_c.FPDF_LoadMemDocument64(_NOT_A_PDF, len(_NOT_A_PDF), None)  # fresh last error
    try:
        return pdfium.PdfDocument(_reader(path), autoclose=True)
    except pdfium.PdfiumError as e:
        raise _pdf_error(str(e)) from None


def open_pdfium_bytes(data: bytes) -> Any:
    """A PDF held in memory (a repaired copy) as a PDFium document."""
    import pypdfium2 as pdfium
    import pypdfium2.raw as pdfium_c

    global _pdfium_used
    _pdfium_used = True
    pdfium_c.FPDF_LoadMemDocument64(_NOT_A_PDF, len(_NOT_A_PDF), None)  # fresh last error
    try:
        return pdfium.PdfDocument(data)
    except pdfium.PdfiumError as e:
        raise _pdf_error(str(e)) from None


def _doc_key(path: str) -> tuple:
    try:
        st = os.stat(path)
    except OSError:
        return (path,)
    return (path, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _pdfium_doc(path: str, repaired: bool = False) -> Any:
    key = (*_doc_key(path), repaired)
    doc = _open_pdf.get(key)
    if doc is None:
        for old in _open_pdf.values():
            old.close()
        _open_pdf.clear()
        doc = open_pdfium_bytes(_repaired_copy(path)) if repaired else open_pdfium(path)
        _open_pdf[key] = doc
    return doc


# The repaired copy of the PDF this worker reads (one at a time), by the file's identity.
_repaired_bytes: tuple[tuple, bytes] | None = None


def _repaired_copy(path: str) -> bytes:
    """The PDF's repaired copy, made once per worker and document."""
    global _repaired_bytes
    key = _doc_key(path)
    if _repaired_bytes is None or _repaired_bytes[0] != key:
        _repaired_bytes = None
        _repaired_bytes = (key, _repaired(path))
    return _repaired_bytes[1]


def forget(path: str) -> None:
    """Close the cached documents of a path (worker side)."""
    global _repaired_bytes
    for key in [k for k in _open_pdf if k[0] == path]:
        _open_pdf.pop(key).close()
    if _repaired_bytes is not None and _repaired_bytes[0][0] == path:
        _repaired_bytes = None


def render_page(path: str, info: DocInfo, index: int, dpi: float | Resolution,
                max_pixels: int, renderer: str | None = None) -> RenderedPage:
    """Render page `index` (0-based) as RGB at `dpi` (with a `Resolution`, a scanned page
    at about its image's own resolution), lowered for oversized pages so the image stays
    within `max_pixels`.

    Raises `errors.OcrdError`s only: the page's own failure (RenderFailed, Damaged,
    Truncated, PageTooSmall for a page smaller than any text), or the file's (Encrypted,
    TooLarge); a library's unexpected exception becomes `errors.InternalError`."""
    try:
        return _render_page(path, info, index, dpi, max_pixels, renderer)
    except errors.OcrdError:
        raise
    except MemoryError:
        raise errors.RenderFailed(f"page {index + 1} is too large to render in memory") \
            from None
    except Exception as e:  # noqa: BLE001 - one page's surprise must stay that page's
        raise errors.internal(e, f"rendering page {index + 1}") from None


def _render_page(path: str, info: DocInfo, index: int, dpi: float | Resolution,
                 max_pixels: int, renderer: str | None) -> RenderedPage:
    renderer = renderer or info.renderer
    res = dpi if isinstance(dpi, Resolution) else Resolution(dpi, dpi, dpi)
    if info.kind == "image":
        with _lenient() if not info.complete else contextlib.nullcontext():
            return _render_image(path, index, max_pixels, res.grey)
    if info.repaired:  # poppler cannot open the original either
        return _render_pdfium(path, index, res, max_pixels, repaired=True)
    if renderer == "pypdfium2":
        try:
            return _render_pdfium(path, index, res, max_pixels)
        except (errors.Encrypted, errors.PageTooSmall, pdffaults.UnreadableContent):
            raise
        except errors.OcrdError:
            return _render_poppler(path, index, res, max_pixels)
    return _render_poppler(path, index, res, max_pixels)


def _fit_dpi(width_pt: float, height_pt: float, dpi: float, max_pixels: int) -> float:
    px = (width_pt * dpi / 72) * (height_pt * dpi / 72)
    if px <= max_pixels or px <= 0:
        return dpi
    return dpi * (max_pixels / px) ** 0.5 * 0.999


def _render_pdfium(path: str, index: int, res: Resolution, max_pixels: int,
                   repaired: bool = False) -> RenderedPage:
    import pypdfium2 as pdfium

    doc = _pdfium_doc(path, repaired)
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
            pdffaults.check_page_size(width, height, index, "PDFium", (w, h))
            page.close()
            if pdffaults.looks_white(mode, width, height, data, repaired=repaired):
                _not_blank_if_damaged(path, index, repaired)
            return RenderedPage(index, width, height, data, dpi, mode=mode)
        maker = {"bitmap_maker": _scratch_bitmap} if pagepixels._shared_tag is not None else {}
        bitmap = page.render(scale=dpi / 72, rev_byteorder=True, may_draw_forms=True,
                             **maker)
        pdffaults.check_page_size(bitmap.width, bitmap.height, index, "PDFium", (w, h))
        if bitmap.mode != "RGB":
            img = bitmap.to_pil()
            page.close()
            return _pack(img, index, dpi)
        # Straight from PDFium's buffer: going through Pillow (3 → 4 → 3 bytes a pixel)
        # cost as much as rendering a text page.
        width, height, stride = bitmap.width, bitmap.height, bitmap.stride
        view = memoryview(bitmap.buffer).cast("B")
        if pdffaults.looks_white("RGB", width, height, view[:stride * height], stride,
                                 repaired=repaired):
            _not_blank_if_damaged(path, index, repaired)
        shared = None
        if stride == width * 3 and pagepixels._shared_tag is not None:
            shared = pagepixels._to_shared(view[:stride * height])
        raw = b"" if shared is not None else _rgb_rows(view, width, height, stride)
        page.close()
        return RenderedPage(index, width, height, raw, dpi, shared=shared)
    except errors.OcrdError:
        raise
    except (pdfium.PdfiumError, ValueError, OSError) as e:  # e.g. a crop box off the page
        raise errors.RenderFailed(f"page {index + 1} cannot be rendered ({_said(e)})") \
            from None


def _not_blank_if_damaged(path: str, index: int, repaired: bool) -> None:
    """A page that rendered white: Damaged when its content is missing or cannot be
    decoded (PDFium draws nothing for it and says nothing), else it is blank."""
    if repaired:
        why = pdffaults.unreadable_content(_repaired_copy(path), index, repaired=True)
    else:
        with _reader(path) as f:
            why = pdffaults.unreadable_content(f, index)
    if not why:
        return
    message = f"page {index + 1} comes out blank, but {why}"
    if repaired and b"%%EOF" not in _sniff(path)[1]:  # the file was cut off
        raise pdffaults.CutOffContent(message)
    raise pdffaults.UnreadableContent(message)


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
        if errors.shortage(e):  # pdftoppm could not be started
            raise
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
            dpi = stated_dpi(im)
            img = to_rgb(ImageOps.exif_transpose(im) or im)
    except errors.OcrdError:
        raise
    except MemoryError:
        raise
    except Exception as e:  # noqa: BLE001 - decoders raise many kinds on a damaged frame
        if errors.shortage(e):
            raise
        raise errors.Truncated(f"page {index + 1} of the image cannot be decoded "
                               f"({_said(e)})") from None
    # A colour photo (no scanner's resolution) stays in colour for an engine that reads
    # grey: it reads it grey, and in colour too where grey reads weakly (text in a colour
    # of about the background's brightness vanishes in grey: signs, stamps).
    photo = grey and dpi == 0 and img.mode == "RGB" and not _colourless(img)
    return _pack(img, index, dpi, grey and not photo)


# A page image for a PDF made from the rendered pages (the searchable PDF of a document
# whose original cannot be rewritten): born-digital pages at this resolution, scans at
# their own within the range; JPEG at this quality, grey where the page has no colour.
PAGE_IMAGE_DPI = 200
PAGE_IMAGE_SCAN_DPI = (150.0, 300.0)
PAGE_IMAGE_QUALITY = 80
PAGE_IMAGE_MAX_PIXELS = 12_000_000


def page_image(path: str, info: DocInfo, index: int) -> tuple[bytes, int, int, str]:
    """Worker side: page `index` rendered for a PDF page of its own, as JPEG bytes, with
    its size in pixels and its mode (L or RGB). One page at a time: nothing is kept."""
    res = Resolution(PAGE_IMAGE_DPI, *PAGE_IMAGE_SCAN_DPI)
    page = render_page(path, info, index, res, PAGE_IMAGE_MAX_PIXELS)
    try:
        data = pagepixels.pixels(page)
    finally:
        if page.shared is not None:
            with contextlib.suppress(OSError):
                os.unlink(page.shared)
    image = page.to_image(data)
    del data
    if image.mode == "1" or (image.mode == "RGB" and _colourless(image)):
        image = image.convert("L")
    buf = io.BytesIO()
    image.save(buf, "JPEG", quality=PAGE_IMAGE_QUALITY)
    return buf.getvalue(), image.width, image.height, image.mode


def _colourless(image: Image.Image) -> bool:
    """Whether an RGB page has no colour to speak of (its saturation stays low)."""
    small = image.reduce(max(1, min(image.size) // 256))
    return small.convert("HSV").getextrema()[1][1] < 24


def stated_dpi(im: Image.Image) -> float:
    """The resolution an image file states (a scanner writes it), 0.0 when it states
    none or one no scan has (a photo's 72 or 1 says nothing of its text)."""
    try:
        x = float((im.info.get("dpi") or (0, 0))[0])
    except (TypeError, ValueError, IndexError):
        return 0.0
    return round(x, 2) if 100 <= x <= 2400 else 0.0


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
