"""What a file that is neither a PDF nor a supported image is, in a person's words, and
what to do with it: "a ZIP/Office document (.docx): save it as PDF first". Judged from
its first and last bytes only (a ZIP's central directory is at its end)."""

from __future__ import annotations

SUPPORTED_IMAGES = "PNG, JPEG, TIFF, WebP, BMP, GIF, PPM, JPEG 2000"

# Member names of Office Open XML packages (in the local headers at the start, or the
# central directory at the end), and OpenDocument's mimetype member (stored first).
_ZIP_KINDS = (
    (b"word/", "a ZIP/Office document (.docx)"),
    (b"xl/", "a ZIP/Office spreadsheet (.xlsx)"),
    (b"ppt/", "a ZIP/Office presentation (.pptx)"),
    (b"application/vnd.oasis.opendocument.text", "an OpenDocument text (.odt)"),
    (b"application/vnd.oasis.opendocument.spreadsheet", "an OpenDocument spreadsheet (.ods)"),
    (b"application/vnd.oasis.opendocument.presentation",
     "an OpenDocument presentation (.odp)"),
    (b"application/epub+zip", "an e-book (.epub)"),
)

_STARTS = (
    (b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1", "an old Office document (.doc, .xls or .ppt)",
     "save it as PDF first"),
    (b"{\\rtf", "an RTF document", "save it as PDF first"),
    (b"%!PS", "a PostScript file", "convert it to PDF first (ps2pdf)"),
    (b"AT&TFORM", "a DjVu document", "convert it to PDF first (ddjvu -format=pdf)"),
    (b"\x1f\x8b", "a gzip-compressed file", "unpack it and drop what is inside"),
    (b"Rar!\x1a\x07", "a RAR archive", "unpack it and drop what is inside"),
    (b"7z\xbc\xaf\x27\x1c", "a 7-Zip archive", "unpack it and drop what is inside"),
)

_HEIF_BRANDS = (b"heic", b"heix", b"heim", b"heis", b"hevc", b"mif1", b"msf1", b"avif")


def unsupported(head: bytes, tail: bytes) -> str:
    """The sentence for a file of `head` (its first bytes) and `tail` (its last) that no
    renderer takes."""
    kind, advice = _kind(head, tail)
    if kind is not None:
        return f"{kind}: {advice}"
    first = " ".join(f"{b:02x}" for b in head[:8])
    return (f"not a PDF or a supported image ({SUPPORTED_IMAGES}); its first bytes are {first} "
            "(hexadecimal), which ocrd does not know")


def _kind(head: bytes, tail: bytes) -> tuple[str | None, str]:
    if head.startswith(b"PK\x03\x04"):
        for marker, kind in _ZIP_KINDS:
            if marker in head or marker in tail:
                return kind, "save it as PDF first"
        return "a ZIP archive", "unpack it and drop what is inside"
    for magic, kind, advice in _STARTS:
        if head.startswith(magic):
            return kind, advice
    if head[4:8] == b"ftyp" and head[8:12] in _HEIF_BRANDS:
        return "a HEIC/HEIF photo", "save it as JPEG or PNG first"
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n").lower()
    if text.startswith((b"<!doctype html", b"<html")):
        return "a web page (HTML)", "print it to PDF first"
    if text.startswith(b"<?xml") and b"<svg" in head:
        return "an SVG drawing", "export it as PDF or PNG first"
    if _is_text(head):
        return "a text file", "it has no page to read; ocrd reads scans and PDFs"
    return None, ""


def _is_text(head: bytes) -> bool:
    try:
        decoded = head.decode("utf-8")
    except UnicodeDecodeError:
        # a multi-byte character cut at the end of the window is still text
        try:
            decoded = head[:-3].decode("utf-8")
        except UnicodeDecodeError:
            return False
    return bool(decoded) and all(c.isprintable() or c in "\t\r\n\f" for c in decoded)
