"""Text every backend stores and every encoder accepts.

Two characters reach us from platforms and browsers that the rest of the path refuses: NUL
(PostgreSQL ``text`` refuses 0x00: "PostgreSQL text fields cannot contain NUL (0x00) bytes") and
lone UTF-16 surrogates (a JSON ``"\\ud83d"`` escape, half an emoji, decodes to one; UTF-8 cannot
encode it, so the model request, token counting and SQLite's text binding fail). Stored as they
came, either would fail the turn on every retry and block the conversation behind it.
"""

from __future__ import annotations

import re
from typing import Any

_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def _replace(match: re.Match[str]) -> str:
    return "" if match.group() == "\x00" else "\ufffd"


def storable_text(text: str) -> str:
    """``text`` with NUL removed and each lone surrogate replaced by U+FFFD (else unchanged)."""
    return _UNSTORABLE.sub(_replace, text) if _UNSTORABLE.search(text) else text


def storable(value: Any) -> Any:
    """``storable_text`` applied to every string (keys included) of a JSON-shaped value."""
    if isinstance(value, str):
        return storable_text(value)
    if isinstance(value, dict):
        return {storable(k): storable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [storable(v) for v in value]
    return value
