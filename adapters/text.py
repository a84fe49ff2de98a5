"""Where a long reply may be cut into messages without splitting a character as the reader sees it
(pure; shared by the platform formatters).

A reader's character is an extended grapheme cluster (Unicode UAX #29, "Unicode Text
Segmentation"): a cut between two code points of one cluster shows two broken halves, e.g. the
family emoji 👨‍👩‍👧 as 👨‍👩‍ and 👧, the flag 🇺🇸 as the letters 🇺 and 🇸, ``é`` written as ``e`` +
U+0301 as ``e`` and a lone accent, 👍🏽 as 👍 and a colour swatch. Clusters are found by the
``regex`` library's ``\\X`` (the full UAX #29 rules of its Unicode version), looking at most
``_MAX_BACK`` code points around the cut.
"""

from __future__ import annotations

import regex

_CLUSTER = regex.compile(r"\X", regex.DOTALL)
_MAX_BACK = 64
"""A cluster longer than this (a pathological run of combining marks) is cut where asked."""


def _boundaries(text: str, start: int, end: int) -> list[int]:
    """Cluster boundaries of ``text`` strictly inside ``(start, end)``, segmenting from ``start``
    (a window that starts inside a cluster only misplaces boundaries near ``start``)."""
    found = []
    for match in _CLUSTER.finditer(text, start, min(len(text), end + _MAX_BACK)):
        if match.start() >= end:
            break
        if match.start() > start:
            found.append(match.start())
    return found


def is_boundary(text: str, index: int) -> bool:
    """Whether cutting ``text`` before ``text[index]`` keeps every grapheme cluster whole."""
    if index <= 0 or index >= len(text):
        return True
    start = max(0, index - _MAX_BACK)
    return index in _boundaries(text, start, index + 1)


def safe_cut(text: str, index: int, floor: int = 0) -> int:
    """The largest index in ``(floor, index]`` that is a cluster boundary, looking back at most
    ``_MAX_BACK`` code points; ``index`` itself when there is none (a cut must make progress)."""
    if index >= len(text) or index <= floor:
        return index
    start = max(floor, index - _MAX_BACK)
    found = _boundaries(text, max(0, start - _MAX_BACK), index + 1)
    candidates = [b for b in found if start < b <= index]
    return candidates[-1] if candidates else index
