"""Pure inbound translation: a Telegram ``Update`` -> ``InboundMessage`` or a reason to ignore it.

The update is the decoded JSON object itself (a webhook body, or one item of a ``getUpdates``
result), checked by ``adapters.telegram.wire.update_problem`` first: every field read here is
declared there with its Bot API type, so the translation reads the dict directly (python-telegram-bot
objects cost ~100-230 µs of CPU per update to build, this translation a few µs).

Rules (PLATFORMS.md §1.2, Telegram Bot API "Message"/"MessageEntity"):
- private chats are DMs; groups, supergroups and forum topics are groups; channels are ignored;
- ``message_thread_id`` is a thread only when ``is_topic_message`` is true (forum topics);
- in groups the bot answers only when addressed: an ``@username`` mention, ``/cmd@username``,
  a bare ``/cmd``, or a reply to one of the bot's own messages;
- a command is a ``bot_command`` entity at the start of the text, or right after the bot's
  mention (``@username /cmd``, the form Slack and Feishu commands take; Telegram marks the
  ``/cmd`` there as a ``bot_command`` too); one further into the text is text;
- a group message starting with another bot's command (``/cmd@other_bot``) is that bot's, also
  when it replies to the bot or mentions it further on;
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

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.core.types import Attachment, ChatAddress, ContextMessage, InboundMessage, Sender

JSON = Mapping[str, Any]
"""A decoded Bot API object (``Update``, ``Message``, ``User``, ...) that passed ``update_problem``."""

_SPACES = re.compile(r"[ \t]{2,}")
_ASTRAL = re.compile("[\U00010000-\U0010ffff]")
"""Characters outside the BMP: two UTF-16 code units each (every other one counts one)."""


@dataclass(frozen=True, slots=True)
class Ignored:
    """Why an update produces no turn (``edited_message``, ``not_addressed``, ``from_bot``, ...)."""

    reason: str


@dataclass(frozen=True, slots=True)
class BotIdentity:
    """The bot's own id and username (from ``getMe``)."""

    id: int
    username: str


def _only_mentions(prefix: str, spans: Sequence[tuple[int, int]]) -> bool:
    """Whether ``prefix`` (the text before a ``bot_command`` entity) is nothing but the bot's
    mentions (``spans``: string index ranges) and whitespace: ``@bot /stop`` is ``/stop``."""
    for start, end in sorted(spans, reverse=True):
        if end <= len(prefix):
            prefix = prefix[:start] + prefix[end:]
    return not prefix.strip()


def _utf16_to_index(text: str, utf16_offset: int) -> int:
    """Python string index of the code point at ``utf16_offset`` UTF-16 units (``len(text)`` past
    the end; an offset inside a surrogate pair gives the index after that character)."""
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


def _seconds(value: int | None) -> float | None:
    """A Bot API ``duration`` (integer seconds) as float seconds, ``None`` when absent."""
    return float(value) if value is not None else None


def _thumbnail(media: JSON) -> str | None:
    """The ``file_id`` of a file's ``thumbnail`` (a ``PhotoSize``), or ``None``."""
    thumbnail = media.get("thumbnail")
    return thumbnail["file_id"] if thumbnail is not None else None


def _best_photo(sizes: Sequence[JSON]) -> JSON:
    """Among a photo's ``PhotoSize`` objects (``width``/``height`` in pixels, ``file_size`` in bytes
    when known) that ``getFile`` can serve: the smallest reaching ``MODEL_IMAGE_SIDE``, else the
    largest. ``sizes`` is not empty."""
    fits = [p for p in sizes if (p.get("file_size") or 0) <= CLOUD_DOWNLOAD_LIMIT] or list(sizes)
    ordered = sorted(fits, key=lambda p: (p["width"] * p["height"], p.get("file_size") or 0))
    return next((p for p in ordered if max(p["width"], p["height"]) >= MODEL_IMAGE_SIDE), ordered[-1])


def _attachments(message: JSON) -> tuple[Attachment, ...]:
    """Telegram Bot API "Message": ``photo`` (sizes), ``document``, ``animation`` (also set as
    ``document``, taken once), ``voice`` (OGG/Opus), ``audio``, ``video``, ``video_note``, ``sticker``.
    Sizes are bytes, ``width``/``height`` pixels, durations seconds."""
    found: list[Attachment] = []
    photo = message.get("photo")
    if photo:
        best = _best_photo(photo)
        found.append(Attachment("image", best["file_id"], None, "image/jpeg", best.get("file_size"),
                                width=best["width"], height=best["height"]))
    animation, document = message.get("animation"), message.get("document")
    if animation is not None:
        a = animation
        found.append(Attachment("animation", a["file_id"], a.get("file_name"), a.get("mime_type"), a.get("file_size"),
                                width=a["width"], height=a["height"], duration_s=_seconds(a["duration"]),
                                thumbnail_id=_thumbnail(a)))
    elif document is not None:
        d = document
        kind = "image" if (d.get("mime_type") or "").lower() in _PICTURE_TYPES else "document"
        found.append(Attachment(kind, d["file_id"], d.get("file_name"), d.get("mime_type"), d.get("file_size")))
    voice = message.get("voice")
    if voice is not None:
        found.append(Attachment("voice", voice["file_id"], None, voice.get("mime_type") or "audio/ogg",
                                voice.get("file_size"), duration_s=_seconds(voice["duration"])))
    audio = message.get("audio")
    if audio is not None:
        found.append(Attachment("audio", audio["file_id"], audio.get("file_name"), audio.get("mime_type"),
                                audio.get("file_size"), duration_s=_seconds(audio["duration"])))
    video = message.get("video")
    if video is not None:
        found.append(Attachment("video", video["file_id"], video.get("file_name"),
                                video.get("mime_type") or "video/mp4", video.get("file_size"),
                                duration_s=_seconds(video["duration"]),
                                thumbnail_id=_thumbnail(video)))
    note = message.get("video_note")
    if note is not None:  # a round video message: no file name or MIME type in the Bot API
        found.append(Attachment("video", note["file_id"], None, "video/mp4", note.get("file_size"),
                                duration_s=_seconds(note["duration"]), thumbnail_id=_thumbnail(note)))
    sticker = message.get("sticker")
    if sticker is not None:
        st, emoji = sticker, sticker.get("emoji")
        mime = "application/x-tgsticker" if st["is_animated"] else "video/webm" if st["is_video"] else "image/webp"
        found.append(Attachment("sticker", st["file_id"], emoji and f"sticker {emoji}", mime, st.get("file_size"),
                                width=st["width"], height=st["height"], thumbnail_id=_thumbnail(st)))
    return tuple(found)


def _name(user: JSON | None) -> str:
    """A ``User``'s display name: ``first_name`` and ``last_name``; ``""`` for no user."""
    if user is None:
        return ""
    first, last = user["first_name"], user.get("last_name")
    return f"{first} {last}" if first and last else first or last or ""


def _origin_author(origin: JSON) -> str:
    """Who wrote a message first (Bot API ``MessageOrigin`` by ``type``: ``user`` ->
    ``sender_user``, ``hidden_user`` -> ``sender_user_name``, ``chat`` -> ``sender_chat``,
    ``channel`` -> ``chat``, the chats by title); ``""`` when it does not say."""
    kind = origin["type"]
    if kind == "user":
        return _name(origin.get("sender_user"))
    if kind == "hidden_user":
        return origin.get("sender_user_name") or ""
    chat = origin.get("sender_chat") if kind == "chat" else origin.get("chat") if kind == "channel" else None
    return (chat.get("title") or "") if chat is not None else ""


def _quoted(message: JSON, bot: BotIdentity) -> ContextMessage | None:
    """What ``message`` replies to, or ``None``. Telegram Bot API "Message": ``reply_to_message``
    (for replies in the same chat), ``external_reply`` (a message of another chat or topic), and
    ``quote`` (TextQuote: the part of the replied-to message the user selected)."""
    reply, quote = message.get("reply_to_message"), message.get("quote")
    if reply is not None and (reply.get("forum_topic_created") is not None or (
            message.get("is_topic_message") and reply["message_id"] == message.get("message_thread_id"))):
        reply = None  # a forum topic's messages all "reply" to the topic's creation message
    if reply is not None:
        author = reply.get("from")
        text = reply.get("text")
        if text is None:
            text = reply.get("caption") or ""
        name = _name(author)
        if not name and (sender_chat := reply.get("sender_chat")) is not None:
            name = sender_chat.get("title") or ""
        return ContextMessage(
            f"{reply['chat']['id']}:{reply['message_id']}", quote["text"] if quote is not None else text, name,
            float(reply["date"]), _attachments(reply),
            from_bot=author is not None and author["id"] == bot.id, partial=quote is not None)
    external = message.get("external_reply")
    if quote is not None and external is not None:  # the quoted message is in another chat
        origin = external["origin"]
        chat = external.get("chat")
        where = chat["id"] if chat is not None else "external"
        return ContextMessage(f"{where}:{external.get('message_id') or 0}", quote["text"], _origin_author(origin),
                              float(origin["date"]), partial=True)
    return None


def to_inbound(update: JSON, bot: BotIdentity, *, ambient: bool = False) -> InboundMessage | Ignored:
    """Normalizes one update. Pure: no I/O, no clock other than the message's own date.

    Args:
        update: a Bot API ``Update`` as decoded JSON that passed ``adapters.telegram.wire.update_problem``
            (an unchecked one may raise ``KeyError``/``TypeError``); only ``message`` makes a turn.
        bot: the bot's own id and username, for mentions, ``/cmd@bot`` and replies to the bot.
        ambient: a group message not addressed to the bot is returned as a ``context_only``
            message (kept as group context) instead of ``Ignored("not_addressed")``.

    Returns:
        The ``InboundMessage`` (``received_at``: the message's ``date``, epoch seconds; ``event_id``:
        ``update_id``), or ``Ignored`` with the reason: ``edited_message``, ``unsupported_update``,
        ``channel_post``, ``from_bot``, ``service_message``, ``not_addressed``, ``empty``.
    """
    if update.get("edited_message") is not None or update.get("edited_channel_post") is not None:
        return Ignored("edited_message")
    message = update.get("message")
    if message is None:
        return Ignored("unsupported_update")
    chat = message["chat"]
    if chat["type"] == "channel":
        return Ignored("channel_post")
    sender = message.get("from")
    if sender is None or sender["is_bot"]:
        return Ignored("from_bot")

    text = message.get("text")
    if text is not None:
        entities = message.get("entities")
    else:
        text, entities = message.get("caption") or "", message.get("caption_entities")
    attachments = _attachments(message)
    if not text and not attachments:
        return Ignored("service_message")

    username = bot.username.lower()
    mention_spans: list[tuple[int, int]] = []
    command: str | None = None
    addressed = False
    other_bot = False  # the text starts with another bot's command (/cmd@other_bot)
    if entities:
        # Bot API MessageEntity: offset and length in UTF-16 code units, which are string indices
        # unless the text has characters outside the BMP
        astral = _ASTRAL.search(text) is not None
        for entity in entities:
            kind = entity["type"]
            if kind == "mention" or (kind == "bot_command" and command is None):
                offset, end_units = entity["offset"], entity["offset"] + entity["length"]
                if astral:
                    start, end = _utf16_to_index(text, offset), _utf16_to_index(text, end_units)
                else:
                    start, end = min(offset, len(text)), min(end_units, len(text))
                fragment = text[start:end]
                if kind == "mention":
                    if fragment[1:].lower() == username:
                        addressed = True
                        mention_spans.append((start, end))
                    continue
                if offset != 0 and not _only_mentions(text[:start], mention_spans):
                    continue  # a command further into the text is text
                name, _, target = fragment[1:].partition("@")
                if target and target.lower() != username:
                    other_bot |= offset == 0
                    continue  # a command for another bot
                command = name.lower()
                addressed = True
                mention_spans.append((start, end))
            elif kind == "text_mention" and (user := entity.get("user")) is not None and user["id"] == bot.id:
                addressed = True
    reply_to = message.get("reply_to_message")
    if reply_to is not None and (author := reply_to.get("from")) is not None and author["id"] == bot.id:
        addressed = True
    if other_bot:
        addressed = False  # that bot's, even in a reply to ours: it answers, not us

    is_dm = chat["type"] == "private"
    if not is_dm and not addressed and not ambient:
        return Ignored("not_addressed")

    for start, end in sorted(mention_spans, reverse=True):
        text = text[:start] + text[end:]
    if mention_spans:
        text = _SPACES.sub(" ", text)
    text = text.strip()
    if not text and command is None and not attachments:
        return Ignored("empty")  # whitespace only, or only the bot's mention: nothing to answer

    chat_id, message_id = chat["id"], message["message_id"]
    topic = message.get("message_thread_id") if message.get("is_topic_message") else None
    return InboundMessage(
        address=ChatAddress("telegram", str(bot.id), str(chat_id), str(topic) if topic else None),
        message_id=f"{chat_id}:{message_id}",
        chat_type="dm" if is_dm else "group",
        sender=Sender(str(sender["id"]), _name(sender), sender.get("username"), False),
        text=text,
        reply_to_id=None if is_dm else str(message_id),
        command=command,
        attachments=attachments,
        received_at=float(message["date"]),
        event_id=str(update["update_id"]),
        addressed=is_dm or addressed,
        quoted=_quoted(message, bot),
        context_only=not is_dm and not addressed,
        media_group_id=message.get("media_group_id"),
        # the user's app language (IETF tag), a hint for the gateway's texts
        language=sender.get("language_code"),
    )


def callback_to_inbound(update: JSON, bot: BotIdentity) -> InboundMessage | Ignored:
    """A pressed inline button whose ``callback_data`` is a command (``/approve abc123``) becomes
    that command from the presser, in the chat (and forum topic) of the message carrying the
    button. Pure. ``update``: a checked Bot API ``Update`` whose ``callback_query`` is set (Bot API
    ``CallbackQuery``: ``message`` is absent for a button of an inline message, and an
    "inaccessible" one has only ``chat``, ``message_id`` and ``date`` 0). Anything else is
    ``Ignored("unsupported_callback")``."""
    query = update.get("callback_query")
    data = query.get("data") if query is not None else None
    if query is None or not data or not data.startswith("/"):
        return Ignored("unsupported_callback")
    message, sender = query.get("message"), query.get("from")
    if message is None or sender is None or sender["is_bot"]:
        return Ignored("unsupported_callback")
    chat = message["chat"]
    name, _, args = data[1:].partition(" ")
    topic = message.get("message_thread_id") if message.get("is_topic_message") else None
    return InboundMessage(
        address=ChatAddress("telegram", str(bot.id), str(chat["id"]), str(topic) if topic else None),
        message_id=f"cb:{query['id']}",
        chat_type="dm" if chat["type"] == "private" else "group",
        sender=Sender(str(sender["id"]), _name(sender), sender.get("username"), False),
        text=args.strip(),
        command=name.lower(),
        event_id=str(update["update_id"]),
        language=sender.get("language_code"),
    )
