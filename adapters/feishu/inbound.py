"""Pure inbound translation: a Feishu/Lark schema 2.0 event -> ``InboundMessage`` or a reason to ignore it.

Rules (PLATFORMS.md §3.2; Feishu open platform: im/v1 message receive_v1 event and "message content"):
- only ``im.message.receive_v1`` produces messages; recalls and every other event type are ignored;
- ``message.content`` is a JSON *string*: text ``{"text"}``, post ``{"title", "content": [[element]]}``
  (no locale key inbound), image ``{"image_key"}``, file ``{"file_key", "file_name"}``, audio
  ``{"file_key", "duration"}``, media (video) ``{"file_key", "image_key", "file_name"}``,
  sticker ``{"file_key"}``;
- mention placeholders ``@_user_N`` map to ``message.mentions[]``: the bot's own (``id.open_id`` equal
  to the bot's open_id from ``GET /open-apis/bot/v3/info``) is removed, others become ``@Name``;
  ``@_all`` becomes ``@all``;
- ``chat_type`` ``p2p`` is a DM; in groups the bot answers only when mentioned, except inside a thread
  (``thread_id``, topics) whose conversation the bot is already part of (``addressed=False``);
- ``sender_type`` other than ``user`` (apps, bots, the bot itself) is ignored;
- the dedupe id is ``message_id`` (Feishu re-pushes a message under a new ``event_id`` after reconnects);
- a reply names the message it replies to (``parent_id``) as ``quoted``, id only: the adapter reads it
  (``GET /open-apis/im/v1/messages/{message_id}``) when the turn needs it;
- with ``ambient`` (group context configured), a group message outside threads that does not
  mention the bot becomes a ``context_only`` message instead of being ignored (Feishu delivers those
  only to apps with the "read all group messages" permission).

Attachments carry the resource key as ``file_id``; download it later with
``GET /open-apis/im/v1/messages/{message_id}/resources/{file_id}?type=image|file``.
"""

from __future__ import annotations

import json
import mimetypes
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gateway.core.types import Attachment, ChatAddress, ContextMessage, InboundMessage, Sender

RECEIVE_EVENT = "im.message.receive_v1"
FEISHU_LANGUAGE = "zh"
"""The language hint of every Feishu message: message events carry no sender locale, and Feishu's
users mostly write Chinese (a user's ``/language en`` still wins)."""
_PLACEHOLDER = re.compile(r"@_user_\d+|@_all")
_SPACES = re.compile(r"[ \t]{2,}")
_POST_STYLES = {"bold": "**", "italic": "*", "lineThrough": "~~"}


@dataclass(frozen=True, slots=True)
class Ignored:
    """Why an event produces no turn (``recalled``, ``not_addressed``, ``from_bot``, ...)."""

    reason: str


@dataclass(frozen=True, slots=True)
class Mention:
    """A user mentioned in a message: placeholder ``key`` (``@_user_1``), ``open_id`` and display ``name``."""

    key: str
    open_id: str
    name: str


def parse_mentions(message: Mapping[str, Any]) -> list[Mention]:
    """``message.mentions[]`` as ``Mention`` values, in order (missing fields become ``""``)."""
    found = []
    for item in message.get("mentions") or ():
        ids = item.get("id") or {}
        found.append(Mention(str(item.get("key") or ""), str(ids.get("open_id") or ""), str(item.get("name") or "")))
    return found


def _replace_placeholders(text: str, by_key: Mapping[str, Mention], bot_open_id: str) -> str:
    def sub(match: re.Match[str]) -> str:
        key = match.group(0)
        if key == "@_all":
            return "@all"
        mention = by_key.get(key)
        if mention is None:
            return key
        if mention.open_id and mention.open_id == bot_open_id:
            return ""
        return f"@{mention.name or mention.open_id}"

    return _PLACEHOLDER.sub(sub, text)


def _post_element(element: Mapping[str, Any], by_key: Mapping[str, Mention], bot_open_id: str,
                  attachments: list[Attachment]) -> str:
    """One post element as Markdown-ish text; images and media become attachments."""
    tag = element.get("tag")
    if tag == "text":
        text = str(element.get("text") or "")
        for style in element.get("style") or ():
            marker = _POST_STYLES.get(style)
            if marker and text.strip():
                text = f"{marker}{text}{marker}"
        return text
    if tag == "a":
        label, href = str(element.get("text") or ""), str(element.get("href") or "")
        return f"[{label or href}]({href})" if href else label
    if tag == "at":
        key = str(element.get("user_id") or "")
        mention = by_key.get(key)
        if key == "@_all" or key == "all":
            return "@all"
        if mention is not None:
            return "" if mention.open_id == bot_open_id else f"@{mention.name or mention.open_id}"
        if key == bot_open_id:
            return ""
        return f"@{element.get('user_name') or key}"
    if tag == "img":
        if element.get("image_key"):
            attachments.append(Attachment("image", str(element["image_key"])))
        return ""
    if tag == "media":
        if element.get("file_key"):
            attachments.append(Attachment("video", str(element["file_key"])))
        return ""
    if tag == "code_block":
        language = str(element.get("language") or "").lower()
        return f"\n```{language}\n{str(element.get('text') or '').rstrip()}\n```\n"
    if tag == "hr":
        return "---"
    if tag == "emotion":
        return f":{element.get('emoji_type', '')}:"
    if tag == "md":
        return _replace_placeholders(str(element.get("text") or ""), by_key, bot_open_id)
    return str(element.get("text") or "")


def flatten_post(content: Mapping[str, Any], by_key: Mapping[str, Mention], bot_open_id: str,
                 attachments: list[Attachment]) -> str:
    """A post's ``title`` and paragraphs as text, one line per paragraph (empty lines dropped).

    Styles become Markdown (``**bold**``, ``*italic*``, ``~~strike~~``), links ``[text](href)``,
    mentions ``@Name`` (the bot's own removed); images are appended to ``attachments``. Accepts the
    inbound shape ``{"title", "content"}`` and, defensively, the outbound ``{"zh_cn": {...}}`` one.
    """
    if "content" not in content:
        locale = next((v for v in content.values() if isinstance(v, Mapping) and "content" in v), None)
        content = locale or {}
    lines = [str(content.get("title") or "").strip()]
    for paragraph in content.get("content") or ():
        if not isinstance(paragraph, list):
            continue
        elements = (el for el in paragraph if isinstance(el, Mapping))
        line = "".join(_post_element(el, by_key, bot_open_id, attachments) for el in elements)
        lines.append(_SPACES.sub(" ", line).strip())
    return "\n".join(line for line in lines if line)


def _seconds(ms: Any) -> float | None:
    """Feishu durations are milliseconds."""
    return ms / 1000 if isinstance(ms, int | float) and not isinstance(ms, bool) else None


def _content_text(message_type: str, content: Mapping[str, Any], by_key: Mapping[str, Mention], bot_open_id: str,
                  attachments: list[Attachment]) -> str | None:
    """Text and attachments of one message; ``None`` for an unsupported type."""
    if message_type == "text":
        return _SPACES.sub(" ", _replace_placeholders(str(content.get("text") or ""), by_key, bot_open_id)).strip()
    if message_type == "post":
        return flatten_post(content, by_key, bot_open_id, attachments)
    if message_type == "image":
        attachments.append(Attachment("image", str(content.get("image_key") or "")))
        return ""
    if message_type == "file":
        name = content.get("file_name")
        mime = mimetypes.guess_type(str(name))[0] if name else None
        kind = "image" if mime in ("image/jpeg", "image/png", "image/gif", "image/webp") else "document"
        attachments.append(Attachment(kind, str(content.get("file_key") or ""), name, mime))
        return ""
    if message_type == "audio":  # a voice message recorded in the client (Opus)
        attachments.append(Attachment("voice", str(content.get("file_key") or ""), None, "audio/opus",
                                      duration_s=_seconds(content.get("duration"))))
        return ""
    if message_type == "media":  # a video, with its cover image
        cover = content.get("image_key")
        attachments.append(Attachment("video", str(content.get("file_key") or ""), content.get("file_name"),
                                      "video/mp4", duration_s=_seconds(content.get("duration")),
                                      thumbnail_id=str(cover) if cover else None))
        return ""
    if message_type == "sticker":  # Feishu's resource API does not serve stickers: described only
        attachments.append(Attachment("sticker", str(content.get("file_key") or "")))
        return ""
    return None


def _command(text: str) -> str | None:
    """``/name`` at the start of the text (after the bot's mention was removed), lower-cased."""
    if not text.startswith("/") or len(text) < 2:
        return None
    name = text[1:].split(maxsplit=1)[0] if text[1:].strip() else ""
    return name.lower() or None


def to_inbound(body: Mapping[str, Any], bot_open_id: str, *, ambient: bool = False) -> InboundMessage | Ignored:
    """Normalizes one decrypted schema 2.0 event body (``{"schema", "header", "event"}``).

    Args:
        body: the event as Feishu sends it (webhook after decryption, or a long-connection payload).
        bot_open_id: the bot's own ``open_id`` (``GET /open-apis/bot/v3/info``).
        ambient: return a group message outside threads that does not mention the bot as a
            ``context_only`` message (kept as group context) instead of ``Ignored("not_addressed")``.

    Returns:
        The message, or ``Ignored(reason)``. Pure: no I/O, no clock (time comes from the event).
    """
    header = body.get("header") or {}
    event_type = header.get("event_type")
    if event_type == "im.message.recalled_v1":
        return Ignored("recalled")
    if event_type != RECEIVE_EVENT:
        return Ignored(f"unsupported_event:{event_type}")
    event = body.get("event") or {}
    sender = event.get("sender") or {}
    message = event.get("message") or {}
    sender_open_id = str((sender.get("sender_id") or {}).get("open_id") or "")
    if sender.get("sender_type", "user") != "user" or (sender_open_id and sender_open_id == bot_open_id):
        return Ignored("from_bot")
    message_id = str(message.get("message_id") or "")
    chat_id = str(message.get("chat_id") or "")
    if not message_id or not chat_id:
        return Ignored("malformed")

    try:
        content = json.loads(message.get("content") or "{}")
    except (TypeError, ValueError):
        return Ignored("malformed_content")
    if not isinstance(content, dict):
        return Ignored("malformed_content")
    mentions = parse_mentions(message)
    by_key = {m.key: m for m in mentions}
    attachments: list[Attachment] = []
    text = _content_text(str(message.get("message_type") or ""), content, by_key, bot_open_id, attachments)
    if text is None:
        return Ignored(f"unsupported_message_type:{message.get('message_type')}")
    if not text and not attachments:
        return Ignored("empty")

    is_dm = message.get("chat_type") == "p2p"
    thread_id = str(message.get("thread_id") or "") or None
    mentioned = any(m.open_id == bot_open_id for m in mentions) if bot_open_id else False
    if not is_dm and not mentioned and thread_id is None and not ambient:
        return Ignored("not_addressed")

    tenant = str(header.get("tenant_key") or sender.get("tenant_key") or "")
    created_ms = message.get("create_time") or header.get("create_time") or 0
    try:
        received_at = int(created_ms) / 1000.0
    except (TypeError, ValueError, OverflowError):  # not a number, or too large for a float
        received_at = 0.0
    command = _command(text)  # as on every platform: the command apart, its arguments as the text
    return InboundMessage(
        address=ChatAddress("feishu", tenant, chat_id, thread_id),
        message_id=message_id,
        chat_type="dm" if is_dm else "group",
        sender=Sender(sender_open_id, "", None, False),
        text=text[1 + len(command):].strip() if command else text,
        reply_to_id=None if is_dm and thread_id is None else message_id,
        command=command,
        attachments=tuple(attachments),
        received_at=received_at,
        event_id=str(header.get("event_id") or "") or None,
        addressed=is_dm or mentioned,
        language=FEISHU_LANGUAGE,
        quoted=ContextMessage(parent_id) if (parent_id := str(message.get("parent_id") or "")) else None,
        context_only=not is_dm and not mentioned and thread_id is None,
    )
