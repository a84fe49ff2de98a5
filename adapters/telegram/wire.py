"""Typed shape of the Telegram updates the gateway reads: ``update_problem`` checks a decoded
update (a webhook body or one item of a ``getUpdates`` result) before anything reads it.

``adapters.telegram.inbound`` and ``TelegramAdapter._dispatch`` read the checked dict itself (no
python-telegram-bot objects are built from updates), so every field they read is declared here with
its documented JSON type, and the fields the Bot API marks as required among those are required
(e.g. a sticker's ``width``, ``height``, ``is_animated`` and ``is_video``). A malformed update is
refused at the door, logged once and acknowledged, instead of failing later on every delivery
attempt. Fields nobody reads are not declared and may hold anything.

Telegram Bot API types (https://core.telegram.org/bots/api#available-types): ``Update``,
``Message``, ``Chat``, ``User``, ``MessageEntity`` (offsets and lengths in UTF-16 code units),
``PhotoSize``/``Animation``/``Document``/``Audio``/``Voice``/``Video``/``VideoNote``/``Sticker``,
``TextQuote`` (the quoted part of a reply), ``ExternalReplyInfo`` and ``MessageOrigin`` (a reply to
a message of another chat), ``CallbackQuery``, ``ChatMemberUpdated``. Ids of users and chats "have
at most 52 significant bits"; dates are Unix time; durations are seconds.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field

from adapters.wire import Id, LongName, Name, Text, WireModel, Word, check

TelegramId = Annotated[int, Field(ge=-(2**53), le=2**53)]
"""A user, chat, message, topic or update id (at most 52 significant bits)."""
UnixTime = Annotated[int, Field(ge=0, le=253_402_300_799)]
"""Seconds since the epoch, up to the year 9999 (what ``datetime`` can hold)."""
Units = Annotated[int, Field(ge=0, le=2**31)]
"""A UTF-16 offset or length."""
Count = Annotated[int, Field(ge=0)]
"""Bytes, pixels or seconds."""
FileId = LongName


class User(WireModel):
    id: TelegramId
    is_bot: bool
    first_name: Text
    last_name: Text | None = None
    username: Text | None = None
    language_code: Text | None = None
    """IETF language tag of the user's app."""


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


class FileRef(WireModel):
    """What every file type has (Bot API: ``file_id``, ``file_unique_id``, ``file_size``)."""

    file_id: FileId
    file_unique_id: FileId | None = None
    file_size: Count | None = None


class PhotoSize(FileRef):
    width: Count
    height: Count


class File(FileRef):
    """``Document``, and the base of the named media types below."""

    file_name: Text | None = None
    mime_type: Text | None = None


class Voice(File):
    duration: Count


class Audio(File):
    duration: Count


class Video(File):
    width: Count
    height: Count
    duration: Count
    thumbnail: PhotoSize | None = None


class Animation(Video):
    """A GIF or a soundless H.264/MPEG-4 video (Bot API ``Animation``: same fields as ``Video``)."""


class VideoNote(FileRef):
    duration: Count
    thumbnail: PhotoSize | None = None


class Sticker(FileRef):
    width: Count
    height: Count
    is_animated: bool
    is_video: bool
    emoji: Text | None = None
    thumbnail: PhotoSize | None = None


class TextQuote(WireModel):
    text: Text
    entities: list[Entity] | None = None
    position: Units
    is_manual: bool | None = None


class MessageOrigin(WireModel):
    """Who wrote a message first (Bot API ``MessageOrigin``; by ``type``: ``user`` has
    ``sender_user``, ``hidden_user`` ``sender_user_name``, ``chat`` ``sender_chat``, ``channel``
    ``chat``)."""

    type: Word
    date: UnixTime
    sender_user: User | None = None
    sender_user_name: Text | None = None
    sender_chat: Chat | None = None
    chat: Chat | None = None


class ExternalReplyInfo(WireModel):
    """The message a reply answers when it is in another chat or forum topic."""

    origin: MessageOrigin
    chat: Chat | None = None
    message_id: TelegramId | None = None


class Message(WireModel):
    message_id: TelegramId
    date: UnixTime
    chat: Chat
    from_: User | None = Field(None, alias="from")
    sender_chat: Chat | None = None
    message_thread_id: TelegramId | None = None
    is_topic_message: bool | None = None
    media_group_id: Id | None = None
    text: Text | None = None
    caption: Text | None = None
    entities: list[Entity] | None = None
    caption_entities: list[Entity] | None = None
    reply_to_message: Message | None = None
    quote: TextQuote | None = None
    external_reply: ExternalReplyInfo | None = None
    forum_topic_created: dict[str, Any] | None = None
    """Present (an object) on a forum topic's creation message; its fields are not read."""
    edit_date: UnixTime | None = None
    photo: list[PhotoSize] | None = None
    animation: Animation | None = None
    document: File | None = None
    audio: Audio | None = None
    voice: Voice | None = None
    video: Video | None = None
    video_note: VideoNote | None = None
    sticker: Sticker | None = None


class CallbackQuery(WireModel):
    id: Id
    from_: User = Field(alias="from")
    message: Message | None = None
    """The message with the button; an "inaccessible" one (too old) has only ``chat``,
    ``message_id`` and ``date`` 0."""
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
    """``None`` when ``data`` (a decoded webhook body or one item of a ``getUpdates`` result) has
    the documented types for every field the gateway reads, else a log-safe reason (no payload
    text), e.g. ``message.chat.id: Input should be a valid integer``."""
    return check(Update, data)
