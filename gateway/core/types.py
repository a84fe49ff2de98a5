"""Core message types shared by adapters, the gateway and tests. Pure data, no I/O.

Terms (DESIGN §9): platform, tenant, chat, thread, user, message id. A *turn* is one inbound
message to its final reply; a *push* is a scheduled delivery.
"""

from __future__ import annotations

import time
from contextvars import ContextVar
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

ChatType = Literal["dm", "group", "channel"]


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
        return asdict(self)

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


@dataclass(frozen=True, slots=True)
class Attachment:
    """A file that came with a message: ``kind`` is ``image`` | ``file`` | ``audio`` | ``video``.

    ``file_id`` is the platform's handle to download it later; nothing is downloaded on receipt.
    """

    kind: str
    file_id: str
    name: str | None = None
    mime_type: str | None = None
    size: int | None = None


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

    @property
    def platform(self) -> str:
        return self.address.platform

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict (stored in the inbox row)."""
        return asdict(self)

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
            attachments=tuple(Attachment(**a) for a in data.get("attachments", ())),
            received_at=data.get("received_at", 0.0),
            event_id=data.get("event_id"),
            addressed=data.get("addressed", True),
        )


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
