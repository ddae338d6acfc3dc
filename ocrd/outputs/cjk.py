"""Chinese and Japanese are written without spaces between words: which neighbouring
words of an OCR line join without one. Korean is written with spaces between its words,
but an OCR engine may list a word's syllables apart (tesseract's TSV does): there the
page's own spacing decides too, never the rule "a space between any two words".
"""

from __future__ import annotations

# Han ideographs, kana, CJK symbols and punctuation, Bopomofo, fullwidth forms: the
# characters that run on without spaces in Chinese and Japanese text.
_RANGES = (
    (0x2E80, 0x2FDF),  # radicals
    (0x3000, 0x303F),  # CJK symbols and punctuation (、。「」…)
    (0x3040, 0x30FF),  # hiragana, katakana
    (0x3100, 0x312F),  # bopomofo
    (0x31A0, 0x31FF),  # bopomofo extended, katakana phonetic extensions
    (0x3400, 0x4DBF),  # extension A
    (0x4E00, 0x9FFF),  # unified ideographs
    (0xF900, 0xFAFF),  # compatibility ideographs
    (0xFE30, 0xFE4F),  # compatibility forms
    (0xFF00, 0xFF60),  # fullwidth ASCII and punctuation (，！？：)
    (0xFF61, 0xFF9F),  # halfwidth katakana
    (0x20000, 0x3134F),  # extensions B-G
)


def is_cjk(ch: str) -> bool:
    """Whether the character belongs to text written without spaces."""
    code = ord(ch)
    return any(lo <= code <= hi for lo, hi in _RANGES)


# Hangul: syllables, jamo and their compatibility forms.
_HANGUL = ((0x1100, 0x11FF), (0x3130, 0x318F), (0xA960, 0xA97F), (0xAC00, 0xD7AF),
           (0xD7B0, 0xD7FF), (0xFFA0, 0xFFDC))


def is_hangul(ch: str) -> bool:
    code = ord(ch)
    return any(lo <= code <= hi for lo, hi in _HANGUL)


def touches(left: str, right: str) -> bool:
    """Whether either word meets the other with a CJK or Hangul character, where a space
    between them is a matter of how the page was written, not of the script's rules."""
    if not (left and right):
        return False
    return any(is_cjk(c) or is_hangul(c) for c in (left[-1], right[0]))


def hangul_join(left: str, right: str) -> bool:
    """Whether two neighbouring words meet with Hangul on both sides (Korean: spaced
    between words, not between the syllables of one)."""
    return bool(left and right) and is_hangul(left[-1]) and is_hangul(right[0])


def tight(left: str, right: str) -> bool:
    """Whether two neighbouring words are written without a space, when nothing else
    says so: both sides of the join are CJK characters."""
    return bool(left and right) and is_cjk(left[-1]) and is_cjk(right[0])
