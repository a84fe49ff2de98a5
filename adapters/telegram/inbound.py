"""Pure inbound translation: a Telegram ``Update`` -> ``InboundMessage`` or a reason to ignore it.

Rules (PLATFORMS.md §1.2, Telegram Bot API "Message"/"MessageEntity"):
- private chats are DMs; groups, supergroups and forum topics are groups; channels are ignored;
- ``message_thread_id`` is a thread only when ``is_topic_message`` is true (forum topics);
- in groups the bot answers only when addressed: an ``@username`` mention, ``/cmd@username``,
  a bare ``/cmd``, or a reply to one of the bot's own messages;
- entity offsets and lengths are UTF-16 code units;
- edited messages, messages from bots (the bot itself included) and service messages are ignored;
- a reply carries what it replies to (``quoted``): ``reply_to_message`` (its text or caption and its
  media), or only the part the user selected when the message has a ``quote`` (Bot API 7.0 TextQuote;
  also for a reply to another chat's message, ``external_reply``); in a forum topic the topic's
  creation message, which every topic message "replies" to, is not a reply;
- with ``ambient`` (group context configured), a group message not addressed to the bot becomes a
  ``context_only`` message instead of being ignored (Telegram delivers those only with privacy mode
  off).
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass

from telegram import Message, MessageEntity, PhotoSize, Update, User

from gateway.core.types import Attachment, ChatAddress, ContextMessage, InboundMessage, Sender

_SPACES = re.compile(r"[ \t]{2,}")


@dataclass(frozen=True, slots=True)
class Ignored:
    """Why an update produces no turn (``edited_message``, ``not_addressed``, ``from_bot``, ...)."""

    reason: str


@dataclass(frozen=True, slots=True)
class BotIdentity:
    """The bot's own id and username (from ``getMe``)."""

    id: int
    username: str


def _utf16_to_index(text: str, utf16_offset: int) -> int:
    """Python string index of the code point at ``utf16_offset`` UTF-16 units."""
    units = 0
    for index, ch in enumerate(text):
        if units >= utf16_offset:
            return index
        units += 2 if ord(ch) > 0xFFFF else 1
    return len(text)


MODEL_IMAGE_SIDE = 2048
"""Photos are sent in several sizes: the smallest whose longest side reaches this (the model's
limit, ``media.image_max_side`` by default) is taken, else the largest."""
CLOUD_DOWNLOAD_LIMIT = 20_000_000
"""Bot API ``getFile``: "bots can download files of up to 20 MB in size" (cloud API)."""
_PICTURE_TYPES = ("image/jpeg", "image/png", "image/webp", "image/gif", "image/bmp", "image/tiff")


def _seconds(value: object) -> float | None:
    """A duration as seconds (PTB gives ``int`` or ``timedelta``)."""
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    return float(value) if isinstance(value, int | float) else None


def _best_photo(sizes: tuple[PhotoSize, ...]) -> PhotoSize:
    fits = [p for p in sizes if (p.file_size or 0) <= CLOUD_DOWNLOAD_LIMIT] or list(sizes)
    ordered = sorted(fits, key=lambda p: (p.width * p.height, p.file_size or 0))
    return next((p for p in ordered if max(p.width, p.height) >= MODEL_IMAGE_SIDE), ordered[-1])


def _attachments(message: Message) -> tuple[Attachment, ...]:
    """Telegram Bot API "Message": ``photo`` (sizes), ``document``, ``animation`` (also set as
    ``document``, taken once), ``voice`` (OGG/Opus), ``audio``, ``video``, ``video_note``, ``sticker``."""
    found: list[Attachment] = []
    if message.photo:
        photo = _best_photo(message.photo)
        found.append(Attachment("image", photo.file_id, None, "image/jpeg", photo.file_size,
                                width=photo.width, height=photo.height))
    if message.animation:
        a = message.animation
        found.append(Attachment("animation", a.file_id, a.file_name, a.mime_type, a.file_size, width=a.width,
                                height=a.height, duration_s=_seconds(a.duration),
                                thumbnail_id=a.thumbnail.file_id if a.thumbnail else None))
    elif message.document:
        d = message.document
        kind = "image" if (d.mime_type or "").lower() in _PICTURE_TYPES else "document"
        found.append(Attachment(kind, d.file_id, d.file_name, d.mime_type, d.file_size))
    if message.voice:
        v = message.voice
        found.append(Attachment("voice", v.file_id, None, v.mime_type or "audio/ogg", v.file_size,
                                duration_s=_seconds(v.duration)))
    if message.audio:
        au = message.audio
        found.append(Attachment("audio", au.file_id, au.file_name, au.mime_type, au.file_size,
                                duration_s=_seconds(au.duration)))
    for media in (message.video, message.video_note):
        if media is not None:
            found.append(Attachment("video", media.file_id, getattr(media, "file_name", None),
                                    getattr(media, "mime_type", None) or "video/mp4", media.file_size,
                                    duration_s=_seconds(media.duration),
                                    thumbnail_id=media.thumbnail.file_id if media.thumbnail else None))
    if message.sticker:
        st = message.sticker
        mime = "application/x-tgsticker" if st.is_animated else "video/webm" if st.is_video else "image/webp"
        found.append(Attachment("sticker", st.file_id, st.emoji and f"sticker {st.emoji}", mime, st.file_size,
                                width=st.width, height=st.height,
                                thumbnail_id=st.thumbnail.file_id if st.thumbnail else None))
    return tuple(found)


def _name(user: User | None) -> str:
    return " ".join(p for p in (user.first_name, user.last_name) if p) if user is not None else ""


def _quoted(message: Message, bot: BotIdentity) -> ContextMessage | None:
    """What ``message`` replies to, or ``None``. Telegram Bot API "Message": ``reply_to_message``
    (for replies in the same chat), ``external_reply`` (a message of another chat or topic), and
    ``quote`` (TextQuote: the part of the replied-to message the user selected)."""
    reply, quote = message.reply_to_message, message.quote
    if reply is not None and (reply.forum_topic_created is not None or (
            message.is_topic_message and reply.message_id == message.message_thread_id)):
        reply = None  # a forum topic's messages all "reply" to the topic's creation message
    if reply is not None:
        author = reply.from_user
        text = reply.text if reply.text is not None else (reply.caption or "")
        name = _name(author) or (reply.sender_chat.title or "" if reply.sender_chat is not None else "")
        return ContextMessage(
            f"{reply.chat.id}:{reply.message_id}", quote.text if quote is not None else text, name,
            reply.date.timestamp() if reply.date else 0.0, _attachments(reply),
            from_bot=author is not None and author.id == bot.id, partial=quote is not None)
    external = message.external_reply
    if quote is not None and external is not None:  # the quoted message is in another chat
        origin = external.origin
        name = _name(getattr(origin, "sender_user", None)) or getattr(origin, "sender_user_name", None) or ""
        chat = getattr(origin, "chat", None) or getattr(origin, "sender_chat", None)
        name = name or (chat.title or "" if chat is not None else "")
        where = external.chat.id if external.chat is not None else "external"
        return ContextMessage(f"{where}:{external.message_id or 0}", quote.text, name,
                              origin.date.timestamp() if origin.date else 0.0, partial=True)
    return None


def to_inbound(update: Update, bot: BotIdentity, *, ambient: bool = False) -> InboundMessage | Ignored:
    """Normalizes one update. Pure: no I/O, no clock other than the message's own date.

    ``ambient``: a group message not addressed to the bot is returned as a ``context_only``
    message (kept as group context) instead of ``Ignored("not_addressed")``."""
    if update.edited_message is not None or update.edited_channel_post is not None:
        return Ignored("edited_message")
    message = update.message
    if message is None:
        return Ignored("unsupported_update")
    chat = message.chat
    if chat.type == "channel":
        return Ignored("channel_post")
    sender = message.from_user
    if sender is None or sender.is_bot:
        return Ignored("from_bot")

    text = message.text if message.text is not None else (message.caption or "")
    entities = message.entities if message.text is not None else message.caption_entities
    attachments = _attachments(message)
    if not text and not attachments:
        return Ignored("service_message")

    username = bot.username.lower()
    mention_spans: list[tuple[int, int]] = []
    command: str | None = None
    addressed = False
    for entity in entities or ():
        start = _utf16_to_index(text, entity.offset)
        end = _utf16_to_index(text, entity.offset + entity.length)
        fragment = text[start:end]
        if entity.type == MessageEntity.MENTION and fragment[1:].lower() == username:
            addressed = True
            mention_spans.append((start, end))
        elif entity.type == MessageEntity.BOT_COMMAND and entity.offset == 0:
            name, _, target = fragment[1:].partition("@")
            if target and target.lower() != username:
                continue  # a command for another bot
            command = name.lower()
            addressed = True
            mention_spans.append((start, end))
        elif entity.type == MessageEntity.TEXT_MENTION and entity.user and entity.user.id == bot.id:
            addressed = True
    reply_to = message.reply_to_message
    if reply_to is not None and reply_to.from_user is not None and reply_to.from_user.id == bot.id:
        addressed = True

    is_dm = chat.type == "private"
    if not is_dm and not addressed and not ambient:
        return Ignored("not_addressed")

    for start, end in sorted(mention_spans, reverse=True):
        text = text[:start] + text[end:]
    if mention_spans:
        text = _SPACES.sub(" ", text)
    text = text.strip()
    if not text and command is None and not attachments:
        return Ignored("empty")  # whitespace only, or only the bot's mention: nothing to answer

    thread_id = str(message.message_thread_id) if message.is_topic_message and message.message_thread_id else None
    display = " ".join(p for p in (sender.first_name, sender.last_name) if p)
    return InboundMessage(
        address=ChatAddress("telegram", str(bot.id), str(chat.id), thread_id),
        message_id=f"{chat.id}:{message.message_id}",
        chat_type="dm" if is_dm else "group",
        sender=Sender(str(sender.id), display, sender.username, False),
        text=text,
        reply_to_id=None if is_dm else str(message.message_id),
        command=command,
        attachments=attachments,
        received_at=message.date.timestamp() if message.date else 0.0,
        event_id=str(update.update_id),
        addressed=is_dm or addressed,
        quoted=_quoted(message, bot),
        context_only=not is_dm and not addressed,
        media_group_id=message.media_group_id,
        language=sender.language_code,  # the user's app language (IETF tag), a hint for the gateway's texts
    )


def callback_to_inbound(update: Update, bot: BotIdentity) -> InboundMessage | Ignored:
    """A pressed inline button whose ``callback_data`` is a command (``/approve abc123``) becomes
    that command from the presser, in the chat of the message carrying the button. Pure."""
    query = update.callback_query
    if query is None or not query.data or not query.data.startswith("/"):
        return Ignored("unsupported_callback")
    message = query.message
    if message is None or query.from_user is None or query.from_user.is_bot:
        return Ignored("unsupported_callback")
    chat = message.chat
    name, _, args = query.data[1:].partition(" ")
    sender = query.from_user
    display = " ".join(p for p in (sender.first_name, sender.last_name) if p)
    topic = getattr(message, "message_thread_id", None) if getattr(message, "is_topic_message", False) else None
    thread_id = str(topic) if topic else None
    return InboundMessage(
        address=ChatAddress("telegram", str(bot.id), str(chat.id), thread_id),
        message_id=f"cb:{query.id}",
        chat_type="dm" if chat.type == "private" else "group",
        sender=Sender(str(sender.id), display, sender.username, False),
        text=args.strip(),
        command=name.lower(),
        event_id=str(update.update_id),
        language=sender.language_code,
    )
