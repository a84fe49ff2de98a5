"""Typed shape of the Feishu/Lark events the gateway reads, checked before they are translated.

Feishu event subscription, schema 2.0 (open platform docs: "Receive message" ``im.message.receive_v1``,
"Card callback" ``card.action.trigger``, "Message content"): ``header`` (``event_id``, ``token``,
``event_type``, ``tenant_key``, ``create_time`` in milliseconds as a string), ``event.sender``,
``event.message`` (``message_id``, ``chat_id``, ``chat_type``, ``message_type``, ``thread_id``,
``mentions[]`` and ``content``: a JSON *string* whose shape depends on ``message_type``).
"""

from __future__ import annotations

from typing import Any

from adapters.wire import Id, Name, Text, UnreadableBody, WireModel, Word, check, load_json

RECEIVE_EVENT = "im.message.receive_v1"
CARD_ACTION_EVENT = "card.action.trigger"
Millis = Text | int
"""A timestamp in milliseconds: a string of digits as Feishu sends it (any value is accepted
here; one that is not a sensible time is replaced by the time of receipt)."""


class Header(WireModel):
    event_id: Id | None = None
    token: Text | None = None
    create_time: Millis | None = None
    event_type: Id | None = None
    tenant_key: Id | None = None
    app_id: Id | None = None


class Envelope(WireModel):
    header: Header | None = None
    event: dict[str, Any] | None = None


class UserIds(WireModel):
    open_id: Id | None = None
    union_id: Id | None = None
    user_id: Id | None = None


class Sender(WireModel):
    sender_id: UserIds | None = None
    sender_type: Word | None = None
    tenant_key: Id | None = None


class Mention(WireModel):
    key: Name | None = None
    id: UserIds | None = None
    name: Text | None = None
    tenant_key: Id | None = None


class Message(WireModel):
    message_id: Id
    chat_id: Id
    root_id: Id | None = None
    parent_id: Id | None = None
    thread_id: Id | None = None
    create_time: Millis | None = None
    chat_type: Word | None = None
    message_type: Word | None = None
    content: Text | None = None
    mentions: list[Mention] | None = None


class MessageEvent(WireModel):
    sender: Sender | None = None
    message: Message


class TextContent(WireModel):
    text: Text | None = None


class PostElement(WireModel):
    tag: Name | None = None
    text: Text | None = None
    href: Text | None = None
    style: list[Text] | None = None
    user_id: Id | None = None
    user_name: Text | None = None
    image_key: Id | None = None
    file_key: Id | None = None
    language: Name | None = None
    emoji_type: Name | None = None


class PostContent(WireModel):
    title: Text | None = None
    content: list[list[PostElement]] | None = None


class FileContent(WireModel):
    file_key: Id | None = None
    image_key: Id | None = None
    file_name: Text | None = None


CONTENT_MODELS: dict[str, type[WireModel]] = {
    "text": TextContent, "post": PostContent, "image": FileContent, "file": FileContent, "audio": FileContent,
    "media": FileContent, "sticker": FileContent,
}


class Operator(WireModel):
    open_id: Id | None = None
    user_id: Id | None = None
    union_id: Id | None = None
    tenant_key: Id | None = None


class CardValue(WireModel):
    """What the gateway's own buttons carry (``adapters.feishu.cards``: ``gw_cmd``, the thread, the chat type)."""

    gw_cmd: Text | None = None
    thread_id: Id | None = None
    chat_type: Word | None = None


class CardAction(WireModel):
    tag: Name | None = None
    value: CardValue | None = None


class CardContext(WireModel):
    open_message_id: Id | None = None
    open_chat_id: Id | None = None


class CardEvent(WireModel):
    operator: Operator | None = None
    token: Text | None = None
    action: CardAction | None = None
    context: CardContext | None = None


def event_id_of(body: Any) -> str | None:
    """``header.event_id`` when readable (for logs), else ``None``."""
    header = body.get("header") if isinstance(body, dict) else None
    value = header.get("event_id") if isinstance(header, dict) else None
    return value if isinstance(value, str) and len(value) <= 128 else None


def _content_problem(message: dict[str, Any]) -> str | None:
    model = CONTENT_MODELS.get(str(message.get("message_type")))
    if model is None or message.get("content") is None:
        return None  # an unsupported type is ignored by the translation, not refused
    try:
        content = load_json(message["content"])
    except UnreadableBody as exc:
        return f"event.message.content: {exc}"
    if not isinstance(content, dict):
        return "event.message.content: not a JSON object"
    if message.get("message_type") == "post" and "content" not in content:
        # the outbound locale shape ({"zh_cn": {...}}), accepted defensively by the translation
        content = next((v for v in content.values() if isinstance(v, dict) and "content" in v), {})
    problem = check(model, content)
    return f"event.message.content.{problem}" if problem is not None else None


def event_problem(body: Any) -> str | None:
    """``None`` when a decrypted event has the documented types for everything the gateway reads
    (the header always; the message and its content for ``im.message.receive_v1``; operator,
    action and context for ``card.action.trigger``), else a log-safe reason (no payload text)."""
    problem = check(Envelope, body)
    if problem is not None:
        return problem
    event_type = (body.get("header") or {}).get("event_type")
    models: dict[str, type[WireModel]] = {RECEIVE_EVENT: MessageEvent, CARD_ACTION_EVENT: CardEvent}
    model = models.get(str(event_type))
    if model is None:
        return None
    if body.get("event") is None:
        return "event: Field required"
    problem = check(model, body["event"])
    if problem is not None:
        return f"event.{problem}"
    return _content_problem(body["event"]["message"]) if model is MessageEvent else None
