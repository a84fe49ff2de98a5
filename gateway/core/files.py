"""Sizes of files in the words platforms use for their limits. Pure.

Platform limits are documented in decimal megabytes ("50 MB"), so the gateway counts them that way
(1 MB = 1,000,000 bytes): a file the gateway accepts is never just over a limit the platform counts
in binary megabytes.
"""

from __future__ import annotations

MB = 1_000_000
"""One megabyte as platform limits are stated (decimal)."""


def human_size(size: int) -> str:
    """``63.2 MB``, ``50 MB``, ``480 KB``, ``12 bytes``: a size for people (decimal units, like the limits)."""
    if size >= MB:
        return f"{size / MB:.1f}".removesuffix(".0") + " MB"
    if size >= 1000:
        return f"{size / 1000:.0f} KB"
    return f"{size} byte{'s' if size != 1 else ''}"
