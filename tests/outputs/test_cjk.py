"""Chinese and Japanese are joined as written — no spaces between their characters,
spaces kept where the page has them between Latin words — and Korean words kept whole,
with the spaces between them, in the Markdown, in search and in the searchable PDF's
text layer. Real tesseract (Debian's tesseract-ocr-jpn, -chi-sim and -kor, scripts/test
installs them) on lines drawn here with Droid Sans Fallback (CJK), Nanum Gothic (Hangul)
and DejaVu Sans (Latin); poppler and PDFium read the PDF back.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pypdfium2 as pdfium
import pytest
from PIL import Image, ImageDraw, ImageFilter, ImageFont

from ocrd.engines import tesseract_tsv
from ocrd.web.search import Query, SearchIndex, plain_text

CJK_FONT = "/usr/share/fonts/truetype/droid/DroidSansFallbackFull.ttf"
HANGUL_FONT = "/usr/share/fonts/truetype/nanum/NanumGothic.ttf"
KOREAN = ["국회입법조사처장은 오늘 보고서를 발표했다.",
          "모든 국민은 법 앞에 평등하다.",
          "누구든지 성별 종교 또는 사회적 신분에"]
JAPANESE = ["日本語の文章です。東京と大阪の間を旅行します。",
            "山田さんは毎日八時に会社へ行きます。"]
CHINESE = ["中文文本识别测试，这是第二段。",
           "我们使用 Python 编程，价格是2024年3月的 ABC Company 报价。"]
_BETWEEN_CJK = re.compile(r"[\u3000-\u9fff\uff00-\uff60][ \t]+(?=[\u3000-\u9fff\uff00-\uff60])")


def cjk_image(lines: list[str], path: Path) -> Path:
    """Lines drawn character by character: CJK in one font, the rest in another."""
    wide = ImageFont.truetype(CJK_FONT, 44)
    latin = ImageFont.truetype("DejaVuSans.ttf", 42)
    img = Image.new("L", (1800, 140 + 100 * len(lines)), 255)
    draw = ImageDraw.Draw(img)
    for k, line in enumerate(lines):
        x = 80.0
        for ch in line:
            font = wide if ord(ch) >= 0x3000 else latin
            draw.text((x, 70 + 100 * k), ch, font=font, fill=0)
            x += draw.textlength(ch, font=font)
    img.save(path, dpi=(300, 300))
    return path


def korean_image(lines: list[str], path: Path, crisp: bool = False) -> Path:
    """Korean lines as a scanner gives them: slightly soft; or `crisp`, as a born-digital
    page is rendered (tesseract's automatic page layout finds no text on it at all)."""
    font = ImageFont.truetype(HANGUL_FONT, 40)
    img = Image.new("L", (2480, 300 + 80 * len(lines)), 255)
    draw = ImageDraw.Draw(img)
    for k, line in enumerate(lines):
        draw.text((200, 150 + 80 * k), line, font=font, fill=0)
    if not crisp:
        img = img.filter(ImageFilter.GaussianBlur(1.5))
    img.save(path, dpi=(300, 300))
    return path


def convert(tmp_path: Path, image: Path, lang: str) -> tuple[str, str, str]:
    """`ocrd convert --pdf -l LANG`: the Markdown, and the PDF's text as poppler and
    PDFium read it."""
    need = set(lang.split("+"))
    have = set(subprocess.run(["tesseract", "--list-langs"], capture_output=True,
                              text=True).stdout.split())
    if not (os.path.exists(CJK_FONT) and os.path.exists(HANGUL_FONT)) or not need <= have:
        pytest.fail(f"needs tesseract-ocr-{lang.replace('_', '-')}, fonts-droid-fallback and "
                    "fonts-nanum (scripts/test installs them)")
    r = subprocess.run([sys.executable, "-m", "ocrd", "convert", str(image), "-o", "out",
                        "--pdf", "-l", lang, "-q"], capture_output=True, text=True,
                       timeout=300, cwd=tmp_path, env={**os.environ, "OCRD_CONFIG": ""})
    assert r.returncode == 0, r.stderr
    out = tmp_path / "out"
    md = (out / f"{image.stem}.md").read_text()
    pdf = out / f"{image.stem}.pdf"
    poppler = subprocess.run(["pdftotext", str(pdf), "-"], capture_output=True, text=True,
                             check=True).stdout
    doc = pdfium.PdfDocument(pdf)
    try:
        page = doc[0]
        pdfium_text = page.get_textpage().get_text_range()
    finally:
        doc.close()
    return md, poppler, pdfium_text


@pytest.mark.e2e
def test_japanese_is_joined_as_written(tmp_path: Path) -> None:
    md, poppler, pdfium_text = convert(tmp_path, cjk_image(JAPANESE, tmp_path / "ja.png"),
                                       "jpn")
    for text in (md, poppler, pdfium_text):
        assert not _BETWEEN_CJK.search(text), text
        for line in JAPANESE:
            assert line in text.replace("\r\n", "\n").replace("\n", ""), text


@pytest.mark.e2e
def test_chinese_with_latin_words_keeps_the_spaces_it_has(tmp_path: Path) -> None:
    md, poppler, pdfium_text = convert(tmp_path, cjk_image(CHINESE, tmp_path / "zh.png"),
                                       "chi_sim")
    assert "中文文本识别测试，这是第二段。" in md
    assert "我们使用 Python 编程，价格是" in md  # spaces where the line has them ...
    assert "年3月的 ABC Company 报价。" in md  # ... and between Latin words
    for text in (poppler, pdfium_text):
        assert not _BETWEEN_CJK.search(text), text
        assert "中文文本识别测试，这是第二段。" in text
        assert "ABC Company" in text and "编程，价格是" in text


@pytest.mark.e2e
@pytest.mark.parametrize("lang", ["kor", "eng+kor"])
def test_korean_words_are_whole_with_the_spaces_between_them(tmp_path: Path, lang: str) -> None:
    """tesseract's TSV lists many Korean words syllable by syllable; the Markdown had
    "국 회 입 법 조 사 처 장 은", and search and the PDF's text layer those pieces. (With
    English first, tesseract's own text spaces every syllable too.)"""
    md, poppler, pdfium_text = convert(tmp_path, korean_image(KOREAN, tmp_path / "ko.png"),
                                       lang)
    for text in (md, poppler, pdfium_text):
        flat = " ".join(text.replace("\\\n", "\n").split())
        for line in KOREAN:
            assert line in flat, text
    index = SearchIndex(tmp_path / "search.sqlite3")
    index.add(1, "in", "ko.md", 1.0, [(1, plain_text(md))])
    for word in ("국회입법조사처장은", "평등하다", "누구든지"):
        hits, total = index.search(Query.parse(word))
        assert total == 1, word
        assert f"<mark>{word}</mark>" in hits[0].snippet, hits[0].snippet


@pytest.mark.e2e
@pytest.mark.parametrize("lang", ["kor", "eng+kor"])
def test_a_crisp_korean_page_is_read_whole_not_blank(tmp_path: Path, lang: str) -> None:
    """Crisp Hangul (a born-digital page rendered, a clean print scanned sharp): tesseract's
    automatic page layout reads nothing or stray strokes of it, and the page came out
    "blank". Read again as one column, every line is there, in the Markdown and the
    searchable PDF's text."""
    assert subprocess.run(["tesseract", str(korean_image(KOREAN, tmp_path / "check.png",
                                                             crisp=True)),
                           "-", "-l", lang, "--psm", "3"], capture_output=True,
                          text=True).stdout.count("국회") == 0  # the layout misses it
    md, poppler, pdfium_text = convert(
        tmp_path, korean_image(KOREAN, tmp_path / "crisp.png", crisp=True), lang)
    assert "(blank)" not in md
    for text in (md, poppler, pdfium_text):  # (tesseract misreads a word or two)
        assert hangul_recall(KOREAN, text) >= 0.85, text


def hangul_recall(lines: list[str], text: str) -> float:
    """Share of the lines' Hangul syllables that the text has (as a multiset)."""
    def syllables(t: str) -> Counter:
        return Counter(c for c in t if "\uac00" <= c <= "\ud7a3")
    want = syllables("".join(lines))
    return sum((want & syllables(text)).values()) / sum(want.values())


def test_hangul_syllables_join_by_tesseract_s_text_else_by_their_gaps() -> None:
    rows = [("국", 10, 40), ("회", 52, 40), ("입법", 94, 80), ("오늘", 200, 80),
            ("ABC", 300, 60), ("회사", 362, 80)]
    tsv = "level\tpage_num\tblock_num\tpar_num\tline_num\tword_num\tleft\ttop\twidth\t" \
          "height\tconf\ttext\n" + "".join(
              f"5\t1\t1\t1\t1\t{k + 1}\t{x}\t10\t{w}\t40\t95\t{t}\n"
              for k, (t, x, w) in enumerate(rows))
    reading = tesseract_tsv.read(tsv, "국회입법 오늘 ABC회사\n")
    assert tesseract_tsv.plain_text(reading) == "국회입법 오늘 ABC회사"
    assert [w.text for w in tesseract_tsv.layer_words(reading)] == ["국회입법", "오늘", "ABC회사"]
    # without the text: syllables that touch are one word, a gap of a space is a space
    assert tesseract_tsv.plain_text(tesseract_tsv.read(tsv)) == "국회입법 오늘 ABC 회사"


def test_spaces_follow_tesseract_s_text_only_where_cjk_is_involved() -> None:
    """The TSV lists every word apart; tesseract's text of the same run says where the
    page has spaces. Between two words of other scripts there is always one."""
    rows = [("東京", 10), ("と", 60), ("大阪", 90), ("ABC", 150), ("Company", 230),
            ("報告", 400)]
    tsv = "level\tpage_num\tblock_num\tpar_num\tline_num\tword_num\tleft\ttop\twidth\t" \
          "height\tconf\ttext\n" + "".join(
              f"5\t1\t1\t1\t1\t{k + 1}\t{x}\t10\t40\t40\t95\t{w}\n"
              for k, (w, x) in enumerate(rows))
    reading = tesseract_tsv.read(tsv, "東京と大阪 ABCCompany報告\n")
    assert tesseract_tsv.plain_text(reading) == "東京と大阪 ABC Company報告"
    words = [w.text for w in tesseract_tsv.layer_words(reading)]
    assert words == ["東京と大阪", "ABC", "Company報告"]
    # without the text (or when it does not match the TSV): no space between CJK only
    for text in ("", "something else entirely"):
        reading = tesseract_tsv.read(tsv, text)
        assert tesseract_tsv.plain_text(reading) == "東京と大阪 ABC Company 報告"


def test_the_output_splits_into_tsv_and_text() -> None:
    tsv = "level\tpage_num\tblock_num\tpar_num\tline_num\tword_num\tleft\ttop\twidth\t" \
          "height\tconf\ttext\n1\t1\t0\t0\t0\t0\t0\t0\t100\t100\t-1\t\n" \
          "5\t1\t1\t1\t1\t1\t0\t0\t10\t10\t96\tWort\n"
    assert tesseract_tsv.split(tsv + "Wort\n\f") == (tsv.rstrip("\n"), "Wort\n\f")
    assert tesseract_tsv.split("just text\n") == ("", "just text\n")
