"""Core message types shared by adapters, the gateway and tests. Pure data, no I/O.

Terms (DESIGN §9): platform, tenant, chat, thread, user, message id. A *turn* is one inbound
message to its final reply; a *push* is a scheduled delivery.
"""

from __future__ import annotations

import copy
import time
from contextvars import ContextVar
from dataclasses import dataclass, field, fields
from typing import Any, Literal

ChatType = Literal["dm", "group", "channel"]

_FIELD_NAMES: dict[type, tuple[str, ...]] = {}
_PLAIN = frozenset({str, int, float, bool, type(None)})


def as_dict(obj: Any) -> dict[str, Any]:
    """``dataclasses.asdict(obj)`` for this module's dataclasses (the same dict: nested dataclasses
    as dicts, tuples and lists kept as such, dicts copied), without its deep copy of every plain
    value; a message's dict is built for every inbox row, outbox row and session address."""
    cls = obj.__class__
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in fields(obj))
    return {name: _plain(getattr(obj, name)) for name in names}


def _plain(value: Any) -> Any:
    kind = value.__class__
    if kind in _PLAIN:
        return value
    if hasattr(kind, "__dataclass_fields__"):
        return as_dict(value)
    if kind is tuple or kind is list:
        return kind(_plain(v) for v in value)
    if kind is dict:
        return {k: _plain(v) for k, v in value.items()}
    return copy.deepcopy(value)


@dataclass(frozen=True, slots=True)
class ChatAddress:
    """Where a reply goes: one chat (and thread/topic) on one platform account.

    Attributes:
        platform: ``telegram`` | ``slack`` | ``feishu`` | ``web`` | ``local``.
        tenant: the account the bot lives in (Telegram bot id, Slack ``team_id``, Feishu ``tenant_key``).
        chat_id: the platform's chat id, as a string.
        thread_id: forum topic / thread root, or ``None``.
    """

    platform: str
    tenant: str
    chat_id: str
    thread_id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"platform": self.platform, "tenant": self.tenant, "chat_id": self.chat_id,
                "thread_id": self.thread_id}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ChatAddress:
        return cls(data["platform"], data["tenant"], data["chat_id"], data.get("thread_id"))


@dataclass(frozen=True, slots=True)
class Sender:
    """Who wrote an inbound message. ``user_id`` is the platform's id as a string."""

    user_id: str
    display_name: str = ""
    username: str | None = None
    is_bot: bool = False


AttachmentKind = Literal["image", "audio", "voice", "video", "document", "sticker", "animation"]
ATTACHMENT_KINDS: tuple[str, ...] = ("image", "audio", "voice", "video", "document", "sticker", "animation")
"""What a file is for the gateway: ``image`` (a photo or picture), ``audio`` (a music/audio file),
``voice`` (a recorded voice note: Telegram OGG/Opus, Feishu ``audio``), ``video``, ``document`` (any
other file), ``sticker``, ``animation`` (GIF or a soundless MP4 that platforms show as a GIF)."""

_LEGACY_KINDS = {"file": "document"}


@dataclass(frozen=True, slots=True)
class Attachment:
    """A file that came with a message, as the platform announced it (nothing downloaded yet).

    Attributes:
        kind: one of ``ATTACHMENT_KINDS``.
        file_id: the platform reference the adapter downloads by: Telegram ``file_id``, Slack
            file id, Feishu ``image_key``/``file_key``, web chat: the blob's sha256.
        name: the file name as the sender's client gave it (data, never instructions: shown
            quoted, control characters removed), or ``None``.
        mime_type: the MIME type the platform declared (checked against the bytes later), or ``None``.
        size: bytes as the platform declared them, or ``None`` when it does not say (checked again
            while downloading).
        url: where the bytes are when the platform gives a URL (Slack ``url_private_download``),
            else ``None`` (the adapter resolves ``file_id``).
        width, height: pixels, when the platform says (photos, stickers, videos).
        sha256: the blob's digest when the bytes are already stored (a web chat upload), else ``None``.
        duration_s: seconds of audio/video, when the platform says.
        thumbnail_id: platform reference of a still picture of it (Telegram's thumbnail of a video,
            animation or sticker), shown to the model when the file itself is no image it can take.
    """

    kind: str
    file_id: str
    name: str | None = None
    mime_type: str | None = None
    size: int | None = None
    url: str | None = None
    width: int | None = None
    height: int | None = None
    sha256: str | None = None
    duration_s: float | None = None
    thumbnail_id: str | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Attachment:
        """Reads ``asdict`` output (inbox payloads), also of rows stored before a field existed
        (the old kind ``file`` reads as ``document``)."""
        fields = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        fields["kind"] = _LEGACY_KINDS.get(str(fields.get("kind")), str(fields.get("kind")))
        return cls(**fields)


@dataclass(frozen=True, slots=True)
class BlobRef:
    """Bytes in the blob store (``gateway.media.store``), addressed by content.

    Attributes:
        sha256: lowercase hex SHA-256 of the bytes (the address: equal bytes, one blob).
        size: bytes.
        mime_type: what the bytes are (``image/jpeg``...), as checked when stored.
    """

    sha256: str
    size: int
    mime_type: str


@dataclass(frozen=True, slots=True)
class MediaRef:
    """What the transcript keeps of an attachment: a reference, never the bytes
    (``messages.meta["attachments"]``, one dict per file; ``to_dict``/``from_dict``).

    Attributes:
        sha256: the original file's blob (``None`` when it was never stored: too big, download
            failed, unsupported), so ``note`` says why.
        kind: one of ``ATTACHMENT_KINDS``.
        mime_type: of the original (``application/octet-stream`` when unknown).
        size: bytes of the original (the platform's figure when it was never downloaded).
        name: the cleaned file name, or ``None``.
        image: for an image sent to the model, its rendition (re-encoded to the model's limits):
            ``{"sha256", "mime_type", "size", "width", "height"}``; the model gets exactly these
            bytes on every request, so a replayed turn sends the same bytes (prompt cache).
        note: a plain-words line for the model when the file could not be used (``"too big:
            30.0 MB, Telegram bots can download at most 20 MB"``), else ``None``.
        text: text taken from the file (a transcript, a document's text; filled in by extractors),
            else ``None``.
    """

    kind: str
    mime_type: str
    size: int
    sha256: str | None = None
    name: str | None = None
    image: dict[str, Any] | None = None
    note: str | None = None
    text: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON stored in ``messages.meta["attachments"]`` (``None`` fields left out)."""
        return {k: v for k, v in as_dict(self).items() if v is not None}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MediaRef:
        """Reads ``to_dict`` output, and the older ``{"kind", "name", "mime_type", "size"}`` notes."""
        return cls(kind=_LEGACY_KINDS.get(str(data.get("kind")), str(data.get("kind") or "document")),
                   mime_type=str(data.get("mime_type") or "application/octet-stream"),
                   size=int(data.get("size") or 0), sha256=data.get("sha256"), name=data.get("name"),
                   image=data.get("image"), note=data.get("note"), text=data.get("text"))


@dataclass(frozen=True, slots=True)
class ContextMessage:
    """An earlier message shown to the model for context, never a turn of its own: what a message
    replies to, an earlier message of its thread, or a group message not addressed to the bot.

    Attributes:
        message_id: the platform's id of that message, in the form ``InboundMessage.message_id``
            uses (Telegram ``"<chat_id>:<message_id>"``, Slack ``"<channel>:<ts>"``, Feishu ``om_…``).
        text: its text (captions included); ``None`` when the event named the message but did not
            carry it (Slack thread parent, Feishu ``parent_id``): ``ContextReader.read_message``
            reads it then.
        author: display name of who wrote it (``""`` when unknown).
        sent_at: epoch seconds (``0.0`` when unknown).
        attachments: its files (the reference to fetch them, as on ``InboundMessage``).
        from_bot: this bot wrote it.
        partial: only this part of the message was quoted (Telegram ``quote``).
    """

    message_id: str
    text: str | None = None
    author: str = ""
    sent_at: float = 0.0
    attachments: tuple[Attachment, ...] = ()
    from_bot: bool = False
    partial: bool = False

    def to_dict(self) -> dict[str, Any]:
        return as_dict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ContextMessage:
        return cls(message_id=data["message_id"], text=data.get("text"), author=data.get("author", ""),
                   sent_at=data.get("sent_at", 0.0),
                   attachments=tuple(Attachment(**a) for a in data.get("attachments", ())),
                   from_bot=data.get("from_bot", False), partial=data.get("partial", False))


@dataclass(frozen=True, slots=True)
class ThreadHistory:
    """Earlier messages of a thread as the platform returned them (``ContextReader.read_thread``):
    ``messages`` oldest first; ``omitted``: messages read but left out by the count cap; ``unread``:
    the thread holds messages that were not read at all (beyond the pages read, or a page refused)."""

    messages: tuple[ContextMessage, ...] = ()
    omitted: int = 0
    unread: bool = False


@dataclass(frozen=True, slots=True)
class InboundMessage:
    """A platform message normalized for the gateway (the adapter's only product).

    Attributes:
        address: the chat it came from; replies go back there.
        message_id: the platform's dedupe id, unique per (platform, tenant), e.g. Telegram
            ``"<chat_id>:<message_id>"``, Slack ``"<channel>:<ts>"``, Feishu ``om_…``.
        chat_type: ``dm`` | ``group`` | ``channel``.
        sender: author of the message.
        text: user text with the bot's own mention removed, trimmed; for a command, its arguments
            (``/link ABC123`` -> command ``link``, text ``ABC123``).
        reply_to_id: platform message id to quote in the reply (groups), or ``None``.
        command: slash-command name without ``/`` and bot suffix, or ``None``.
        attachments: files that came with the message.
        received_at: epoch seconds when the gateway received it.
        event_id: the platform's delivery/event id (Telegram ``update_id``), when it has one.
        addressed: ``False`` for a group/thread message that did not mention the bot: the gateway
            takes it only when its session already exists (a thread the bot is part of).
        quoted: the message this one replies to (Telegram ``reply_to_message`` / ``quote``, Slack
            thread parent, Feishu ``parent_id``), or ``None``; its ``text`` is ``None`` when only
            the id came with the event.
        context_only: a group message not for the bot and outside any thread it follows (adapters
            hand these over only when group context is configured): never a turn, only kept as
            group context (``sessions.group_context_messages``).
        opens_thread: the message is top level and its reply opens a thread under it (Slack
            channel mentions): its group context is the chat's top-level messages, not the thread's.
        media_group_id: the album this message belongs to (Telegram ``media_group_id``: an album
            arrives as one message per item); messages of one album are answered by one turn.
        language: the sender's language as their platform says it, a hint (Telegram
            ``from.language_code``, Slack ``users.info`` ``locale``, the web page's
            ``Accept-Language``; Feishu gives none, its adapter says ``zh``), or ``None``.
        locale: the catalog locale the gateway answers this message in (``gateway.core.i18n.choose``:
            the user's ``/language`` choice, ``language``, ``i18n.default``), set when it is
            received; ``None`` from adapters and in rows stored before languages existed.
    """

    address: ChatAddress
    message_id: str
    chat_type: ChatType
    sender: Sender
    text: str
    reply_to_id: str | None = None
    command: str | None = None
    attachments: tuple[Attachment, ...] = ()
    received_at: float = field(default_factory=time.time)
    event_id: str | None = None
    addressed: bool = True
    quoted: ContextMessage | None = None
    context_only: bool = False
    opens_thread: bool = False
    media_group_id: str | None = None
    language: str | None = None
    locale: str | None = None

    @property
    def platform(self) -> str:
        return self.address.platform

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict (stored in the inbox row)."""
        return as_dict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> InboundMessage:
        return cls(
            address=ChatAddress.from_dict(data["address"]),
            message_id=data["message_id"],
            chat_type=data["chat_type"],
            sender=Sender(**data["sender"]),
            text=data["text"],
            reply_to_id=data.get("reply_to_id"),
            command=data.get("command"),
            attachments=tuple(Attachment.from_dict(a) for a in data.get("attachments", ())),
            media_group_id=data.get("media_group_id"),
            received_at=data.get("received_at", 0.0),
            event_id=data.get("event_id"),
            addressed=data.get("addressed", True),
            quoted=ContextMessage.from_dict(data["quoted"]) if data.get("quoted") else None,
            context_only=data.get("context_only", False),
            opens_thread=data.get("opens_thread", False),
            language=data.get("language"),
            locale=data.get("locale"),
        )


@dataclass(frozen=True, slots=True)
class OutboundAttachment:
    """A file the agent sends with a reply (``send_file``), by reference: the bytes are a blob
    (content-addressed by ``sha256``) read when the reply is delivered, so a retry after a crash
    sends the same bytes even if the workspace file changed or was deleted.

    Attributes:
        kind: ``image`` (a PNG, JPEG, WebP or GIF the gateway could read) or ``document``.
        name: file name shown to the user (no folders), at most 255 characters.
        mime_type: e.g. ``image/png``, ``text/csv``.
        size: bytes.
        sha256: hex digest of the bytes: the blob's key.
        caption: text shown with the file (markdown), may be empty.
        width, height: pixels, for images (``None`` otherwise): Telegram's photo rules need them.
    """

    kind: Literal["image", "document"]
    name: str
    mime_type: str
    size: int
    sha256: str
    caption: str = ""
    width: int | None = None
    height: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return as_dict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> OutboundAttachment:
        return cls(kind=data["kind"], name=data["name"], mime_type=data["mime_type"], size=int(data["size"]),
                   sha256=data["sha256"], caption=data.get("caption") or "", width=data.get("width"),
                   height=data.get("height"))


@dataclass(frozen=True, slots=True)
class OutboundMessage:
    """A reply to deliver: markdown ``text`` for ``address``, quoting ``reply_to_id`` if set.

    ``idempotency_key`` is unique per delivery (turn id + sequence); adapters pass it to platforms
    that dedupe on it (Feishu ``uuid``).
    """

    address: ChatAddress
    text: str
    idempotency_key: str
    reply_to_id: str | None = None
    format: Literal["plain", "markdown"] = "markdown"
    resume_from: int = 0
    """Parts (platform messages) of this reply already delivered by an earlier attempt."""
    edit_id: str | None = None
    """Deliver part 1 by editing this platform message (the streamed preview) instead of sending
    a new one; later parts are sent as new messages. Only for adapters with ``edit``."""
    buttons: tuple[tuple[str, str], ...] = ()
    """``(label, command text)`` pairs shown under the last part where the platform has buttons
    (Telegram inline keyboard); pressing one arrives as that command from the presser. The text
    must name the same commands, for platforms without buttons."""
    editable: bool = False
    """The message will be edited later (a streamed preview, the plan message): an adapter that can
    edit only some kinds of message sends one of those (Feishu: a shared interactive card)."""
    attachments: tuple[OutboundAttachment, ...] = ()
    """Files sent after the text, in order, each as its own part (one platform message, counted in
    ``resume_from`` like a text part); ``text`` may then be empty."""


@dataclass(frozen=True, slots=True)
class DeliveryResult:
    """Outcome of ``Adapter.send``.

    Attributes:
        ok: all parts delivered.
        platform_message_ids: ids of the platform messages created, in order.
        retryable: a failure that may succeed later (rate limit, network, 5xx).
        retry_after: seconds the platform asked us to wait, if it said.
        error: short reason for logs and the outbox row (never contains secrets).
    """

    ok: bool
    platform_message_ids: tuple[str, ...] = ()
    retryable: bool = False
    retry_after: float | None = None
    error: str | None = None


CURRENT_MESSAGE: ContextVar[InboundMessage | None] = ContextVar("current_message", default=None)
"""The message a turn answers, set while the agent loop runs on the worker thread: tools that act
for the user (``schedule_report``) read who asks and from which chat here, so ``agent/`` stays
free of gateway types."""
