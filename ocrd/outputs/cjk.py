"""Chinese and Japanese are written without spaces between words: which neighbouring
words of an OCR line join without one (Korean, written with spaces, is not among them).
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


def touches(left: str, right: str) -> bool:
    """Whether either word meets the other with a CJK character, where a space between
    them is a matter of how the page was written, not of the script's rules."""
    return bool(left and right) and (is_cjk(left[-1]) or is_cjk(right[0]))


def tight(left: str, right: str) -> bool:
    """Whether two neighbouring words are written without a space, when nothing else
    says so: both sides of the join are CJK characters."""
    return bool(left and right) and is_cjk(left[-1]) and is_cjk(right[0])
