"""Secret redaction (issue 9): known secret values and token shapes become ``***``.

One ``Redactor`` serves the model side (tool results and user text before they enter the
transcript or a request) and the log side (``gateway.ops.logs.RedactSecrets``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

TOKEN_SHAPES: tuple[tuple[re.Pattern[str], str | Callable[[re.Match[str]], str]], ...] = (
    (re.compile(r"bot\d{5,}:[A-Za-z0-9_-]{20,}"), "bot***"),  # Telegram token in Bot API URLs
    (re.compile(r"\b\d{5,}:AA[A-Za-z0-9_-]{30,}"), "***"),  # a bare Telegram bot token
    (re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{6,}"), "xox*-***"),  # Slack bot/user tokens
    (re.compile(r"\bxapp-[A-Za-z0-9-]{6,}"), "xapp-***"),  # Slack app-level token
    (re.compile(r"\bsk-[A-Za-z0-9_-]{20,}"), "sk-***"),  # OpenAI-style API keys
    # A function, not the template r"\1***": templates are compiled by importing ``re`` at call
    # time, which fails while the interpreter shuts down (log records from finalizers).
    (re.compile(r"(?i)\b(authorization:\s*bearer\s+)[A-Za-z0-9._~+/=-]{12,}"), lambda m: m.group(1) + "***"),
    # The password of a URL's userinfo (RFC 3986 §3.2.1): a proxy or base URL, a database URL.
    (re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://[^\s:/?#@]+:)[^\s/?#@]+@"), lambda m: m.group(1) + "***@"),
)
MIN_SECRET_LEN = 6
"""Shorter configured values are not redacted (they would mangle ordinary words)."""


class Redactor:
    """Callable ``str -> str``.

    Args:
        secrets: exact values to remove (configured tokens, keys); longest replaced first.
        shapes: also remove ``TOKEN_SHAPES`` matches.
    """

    def __init__(self, secrets: Iterable[str] = (), shapes: bool = True) -> None:
        values = {s for s in secrets if s and len(s) >= MIN_SECRET_LEN}
        self.secrets = sorted(values, key=len, reverse=True)
        self.shapes = shapes

    def __call__(self, text: str) -> str:
        if not text:
            return text
        for secret in self.secrets:
            if secret in text:
                text = text.replace(secret, "***")
        if self.shapes:
            for pattern, replacement in TOKEN_SHAPES:
                text = pattern.sub(replacement, text)
        return text
