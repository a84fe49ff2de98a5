"""Pure inbound translation: a Telegram ``Update`` -> ``InboundMessage`` or a reason to ignore it.

Rules (PLATFORMS.md §1.2, Telegram Bot API "Message"/"MessageEntity"):
- private chats are DMs; groups, supergroups and forum topics are groups; channels are ignored;
- ``message_thread_id`` is a thread only when ``is_topic_message`` is true (forum topics);
- in groups the bot answers only when addressed: an ``@username`` mention, ``/cmd@username``,
  a bare ``/cmd``, or a reply to one of the bot's own messages;
- entity offsets and lengths are UTF-16 code units;
- edited messages, messages from bots (the bot itself included) and service messages are ignored.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from telegram import Message, MessageEntity, Update

from gateway.core.types import Attachment, ChatAddress, InboundMessage, Sender

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


def _attachments(message: Message) -> tuple[Attachment, ...]:
    found: list[Attachment] = []
    if message.photo:
        largest = max(message.photo, key=lambda p: (p.file_size or 0, p.width * p.height))
        found.append(Attachment("image", largest.file_id, None, "image/jpeg", largest.file_size))
    if message.document:
        d = message.document
        found.append(Attachment("document", d.file_id, d.file_name, d.mime_type, d.file_size))
    for kind, media in (("audio", message.voice), ("audio", message.audio), ("video", message.video)):
        if media is not None:
            found.append(Attachment(kind, media.file_id, getattr(media, "file_name", None),
                                    getattr(media, "mime_type", None), media.file_size))
    if message.sticker:
        found.append(Attachment("image", message.sticker.file_id, None, "image/webp", message.sticker.file_size))
    return tuple(found)


def to_inbound(update: Update, bot: BotIdentity) -> InboundMessage | Ignored:
    """Normalizes one update. Pure: no I/O, no clock other than the message's own date."""
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
    if not is_dm and not addressed:
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
    )
