"""Logging set-up. Secrets never reach the logs: every record is passed through a filter that
masks the configured secret values (tokens appear in Telegram URLs, for example)."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable

_TELEGRAM_TOKEN = re.compile(r"bot\d{5,}:[A-Za-z0-9_-]{20,}")


class RedactSecrets(logging.Filter):
    """Replaces each known secret value, and anything shaped like a Telegram bot token, with ``***``."""

    def __init__(self, secrets: Iterable[str]) -> None:
        super().__init__()
        self._secrets = sorted({s for s in secrets if s and len(s) >= 6}, key=len, reverse=True)

    def _clean(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return _TELEGRAM_TOKEN.sub("bot***", text)

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        cleaned = self._clean(message)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        if record.exc_info and record.exc_text is None and record.exc_info[1] is not None:
            formatted = logging.Formatter().formatException(record.exc_info)
            record.exc_text = self._clean(formatted)
        return True


def setup_logging(level: str, secrets: Iterable[str]) -> None:
    """Configures the root logger (stderr, one line per record) with secret redaction."""
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(RedactSecrets(secrets))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # These log every request URL at INFO (Telegram URLs contain the token): keep them quiet.
    for noisy in ("httpx", "httpcore", "telegram.ext", "apscheduler", "alembic"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
