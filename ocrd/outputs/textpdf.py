"""The searchable PDF beside the Markdown: the original with an invisible text layer.

A PDF keeps everything it had — content streams, images, fonts, annotations, page
sizes, rotation, metadata: each page's own streams are wrapped in q/Q (their bytes
unchanged) and one form XObject per page, holding that page's layer (ocrd/outputs/textlayer.py),
is drawn after them through the one matrix that maps the displayed page (0..1) onto the
page's crop box under its /Rotate. An image becomes one page per frame at its own
resolution (72 dpi when it names none), a JPEG embedded byte for byte (its EXIF
orientation applied by the drawing matrix, not by re-encoding), other formats losslessly
(Flate) with the orientation applied to the pixels.

pikepdf (qpdf) writes it: qpdf opens a document lazily and copies stream data from the
input file to the output as it writes, so a 1,000-page scan costs about what a 10-page one
does, and `stream_decode_level=none` with `compress_streams=False` copies every existing
stream's bytes as they are (no recompression, so image stream hashes stay equal).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from typing import IO, Any

from ocrd.outputs.textlayer import FONT_NAME, GLYPHLESS_TTF, FontMap, PageLayer
from ocrd.render.pdffaults import inherited

LAYER_NAME = "OcrdLayer"
_TEXT_SHOWING = {"Tj", "TJ", "'", '"'}
# operators that make marks other than text (paths, images, shadings, inline images)
_PAINTING = {"S", "s", "f", "F", "f*", "B", "B*", "b", "b*", "sh", "Do", "BI", "EI"}


def _flate(pdf: Any, data: bytes, **entries: Any) -> Any:
    """A stream holding `data`, compressed here (the writer copies streams as they are)."""
    import pikepdf

    stream = pikepdf.Stream(pdf, b"")
    stream.write(zlib.compress(data, 6), filter=pikepdf.Name.FlateDecode)
    for key, value in entries.items():
        stream[f"/{key}"] = value
    return stream


def make_font(pdf: Any, fonts: FontMap) -> Any:
    """The glyph-less Type0 font (Identity-H) for every CID the document used."""
    from pikepdf import Array, Dictionary, Name

    n = len(fonts.cids) + 1
    cid_to_gid = b"\x00\x00" + b"\x00\x01" * (n - 1)  # every character: the one glyph
    descriptor = pdf.make_indirect(Dictionary(
        Type=Name.FontDescriptor, FontName=Name("/GlyphLessFont"), Flags=5,
        FontBBox=Array([0, 0, 500, 1000]), ItalicAngle=0, Ascent=1000, Descent=-1,
        CapHeight=1000, StemV=80, FontFile2=_flate(pdf, GLYPHLESS_TTF,
                                                   Length1=len(GLYPHLESS_TTF))))
    cid_font = pdf.make_indirect(Dictionary(
        Type=Name.Font, Subtype=Name.CIDFontType2, BaseFont=Name("/GlyphLessFont"),
        CIDSystemInfo=Dictionary(Registry="Adobe", Ordering="Identity", Supplement=0),
        FontDescriptor=descriptor, DW=500, CIDToGIDMap=_flate(pdf, cid_to_gid)))
    return pdf.make_indirect(Dictionary(
        Type=Name.Font, Subtype=Name.Type0, BaseFont=Name("/GlyphLessFont"),
        Encoding=Name("/Identity-H"), DescendantFonts=Array([cid_font]),
        ToUnicode=_flate(pdf, fonts.to_unicode())))


def layer_form(pdf: Any, layer: PageLayer, font: Any) -> Any:
    """The page's layer as a form XObject over the unit square."""
    import pikepdf
    from pikepdf import Array, Dictionary, Name

    form = pikepdf.Stream(pdf, b"")
    form.write(layer.stream, filter=Name.FlateDecode)
    form.Type, form.Subtype = Name.XObject, Name.Form
    form.BBox = Array([0, 0, 1, 1])
    form.Resources = Dictionary(Font=Dictionary({FONT_NAME: font}))
    return pdf.make_indirect(form)


def display_matrix(page: Any) -> tuple[float, ...]:
    """The `cm` from the displayed page as 0..1 (y up) to the page's user space: its crop
    box (as PDFium renders it) turned by /Rotate."""
    box = inherited(page, "/CropBox") or inherited(page, "/MediaBox")
    media = inherited(page, "/MediaBox")
    x0, y0, x1, y1 = (float(v) for v in (box if box is not None else media))
    if media is not None:  # the crop box as shown: inside the media box
        m = [float(v) for v in media]
        x0, x1 = max(min(x0, x1), min(m[0], m[2])), min(max(x0, x1), max(m[0], m[2]))
        y0, y1 = max(min(y0, y1), min(m[1], m[3])), min(max(y0, y1), max(m[1], m[3]))
    w, h = x1 - x0, y1 - y0
    rotate = int(inherited(page, "/Rotate") or 0) % 360
    return {0: (w, 0, 0, h, x0, y0), 90: (0, h, -w, 0, x1, y0),
            180: (-w, 0, 0, -h, x1, y1), 270: (0, -h, w, 0, x0, y1)}.get(
                rotate, (w, 0, 0, h, x0, y0))


def _own_resources(pdf: Any, page: Any) -> Any:
    """The page's /Resources as a dictionary of its own (a shallow copy where it was
    shared or inherited: fonts and images stay the same objects), with an /XObject
    dictionary of its own too."""
    from pikepdf import Dictionary

    res = inherited(page, "/Resources")
    own = Dictionary({k: v for k, v in res.items()}) if res is not None else Dictionary()
    xobjects = own.get("/XObject")
    own["/XObject"] = Dictionary({k: v for k, v in xobjects.items()}) \
        if xobjects is not None else Dictionary()
    page.Resources = own
    return own


def _free_name(xobjects: Any) -> str:
    n = 1
    while (name := f"/{LAYER_NAME}{'' if n == 1 else n}") in xobjects:
        n += 1
    return name


def _fmt(matrix: Sequence[float]) -> str:
    return " ".join(f"{v:.4f}".rstrip("0").rstrip(".") for v in matrix)


def add_layer(pdf: Any, page: Any, layer: PageLayer, font: Any) -> None:
    """Draw the layer over the page; the page's own streams are kept as they are."""
    import pikepdf

    name = _free_name(_own_resources(pdf, page.obj).XObject)
    page.obj.Resources.XObject[name] = layer_form(pdf, layer, font)
    tail = f"\nQ\nq {_fmt(display_matrix(page.obj))} cm {name} Do Q\n".encode()
    if "/Contents" in page.obj:
        page.contents_add(pikepdf.Stream(pdf, b"q\n"), prepend=True)
        page.contents_add(pikepdf.Stream(pdf, tail))
    else:
        page.obj.Contents = pikepdf.Stream(pdf, tail.replace(b"\nQ\n", b"", 1))


def strip_invisible_text(pdf: Any, page: Any) -> bool:
    """Remove an earlier OCR layer from the page: text shown in render mode 3 in its own
    content, and the drawing of form XObjects that hold nothing but such text (ocrd's
    own layer, OCRmyPDF's). True if there was any; visible text is kept."""
    import pikepdf

    xobjects = (inherited(page.obj, "/Resources") or {}).get("/XObject") or {}
    kept, mode, saved, removed = [], 0, [], False
    for operands, op in pikepdf.parse_content_stream(page):
        name = str(op)
        if name == "q":
            saved.append(mode)
        elif name == "Q" and saved:
            mode = saved.pop()
        elif name == "Tr" and operands:
            mode = int(operands[0])
        elif (name in _TEXT_SHOWING and mode == 3) or (
                name == "Do" and operands and _text_only_form(xobjects.get(operands[0]))):
            removed = True
            continue
        kept.append((operands, op))
    if removed:
        page.obj.Contents = pikepdf.Stream(pdf, pikepdf.unparse_content_stream(kept))
    return removed


def _text_only_form(xobject: Any) -> bool:
    """A form XObject that shows text in render mode 3 and paints nothing else."""
    import pikepdf

    if xobject is None or xobject.get("/Subtype") != "/Form":
        return False
    mode, shown = 0, False
    for operands, op in pikepdf.parse_content_stream(xobject):
        name = str(op)
        if name == "Tr" and operands:
            mode = int(operands[0])
        elif name in _TEXT_SHOWING:
            if mode != 3:
                return False
            shown = True
        elif name in _PAINTING:
            return False
    return shown


def decide(mode: str, layer: PageLayer, existing_chars: int | None) -> str:
    """What happens on one page: 'added', 'replaced', 'kept_existing' or 'none'.
    skip_if_text keeps a page whose own text has at least half the characters the
    engine found there (a born-digital page, or one OCRed before)."""
    if layer.placement == "none":
        return "none"
    if mode == "skip_if_text" and existing_chars and existing_chars >= layer.chars / 2:
        return "kept_existing"
    return "replaced" if mode == "replace" else "added"


def write_pdf_layers(source: IO[bytes], out: IO[bytes], layers: Sequence[PageLayer],
                     fonts: FontMap, mode: str,
                     existing: Sequence[int] | None = None) -> list[str]:
    """The PDF `source` with the layers drawn over its pages, written to `out`.
    Returns what happened on each page (see decide)."""
    import pikepdf

    done: list[str] = []
    with pikepdf.open(source) as pdf:
        if len(pdf.pages) != len(layers):
            raise ValueError(f"the PDF has {len(pdf.pages)} pages, the text {len(layers)}")
        font = make_font(pdf, fonts)
        for i, page in enumerate(pdf.pages):
            what = decide(mode, layers[i], existing[i] if existing else None)
            if what == "replaced" and not strip_invisible_text(pdf, page):
                what = "added"
            if what in ("added", "replaced"):
                add_layer(pdf, page, layers[i], font)
            done.append(what)
        pdf.save(out, compress_streams=False, fix_metadata_version=False,
                 stream_decode_level=pikepdf.StreamDecodeLevel.none)
    return done


def text_chars(path: str) -> list[int]:
    """Characters of text each page of the PDF at path already has (PDFium's count,
    whitespace included); run in a render worker (PDFium is not thread-safe)."""
    from ocrd.render.pages import open_pdfium

    doc = open_pdfium(path)
    try:
        counts = []
        for i in range(len(doc)):
            page = doc[i]
            text = page.get_textpage()
            counts.append(text.count_chars())
            text.close()
            page.close()
        return counts
    finally:
        doc.close()


# EXIF orientation → the `cm` that draws the stored image (unit square, row 0 at the
# top) upright on a page of the displayed size (w, h): as Pillow's exif_transpose shows it
_ORIENT = {
    1: lambda w, h: (w, 0, 0, h, 0, 0),
    2: lambda w, h: (-w, 0, 0, h, w, 0),
    3: lambda w, h: (-w, 0, 0, -h, w, h),
    4: lambda w, h: (w, 0, 0, -h, 0, h),
    5: lambda w, h: (0, -h, -w, 0, w, h),
    6: lambda w, h: (0, -h, w, 0, 0, h),
    7: lambda w, h: (0, h, w, 0, 0, 0),
    8: lambda w, h: (0, h, -w, 0, w, 0),
}
_DEFAULT_DPI = 72.0


def _dpi(im: Any) -> tuple[float, float]:
    dpi = im.info.get("dpi")
    try:
        x, y = (float(dpi[0]), float(dpi[1])) if dpi else (0.0, 0.0)
    except (TypeError, ValueError, IndexError):
        x = y = 0.0
    ok = 10 <= x <= 10000 and 10 <= y <= 10000  # absent or absurd: one pixel, one point
    return (x, y) if ok else (_DEFAULT_DPI, _DEFAULT_DPI)


def _image_stream(pdf: Any, im: Any, jpeg: bytes | None) -> tuple[Any, int]:
    """The frame as an image XObject, and the EXIF orientation its drawing must apply."""
    from pikepdf import Name
    from PIL import ImageOps

    from ocrd.render.pages import to_rgb

    if jpeg is not None and im.mode in ("L", "RGB"):
        import pikepdf

        stream = pikepdf.Stream(pdf, b"")
        stream.write(jpeg, filter=Name.DCTDecode)
        space = Name.DeviceGray if im.mode == "L" else Name.DeviceRGB
        orientation = im.getexif().get(0x0112, 1)
        orientation = orientation if orientation in _ORIENT else 1
    else:
        im = ImageOps.exif_transpose(im) or im
        if im.mode not in ("1", "L"):
            im = to_rgb(im)
        stream = _flate(pdf, im.tobytes())
        space = Name.DeviceRGB if im.mode == "RGB" else Name.DeviceGray
        orientation = 1
    stream.Type, stream.Subtype = Name.XObject, Name.Image
    stream.Width, stream.Height = im.width, im.height
    stream.ColorSpace = space
    stream.BitsPerComponent = 1 if im.mode == "1" else 8
    return pdf.make_indirect(stream), orientation


def _image_page(pdf: Any, im: Any, jpeg: bytes | None, layer: PageLayer | None,
                font: Any) -> None:
    import pikepdf

    xobject, orientation = _image_stream(pdf, im, jpeg)
    xdpi, ydpi = _dpi(im)
    w, h = im.width * 72 / xdpi, im.height * 72 / ydpi
    if orientation >= 5:  # turned a quarter: the page is the other way round
        w, h = im.height * 72 / ydpi, im.width * 72 / xdpi
    page = pdf.add_blank_page(page_size=(w, h))
    page.obj.Resources = pikepdf.Dictionary(XObject=pikepdf.Dictionary(Im0=xobject))
    content = f"q {_fmt(_ORIENT[orientation](w, h))} cm /Im0 Do Q\n"
    if layer is not None and layer.placement != "none":
        page.obj.Resources.XObject[f"/{LAYER_NAME}"] = layer_form(pdf, layer, font)
        content += f"q {_fmt((w, 0, 0, h, 0, 0))} cm /{LAYER_NAME} Do Q\n"
    page.obj.Contents = pikepdf.Stream(pdf, content.encode())


def write_image_layers(source: IO[bytes], out: IO[bytes], layers: Sequence[PageLayer],
                       fonts: FontMap) -> list[str]:
    """One page per frame of the image `source`, each with its layer, written to `out`."""
    import pikepdf
    from PIL import Image

    done: list[str] = []
    with Image.open(source) as im, pikepdf.new() as pdf:
        frames = getattr(im, "n_frames", 1)
        if frames != len(layers):
            raise ValueError(f"the image has {frames} frames, the text {len(layers)}")
        jpeg = None
        if im.format == "JPEG":
            source.seek(0)
            jpeg = source.read()
        font = make_font(pdf, fonts)
        for i in range(frames):
            im.seek(i)
            im.load()
            _image_page(pdf, im, jpeg, layers[i], font)
            done.append("added" if layers[i].placement != "none" else "none")
        pdf.save(out)
    return done


# -- a PDF made from the rendered pages ------------------------------------------------
#
# For a document whose original qpdf cannot rewrite (a page tree with a loop, no /Root,
# an encrypted attachment) while its pages render: each page's image (rendered again, one
# at a time, in a render worker) with its text layer over it. Written object by object
# straight into the output (no document held in memory: a thousand pages cost what one
# does), a cross-reference table at the end.

# One page's image: JPEG bytes, width and height in pixels, mode (L or RGB).
PageImage = tuple[bytes, int, int, str]


class _Objects:
    """Numbered objects written in order, their offsets kept for the xref table."""

    def __init__(self, out: IO[bytes]) -> None:
        self.out = out
        self.offsets: dict[int, int] = {}
        self.pos = 0
        self._put(b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n")

    def _put(self, data: bytes) -> None:
        self.out.write(data)
        self.pos += len(data)

    def add(self, num: int, body: str, stream: bytes | None = None) -> None:
        self.offsets[num] = self.pos
        if stream is None:
            self._put(f"{num} 0 obj\n{body}\nendobj\n".encode())
            return
        head = body[:-2].rstrip() + f" /Length {len(stream)} >>"
        self._put(f"{num} 0 obj\n{head}\nstream\n".encode())
        self._put(stream)
        self._put(b"\nendstream\nendobj\n")

    def finish(self, root: int) -> None:
        size = max(self.offsets) + 1
        start = self.pos
        rows = ["xref", f"0 {size}", "0000000000 65535 f "]
        rows += [f"{self.offsets[n]:010d} 00000 n " if n in self.offsets
                 else "0000000000 65535 f " for n in range(1, size)]
        self._put(("\n".join(rows) + f"\ntrailer\n<< /Size {size} /Root {root} 0 R >>\n"
                   f"startxref\n{start}\n%%EOF\n").encode())


def write_rendered_pages(out: IO[bytes], count: int,
                         size_of: Callable[[int], tuple[float, float]],
                         image_of: Callable[[int], PageImage | None],
                         layers: Sequence[PageLayer], fonts: FontMap) -> list[str]:
    """A PDF of `count` pages, page i `size_of(i)` points (width, height) holding the image
    `image_of(i)` (None: the page is left white) with its layer over it, into `out`.
    Returns what happened to each page's layer (added, none)."""
    objs = _Objects(out)
    catalog, tree, font = 1, 2, 3
    objs.add(catalog, f"<< /Type /Catalog /Pages {tree} 0 R >>")
    kids, done = [], []
    num = 9  # 3..8: the font's objects, written at the end (they need every character)
    for i in range(count):
        w, h = size_of(i)
        image, form, contents, page = num, num + 1, num + 2, num + 3
        num += 4
        xobjects, draw = [], ""
        found = image_of(i)
        if found is not None:
            jpeg, px_w, px_h, mode = found
            space = "/DeviceGray" if mode == "L" else "/DeviceRGB"
            objs.add(image, f"<< /Type /XObject /Subtype /Image /Width {px_w} /Height {px_h} "
                     f"/ColorSpace {space} /BitsPerComponent 8 /Filter /DCTDecode >>", jpeg)
            xobjects.append(f"/Im0 {image} 0 R")
            draw += f"q {_fmt((w, 0, 0, h, 0, 0))} cm /Im0 Do Q\n"
        layer = layers[i] if i < len(layers) else None
        if layer is not None and layer.placement != "none":
            objs.add(form, "<< /Type /XObject /Subtype /Form /BBox [0 0 1 1] /Resources "
                     f"<< /Font << {FONT_NAME} {font} 0 R >> >> /Filter /FlateDecode >>",
                     layer.stream)
            xobjects.append(f"/{LAYER_NAME} {form} 0 R")
            draw += f"q {_fmt((w, 0, 0, h, 0, 0))} cm /{LAYER_NAME} Do Q\n"
            done.append("added")
        else:
            done.append("none")
        objs.add(contents, "<< /Filter /FlateDecode >>", zlib.compress(draw.encode(), 6))
        objs.add(page, f"<< /Type /Page /Parent {tree} 0 R /MediaBox [0 0 {_fmt((w, h))}] "
                 f"/Resources << /XObject << {' '.join(xobjects)} >> >> "
                 f"/Contents {contents} 0 R >>")
        kids.append(f"{page} 0 R")
    objs.add(tree, f"<< /Type /Pages /Kids [{' '.join(kids)}] /Count {count} >>")
    _font_objects(objs, font, fonts)
    objs.finish(catalog)
    return done


def _font_objects(objs: _Objects, font: int, fonts: FontMap) -> None:
    """make_font's glyph-less Type0 font, as numbered objects font..font+5."""
    cid_font, descriptor, file, cid_map, to_unicode = range(font + 1, font + 6)
    n = len(fonts.cids) + 1
    objs.add(file, f"<< /Length1 {len(GLYPHLESS_TTF)} /Filter /FlateDecode >>",
             zlib.compress(GLYPHLESS_TTF, 6))
    objs.add(descriptor, "<< /Type /FontDescriptor /FontName /GlyphLessFont /Flags 5 "
             "/FontBBox [0 0 500 1000] /ItalicAngle 0 /Ascent 1000 /Descent -1 "
             f"/CapHeight 1000 /StemV 80 /FontFile2 {file} 0 R >>")
    objs.add(cid_map, "<< /Filter /FlateDecode >>",
             zlib.compress(b"\x00\x00" + b"\x00\x01" * (n - 1), 6))
    objs.add(cid_font, "<< /Type /Font /Subtype /CIDFontType2 /BaseFont /GlyphLessFont "
             "/CIDSystemInfo << /Registry (Adobe) /Ordering (Identity) /Supplement 0 >> "
             f"/FontDescriptor {descriptor} 0 R /DW 500 /CIDToGIDMap {cid_map} 0 R >>")
    objs.add(to_unicode, "<< /Filter /FlateDecode >>", zlib.compress(fonts.to_unicode(), 6))
    objs.add(font, "<< /Type /Font /Subtype /Type0 /BaseFont /GlyphLessFont "
             f"/Encoding /Identity-H /DescendantFonts [{cid_font} 0 R] "
             f"/ToUnicode {to_unicode} 0 R >>")
