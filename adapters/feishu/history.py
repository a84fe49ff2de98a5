"""Reading messages back from Feishu/Lark: open API message items -> ``ContextMessage`` values.

Feishu open API im/v1 (open.feishu.cn ``reference/im-v1/message/get`` and ``.../list``):
``GET /open-apis/im/v1/messages/{message_id}`` answers ``data.items`` = ``[Message]``;
``GET /open-apis/im/v1/messages?container_id_type=thread&container_id=omt_…`` lists a thread
(topic) ``page_size`` (1-50) at a time, ``sort_type`` ``ByCreateTimeAsc``/``ByCreateTimeDesc``,
``has_more`` + ``page_token`` for the next page. A Message has ``message_id``, ``msg_type``,
``create_time`` (ms), ``sender`` (``id``, ``id_type``, ``sender_type`` ``user``/``app``),
``body.content`` (the same JSON string as in events) and ``mentions`` (``key``, ``id`` as a
string, ``name``). Reading needs the bot in the chat and a message-read permission; without it the
API answers 99991672 (the scopes it needs) or 230027.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from adapters.feishu.inbound import Mention, _content_text
from gateway.core.types import Attachment, ContextMessage

PAGE_SIZE = 50
"""Messages per page of the thread list (Feishu's maximum)."""
MAX_PAGES = 10
"""Pages read at most per thread."""


def sender_open_id(item: Any) -> str:
    """The user's open_id of a message item (``""`` for an app, or another id type)."""
    sender = getattr(item, "sender", None)
    if sender is None or getattr(sender, "sender_type", None) != "user" or getattr(sender, "id_type", "open_id") \
            not in (None, "open_id"):
        return ""
    return str(getattr(sender, "id", "") or "")


def context_message(item: Any, *, bot_open_id: str, app_id: str, names: Mapping[str, str]) -> ContextMessage | None:
    """One lark ``Message`` as context, or ``None`` for a deleted or unreadable one (cards and
    other types the gateway does not read)."""
    if getattr(item, "deleted", False) or not getattr(item, "message_id", None):
        return None
    body = getattr(item, "body", None)
    try:
        content = json.loads(getattr(body, "content", None) or "{}")
    except (TypeError, ValueError):
        return None
    if not isinstance(content, dict):
        return None
    mentions = [Mention(str(m.key or ""), str(m.id or ""), str(m.name or ""))
                for m in getattr(item, "mentions", None) or ()]
    attachments: list[Attachment] = []
    text = _content_text(str(getattr(item, "msg_type", "") or ""), content, {m.key: m for m in mentions},
                         bot_open_id, attachments)
    if text is None or (not text and not attachments):
        return None
    sender = getattr(item, "sender", None)
    from_bot = getattr(sender, "sender_type", None) == "app" and getattr(sender, "id", None) == app_id
    open_id = sender_open_id(item)
    author = str(getattr(sender, "sender_name", None) or names.get(open_id) or open_id or "an app")
    try:
        sent_at = int(getattr(item, "create_time", 0) or 0) / 1000.0
    except (TypeError, ValueError, OverflowError):
        sent_at = 0.0
    return ContextMessage(str(item.message_id), text, "" if from_bot else author, sent_at, tuple(attachments),
                          from_bot)
