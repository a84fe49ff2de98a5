"""Typed shape of the Telegram updates the gateway reads, checked before ``Update.de_json``.

python-telegram-bot builds objects from whatever JSON it is given (an integer ``text`` stays an
integer, a string chat id stays a string), so a malformed update would reach the gateway and fail
later, on every delivery attempt. ``update_problem`` refuses it at the door instead.

Telegram Bot API types (https://core.telegram.org/bots/api#available-types): ``Update``,
``Message``, ``Chat``, ``User``, ``MessageEntity`` (offsets and lengths in UTF-16 units),
``PhotoSize``/``Document``/``Audio``/``Voice``/``Video``/``Sticker``, ``TextQuote`` (the quoted
part of a reply), ``CallbackQuery``. Ids of
users and chats "have at most 52 significant bits"; dates are Unix time.
"""

from __future__ import annotations

import copy
import json
import logging
from typing import Annotated, Any

from pydantic import Field
from telegram import Update as SdkUpdate

from adapters.wire import Id, LongName, Name, Text, UnreadableBody, WireModel, Word, check, load_json

log = logging.getLogger("adapters.telegram")

TelegramId = Annotated[int, Field(ge=-(2**53), le=2**53)]
"""A user, chat, message, topic or update id (at most 52 significant bits)."""
UnixTime = Annotated[int, Field(ge=0, le=253_402_300_799)]
"""Seconds since the epoch, up to the year 9999 (what ``datetime`` can hold)."""
Units = Annotated[int, Field(ge=0, le=2**31)]
"""A UTF-16 offset or length."""
FileId = LongName


class User(WireModel):
    id: TelegramId
    is_bot: bool
    first_name: Text
    last_name: Text | None = None
    username: Text | None = None


class Chat(WireModel):
    id: TelegramId
    type: Word
    title: Text | None = None
    username: Text | None = None
    first_name: Text | None = None
    last_name: Text | None = None
    is_forum: bool | None = None


class Entity(WireModel):
    type: Name
    offset: Units
    length: Units
    url: Text | None = None
    user: User | None = None
    language: Text | None = None


class File(WireModel):
    file_id: FileId
    file_unique_id: FileId | None = None
    file_size: Annotated[int, Field(ge=0)] | None = None
    file_name: Text | None = None
    mime_type: Text | None = None


class PhotoSize(File):
    width: Annotated[int, Field(ge=0)]
    height: Annotated[int, Field(ge=0)]


class TextQuote(WireModel):
    text: Text
    entities: list[Entity] | None = None
    position: Units
    is_manual: bool | None = None


class Message(WireModel):
    message_id: TelegramId
    date: UnixTime
    chat: Chat
    from_: User | None = Field(None, alias="from")
    message_thread_id: TelegramId | None = None
    is_topic_message: bool | None = None
    text: Text | None = None
    caption: Text | None = None
    entities: list[Entity] | None = None
    caption_entities: list[Entity] | None = None
    reply_to_message: Message | None = None
    quote: TextQuote | None = None
    external_reply: dict[str, Any] | None = None
    edit_date: UnixTime | None = None
    photo: list[PhotoSize] | None = None
    document: File | None = None
    audio: File | None = None
    voice: File | None = None
    video: File | None = None
    sticker: File | None = None


class CallbackQuery(WireModel):
    id: Id
    from_: User = Field(alias="from")
    message: Message | None = None
    data: Text | None = None
    chat_instance: Text | None = None


class ChatMember(WireModel):
    status: Word
    user: User


class ChatMemberUpdated(WireModel):
    """The bot's own membership changed (added, promoted, removed): Bot API ``ChatMemberUpdated``."""

    chat: Chat
    from_: User = Field(alias="from")
    date: UnixTime
    old_chat_member: ChatMember
    new_chat_member: ChatMember


class Update(WireModel):
    """The update kinds the gateway subscribes to (``allowed_updates``) or may be sent."""

    update_id: Annotated[int, Field(ge=0, le=2**53)]
    message: Message | None = None
    edited_message: Message | None = None
    channel_post: Message | None = None
    edited_channel_post: Message | None = None
    callback_query: CallbackQuery | None = None
    my_chat_member: ChatMemberUpdated | None = None


def update_id_of(data: Any) -> int | None:
    """The update's ``update_id`` when it is an integer (for logs, and to confirm its offset even
    when it is out of range), else ``None``."""
    value = data.get("update_id") if isinstance(data, dict) else None
    return value if type(value) is int and value >= 0 else None


def update_problem(data: Any) -> str | None:
    """``None`` when ``data`` (a decoded webhook body or ``Update.to_dict()``) has the documented
    types for every field the gateway reads, else a log-safe reason (no payload text)."""
    return check(Update, data)


def _sdk_problem(item: dict[str, Any]) -> str | None:
    """Why python-telegram-bot cannot build this (well-typed) update, e.g. a sticker without its
    size: ``None`` when it can."""
    try:
        SdkUpdate.de_json(copy.deepcopy(item), None)
    except Exception as exc:
        return f"not accepted by the SDK: {type(exc).__name__}"
    return None


def checked_updates(body: bytes) -> bytes:
    """A ``getUpdates`` answer with every update that fails ``update_problem`` (or that the SDK
    cannot build) logged once at WARNING and replaced by ``{"update_id": N}``: python-telegram-bot
    parses a batch all or nothing, so one malformed update would fail every poll; the placeholder
    is an update with nothing in it, ignored, and its offset confirmed like any other. Other
    answers are returned as they came (PTB reports their errors)."""
    try:
        data = load_json(body)
    except UnreadableBody:
        return body
    result = data.get("result") if isinstance(data, dict) and data.get("ok") is True else None
    if not isinstance(result, list):
        return body
    kept, changed = [], False
    for item in result:
        problem = update_problem(item) or _sdk_problem(item)
        if problem is None:
            kept.append(item)
            continue
        changed, update_id = True, update_id_of(item)
        log.warning("telegram update %s unreadable (%s); acknowledged and dropped", update_id, problem)
        if update_id is not None:
            kept.append({"update_id": update_id})
    return json.dumps({**data, "result": kept}).encode() if changed else body
