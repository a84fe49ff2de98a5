"""Logging set-up. Secrets never reach the logs or stderr: every record is passed through a filter
that masks the configured secret values (tokens appear in Telegram URLs, for example), and the
other ways Python writes to stderr (uncaught exceptions in the main thread and in other threads,
"Exception ignored in ..." from finalizers, the asyncio loop's exception handler, warnings) are
routed through that same logging handler by ``install_hooks``."""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
from collections.abc import Iterable
from types import TracebackType
from typing import Any

from agent.redact import Redactor

log = logging.getLogger("gateway")

UNCHECKED = "(log record withheld: it could not be checked for secrets)"
"""What a record becomes when redacting it failed (e.g. during interpreter shutdown)."""


class RedactSecrets(logging.Filter):
    """Replaces each known secret value, and anything shaped like a token (Telegram
    ``bot<digits>:<secret>``, Slack ``xoxb-``/``xapp-``, ``sk-`` API keys), with ``***``: in the
    message, the formatted traceback and the stack. Never raises: a record that cannot be checked
    (interpreter shutdown, a broken ``__repr__`` in its arguments) is replaced by ``UNCHECKED``."""

    def __init__(self, secrets: Iterable[str]) -> None:
        super().__init__()
        self._clean = Redactor(secrets)

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
            cleaned = self._clean(message)
            if cleaned != message:
                record.msg, record.args = cleaned, None
            if record.exc_info and record.exc_text is None and record.exc_info[1] is not None:
                formatted = logging.Formatter().formatException(record.exc_info)
                record.exc_text = self._clean(formatted)
            if record.stack_info:
                record.stack_info = self._clean(record.stack_info)
        except Exception:
            record.msg, record.args, record.exc_info, record.exc_text, record.stack_info = \
                UNCHECKED, None, None, None, None
        return True


class BadRequestsBriefly(logging.Filter):
    """For ``aiohttp.server``: a request the HTTP parser refused (a request line or header over
    8 KB, a malformed line: the client got its 400 already) becomes one WARNING line naming the
    error, not an ERROR with a traceback. Other records pass unchanged."""

    def filter(self, record: logging.LogRecord) -> bool:
        from aiohttp.http_exceptions import HttpProcessingError

        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, HttpProcessingError):
            reason = " ".join(str(error.message).split())[:120]
            record.msg, record.args = f"{record.getMessage()}: {error.code} {type(error).__name__} ({reason})", None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            record.exc_info, record.exc_text = None, None
        return True


class _RedactedStreamHandler(logging.StreamHandler):
    """A stderr handler whose own failures print one plain line (the standard ``handleError``
    prints the record's unredacted message and arguments)."""

    def handleError(self, record: logging.LogRecord) -> None:
        try:
            error = sys.exc_info()[1]
            self.stream.write(f"logging error in {record.name}: {type(error).__name__}\n")
        except Exception:
            pass


def setup_logging(level: str, secrets: Iterable[str], tag: str | None = None) -> None:
    """Configures the root logger (stderr, one line per record) with secret redaction; ``tag``
    (e.g. ``w2``, a worker of ``gateway run --workers N``) goes in brackets before each logger name."""
    handler = _RedactedStreamHandler()
    prefix = f"[{tag}] " if tag else ""
    handler.setFormatter(logging.Formatter(f"%(asctime)s %(levelname)s {prefix}%(name)s: %(message)s"))
    handler.addFilter(RedactSecrets(secrets))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # These log every request URL at INFO (Telegram URLs contain the token): keep them quiet.
    # (openai 3.x ships its own httpx fork, ``httpx2``/``httpcore2``.)
    for noisy in ("httpx", "httpcore", "httpx2", "httpcore2", "telegram.ext", "apscheduler", "alembic"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    quiet_bad_requests()


def quiet_bad_requests() -> None:
    """Installs ``BadRequestsBriefly`` on ``aiohttp.server`` (once)."""
    server = logging.getLogger("aiohttp.server")
    if not any(isinstance(f, BadRequestsBriefly) for f in server.filters):
        server.addFilter(BadRequestsBriefly())


def install_hooks() -> None:
    """Routes every other path to stderr through the logging handler (and so the redaction):
    ``sys.excepthook``, ``threading.excepthook``, ``sys.unraisablehook`` and ``warnings``
    (``logging.captureWarnings``). Call after ``setup_logging``; for the asyncio loop use
    ``loop.set_exception_handler(loop_exception_handler)`` once it runs."""
    sys.excepthook = _excepthook
    threading.excepthook = _thread_excepthook
    sys.unraisablehook = _unraisablehook
    logging.captureWarnings(True)


def _excepthook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
    if issubclass(kind, KeyboardInterrupt):
        return
    log.critical("uncaught exception, exiting", exc_info=(kind, value, tb))


def _thread_excepthook(args: threading.ExceptHookArgs) -> None:
    if args.exc_type is SystemExit:
        return
    name = args.thread.name if args.thread is not None else "?"
    log.error("uncaught exception in thread %s", name,
              exc_info=(args.exc_type, args.exc_value, args.exc_traceback))  # type: ignore[arg-type]


def _unraisablehook(unraisable: Any) -> None:
    what = unraisable.err_msg or "Exception ignored in"
    exc = unraisable.exc_value
    log.warning("%s: %r", what, unraisable.object,
                exc_info=(unraisable.exc_type, exc, unraisable.exc_traceback) if exc is not None else None)


def loop_exception_handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """An asyncio exception handler (``loop.set_exception_handler``) that logs the context through
    the redacting handler: ``message``, the other keys' reprs, and the exception's traceback."""
    exc = context.get("exception")
    details = "; ".join(f"{key}={value!r}" for key, value in context.items() if key not in ("message", "exception"))
    log.error("asyncio: %s%s", context.get("message") or "unhandled error", f" ({details})" if details else "",
              exc_info=(type(exc), exc, exc.__traceback__) if isinstance(exc, BaseException) else None)
