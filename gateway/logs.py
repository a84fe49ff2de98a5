"""Logging set-up. Secrets never reach the logs: every record is passed through a filter that
masks the configured secret values (tokens appear in Telegram URLs, for example)."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from agent.redact import Redactor


class RedactSecrets(logging.Filter):
    """Replaces each known secret value, and anything shaped like a token (Telegram
    ``bot<digits>:<secret>``, Slack ``xoxb-``/``xapp-``, ``sk-`` API keys), with ``***``."""

    def __init__(self, secrets: Iterable[str]) -> None:
        super().__init__()
        self._clean = Redactor(secrets)

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
    # (openai 3.x ships its own httpx fork, ``httpx2``/``httpcore2``.)
    for noisy in ("httpx", "httpcore", "httpx2", "httpcore2", "telegram.ext", "apscheduler", "alembic"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
