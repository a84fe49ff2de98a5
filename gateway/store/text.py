"""Text every backend stores and every encoder accepts.

Two characters reach us from platforms and browsers that the rest of the path refuses: NUL
(PostgreSQL ``text`` refuses 0x00: "PostgreSQL text fields cannot contain NUL (0x00) bytes") and
lone UTF-16 surrogates (a JSON ``"\\ud83d"`` escape, half an emoji, decodes to one; UTF-8 cannot
encode it, so the model request, token counting and SQLite's text binding fail). Stored as they
came, either would fail the turn on every retry and block the conversation behind it.
"""

from __future__ import annotations

import dataclasses
import math
import re
import time
from typing import Any

from gateway.core.types import Attachment, ChatAddress, ContextMessage, InboundMessage, Sender

_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
MAX_NAME_CHARS = 255
"""Longest display name, username, file name or MIME type kept (the identities table's
``display_name`` column; PostgreSQL refuses a longer value)."""
LATEST_TIME = 253_402_300_799.0
"""The last second ``datetime`` can show (9999-12-31): later timestamps are not believed."""


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


def _clean(value: str | None, limit: int | None = None) -> str | None:
    if value is None:
        return None
    cleaned = storable_text(value)
    return cleaned[:limit] if limit is not None else cleaned


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2066-\u2069]")


def file_name(name: str | None) -> str | None:
    """A file name as data: control and bidi-override characters removed, path parts dropped,
    clipped to ``MAX_NAME_CHARS`` (``None`` for nothing left)."""
    if name is None:
        return None
    cleaned = _CONTROL.sub("", storable_text(name)).replace("\\", "/").rsplit("/", 1)[-1].strip()
    return cleaned[:MAX_NAME_CHARS] or None


def _storable_attachment(a: Attachment) -> Attachment:
    size = a.size if isinstance(a.size, int) and not isinstance(a.size, bool) and a.size >= 0 else None
    return dataclasses.replace(a, kind=storable_text(a.kind)[:32], file_id=storable_text(a.file_id),
                               name=file_name(a.name), mime_type=_clean(a.mime_type, MAX_NAME_CHARS),
                               url=_clean(a.url), sha256=_clean(a.sha256), size=size,
                               thumbnail_id=_clean(a.thumbnail_id))


def storable_inbound(message: InboundMessage) -> InboundMessage:
    """``message`` with every string made storable (``storable_text``: ids, tenant, names, text,
    command, file names and MIME types alike), names clipped to ``MAX_NAME_CHARS``, and a
    ``received_at`` that is not a finite time between 1970 and 9999 replaced by now.

    The gateway applies this to everything an adapter hands it, before the directory, the
    session key or the inbox see it: a lone surrogate in a Feishu tenant key or a Telegram display
    name would otherwise fail the database write, or the turn, on every retry.
    """
    address, sender = message.address, message.sender
    received_at = message.received_at
    if not (isinstance(received_at, int | float) and math.isfinite(received_at) and 0 <= received_at <= LATEST_TIME):
        received_at = time.time()
    return dataclasses.replace(
        message,
        address=ChatAddress(address.platform, storable_text(address.tenant), storable_text(address.chat_id),
                            _clean(address.thread_id)),
        message_id=storable_text(message.message_id),
        sender=Sender(storable_text(sender.user_id), _clean(sender.display_name, MAX_NAME_CHARS) or "",
                      _clean(sender.username, MAX_NAME_CHARS), sender.is_bot),
        text=storable_text(message.text),
        reply_to_id=_clean(message.reply_to_id),
        command=_clean(message.command),
        attachments=tuple(_storable_attachment(a) for a in message.attachments),
        received_at=float(received_at),
        event_id=_clean(message.event_id),
        quoted=storable_context(message.quoted) if message.quoted is not None else None,
        media_group_id=_clean(message.media_group_id),
    )


def storable_attachment(attachment: Attachment) -> Attachment:
    """``attachment`` with its handle, name and MIME type made storable (names clipped)."""
    return dataclasses.replace(attachment, file_id=storable_text(attachment.file_id),
                               name=_clean(attachment.name, MAX_NAME_CHARS),
                               mime_type=_clean(attachment.mime_type, MAX_NAME_CHARS))


def storable_context(message: ContextMessage) -> ContextMessage:
    """A context message (a quoted one, a thread's, a group's) with every string made storable, its
    author clipped to ``MAX_NAME_CHARS`` and a time outside 1970-9999 replaced by ``0.0`` (unknown)."""
    sent_at = message.sent_at
    if not (isinstance(sent_at, int | float) and math.isfinite(sent_at) and 0 <= sent_at <= LATEST_TIME):
        sent_at = 0.0
    return dataclasses.replace(
        message, message_id=storable_text(message.message_id), text=_clean(message.text),
        author=_clean(message.author, MAX_NAME_CHARS) or "", sent_at=float(sent_at),
        attachments=tuple(storable_attachment(a) for a in message.attachments))
