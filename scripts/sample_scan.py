"""Makes samples/scan_0042.pdf, the README quick start's scan: one A4 letter as an office
scanner writes it — a 300 dpi black-and-white image (CCITT G4 in a PDF), a little
crooked — and nothing else (no text layer), in a few tens of KB. Deterministic: run it
again and the same file comes out (Pillow and DejaVu fonts as on Debian 12).

    .venv/bin/python scripts/sample_scan.py [OUT]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

DPI = 300
A4 = (2480, 3508)  # pixels at 300 dpi
FONTS = Path("/usr/share/fonts/truetype/dejavu")
OUT = Path(__file__).resolve().parents[1] / "samples" / "scan_0042.pdf"

LETTER = [
    ("head", "Northwind Office Supplies"),
    ("small", "12 Harbour Road, Bristol BS1 4QA  ·  orders@northwind.example"),
    ("gap", ""),
    ("text", "Invoice 2291                                              14 March 2024"),
    ("gap", ""),
    ("text", "Dear Ms Alvarez,"),
    ("gap", ""),
    ("text", "thank you for your order of 4 March. We have sent the following"),
    ("text", "items to your office on Station Street:"),
    ("gap", ""),
    ("text", "  - one toner cartridge, black, for the LaserPro 400         89.00"),
    ("text", "  - two packs of printer paper, A4, 500 sheets each          12.40"),
    ("text", "  - a box of archive folders, grey                            23.15"),
    ("gap", ""),
    ("text", "The total of 124.55 is payable within thirty days to the account"),
    ("text", "named below. Please quote the invoice number with your payment."),
    ("gap", ""),
    ("text", "If anything arrived damaged, reply to this letter or call us on"),
    ("text", "0117 496 0321 and we will replace it at no cost."),
    ("gap", ""),
    ("text", "Kind regards,"),
    ("gap", ""),
    ("text", "Jonathan Price, Accounts"),
]


def page() -> Image.Image:
    img = Image.new("L", A4, 255)
    draw = ImageDraw.Draw(img)
    fonts = {"head": ImageFont.truetype(str(FONTS / "DejaVuSerif-Bold.ttf"), 84),
             "small": ImageFont.truetype(str(FONTS / "DejaVuSans.ttf"), 38),
             "text": ImageFont.truetype(str(FONTS / "DejaVuSerif.ttf"), 50)}
    y = 260
    for kind, line in LETTER:
        if kind == "gap":
            y += 45
            continue
        draw.text((250, y), line, fill=0, font=fonts[kind])
        y += {"head": 120, "small": 80, "text": 78}[kind]
    draw.line((250, 470, A4[0] - 250, 470), fill=0, width=4)
    # the sheet went in a little crooked, as sheets do
    img = img.rotate(-0.6, resample=Image.Resampling.BICUBIC, fillcolor=255)
    return img.point(lambda v: 255 if v > 150 else 0).convert("1")


def main(out: Path = OUT) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    made = time.gmtime(1710408600)  # 2024-03-14 09:30 UTC, fixed: the same bytes each run
    page().save(out, "PDF", resolution=DPI, title="scan_0042", producer="scripts/sample_scan.py",
                creationDate=made, modDate=made)
    print(f"{out}: {out.stat().st_size} bytes")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT)
