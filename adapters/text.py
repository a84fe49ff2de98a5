"""Where a long reply may be cut into messages without splitting a character as the reader sees it
(pure; shared by the platform formatters).

A reader's character is an extended grapheme cluster (Unicode UAX #29, "Unicode Text
Segmentation"): a cut between two code points of one cluster shows two broken halves, e.g. the
family emoji 👨‍👩‍👧 as 👨‍👩‍ and 👧, the flag 🇺🇸 as the letters 🇺 and 🇸, ``é`` written as ``e`` +
U+0301 as ``e`` and a lone accent, 👍🏽 as 👍 and a colour swatch. The rules kept here are the ones a
cut in chat text can break: no break before an extending mark, a spacing mark, a zero-width joiner,
a variation selector, an emoji modifier or a tag character (GB9, GB9a), none after a zero-width
joiner (GB11, simplified to any following character), none inside a pair of regional indicators
(GB12, GB13), none inside a Hangul syllable written as jamo (GB6-GB8), none between CR and LF (GB3).
"""

from __future__ import annotations

import unicodedata

ZWJ = "\u200d"
_MAX_BACK = 64
"""A cluster longer than this (a pathological run of combining marks) is cut where asked."""


def _extends(ch: str) -> bool:
    """Grapheme_Cluster_Break Extend, SpacingMark or ZWJ: joins the character before it."""
    code = ord(ch)
    return (unicodedata.category(ch) in ("Mn", "Me", "Mc") or ch in (ZWJ, "\u200c")
            or 0xFE00 <= code <= 0xFE0F or 0x1F3FB <= code <= 0x1F3FF or 0xE0020 <= code <= 0xE007F)


def _regional(ch: str) -> bool:
    return 0x1F1E6 <= ord(ch) <= 0x1F1FF


def _hangul(ch: str) -> str:
    """Hangul_Syllable_Type: ``L``, ``V``, ``T``, ``LV``, ``LVT`` or ``""``."""
    code = ord(ch)
    if 0x1100 <= code <= 0x115F or 0xA960 <= code <= 0xA97C:
        return "L"
    if 0x1160 <= code <= 0x11A7 or 0xD7B0 <= code <= 0xD7C6:
        return "V"
    if 0x11A8 <= code <= 0x11FF or 0xD7CB <= code <= 0xD7FB:
        return "T"
    if 0xAC00 <= code <= 0xD7A3:
        return "LV" if (code - 0xAC00) % 28 == 0 else "LVT"
    return ""


def is_boundary(text: str, index: int) -> bool:
    """Whether cutting ``text`` before ``text[index]`` keeps every grapheme cluster whole."""
    if index <= 0 or index >= len(text):
        return True
    before, after = text[index - 1], text[index]
    if before == "\r" and after == "\n":
        return False
    if _extends(after) or before == ZWJ:
        return False
    if _regional(before) and _regional(after):
        run = 0
        while index - 1 - run >= 0 and _regional(text[index - 1 - run]):
            run += 1
        return run % 2 == 0
    left, right = _hangul(before), _hangul(after)
    if left == "L" and right in ("L", "V", "LV", "LVT"):
        return False
    if left in ("LV", "V") and right in ("V", "T"):
        return False
    return not (left in ("LVT", "T") and right == "T")


def safe_cut(text: str, index: int, floor: int = 0) -> int:
    """The largest index in ``(floor, index]`` that is a cluster boundary (``is_boundary``), looking
    back at most 64 code points; ``index`` itself when there is none (a cut must make progress)."""
    for candidate in range(index, max(floor, index - _MAX_BACK), -1):
        if is_boundary(text, candidate):
            return candidate
    return index
