"""Protocols between the gateway and the adapters it hosts."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from aiohttp import web

from gateway.core.types import (
    Attachment,
    BlobRef,
    ChatAddress,
    ContextMessage,
    DeliveryResult,
    InboundMessage,
    OutboundAttachment,
    OutboundMessage,
    ThreadHistory,
)

PartSent = Callable[[str], Awaitable[None]]
"""Called by ``Adapter.send`` with each part's platform message id as soon as it is delivered."""

BeforePart = Callable[[int], Awaitable[None]]
"""Called by ``Adapter.send`` with a part's index right before that part's API call. It raises
(and the adapter must let it propagate) when the reply may no longer be sent by us."""

ChatLeft = Callable[[ChatAddress], Awaitable[None]]
"""Told by an adapter that the bot is no longer in a chat (removed, or the chat is gone): the
gateway forgets what it kept of that chat (group context). Adapters that can tell offer
``bind_chat_left(callback)``; the callback never raises."""

InboundSink = Callable[[InboundMessage], Awaitable[bool]]
"""Stores a normalized message durably; returns ``False`` for a duplicate. Raises if storing failed
(the adapter must then not acknowledge the platform, so the platform delivers it again)."""


class EditingAdapter(Protocol):
    """Optional capability: edit a message the bot sent (streamed previews, DESIGN §3.5).

    An adapter without ``edit`` gets no streamed previews: its replies are sent whole, once.
    """

    async def edit(self, address: ChatAddress, message_id: str, text: str) -> DeliveryResult:
        """Replaces the text of the bot's message ``message_id`` with plain ``text`` (one message's
        worth; longer text is cut). Unchanged text counts as success (Telegram "message is not
        modified"). Never raises for platform errors."""
        ...


def can_edit(adapter: object) -> bool:
    """Whether ``adapter`` has the optional ``edit`` capability."""
    return callable(getattr(adapter, "edit", None))


class ContextReader(Protocol):
    """Optional capability: read earlier messages from the platform, so a turn can show the model
    what a message replies to and the thread it was posted in (``gateway.bus.conversation``).

    Both run on the main loop, called from a turn's worker thread; the gateway bounds them in time
    and goes on without the context when they fail. Texts come back as the platform's plain text
    (mentions readable, the bot's own removed), with author names where the platform gives them.
    """

    async def read_message(self, message: InboundMessage) -> ContextMessage | None:
        """``message.quoted`` read in full (its ``text`` was ``None``: the event named it only), or
        ``None`` when the platform no longer has it.

        Raises:
            ContextUnavailable: the platform refused (missing scope, rate limit, ...).
        """
        ...

    async def read_thread(self, message: InboundMessage, limit: int) -> ThreadHistory:
        """The messages posted in ``message``'s thread before it (the thread's parent included),
        oldest first, at most ``limit`` of them (the parent and the newest are kept).

        Raises:
            ContextUnavailable: the platform refused (missing scope, rate limit, ...).
        """
        ...


def can_read_context(adapter: object) -> bool:
    """Whether ``adapter`` has the optional ``ContextReader`` capability."""
    return callable(getattr(adapter, "read_message", None)) and callable(getattr(adapter, "read_thread", None))


class FileReader(Protocol):
    """Reads the bytes of an outbound file by its ``sha256`` (the gateway's blob store), for
    adapters that upload files (``bind_files``)."""

    async def read(self, sha256: str) -> bytes | None:
        """The blob's bytes, or ``None`` when the store no longer has it (retention)."""
        ...


class FileSendingAdapter(Protocol):
    """Optional capability: deliver ``OutboundMessage.attachments`` (the ``send_file`` tool).

    ``bind_files(reader)`` is called by the gateway before ``start``; ``send`` then delivers each
    attachment as one part after the text parts. ``attachment_problem`` is asked when the tool is
    called, so the model learns at once that a file cannot go to this platform (and why)."""

    def bind_files(self, reader: FileReader) -> None: ...

    def attachment_problem(self, attachment: OutboundAttachment) -> str | None:
        """``None`` when this platform can take the file, else one sentence naming the platform's
        limit (e.g. "Telegram bots can send files up to 50 MB; report.zip is 63.2 MB."). Pure."""
        ...


def can_send_files(adapter: object) -> bool:
    """Whether ``adapter`` has the optional file-sending capability."""
    return callable(getattr(adapter, "attachment_problem", None)) and callable(getattr(adapter, "bind_files", None))


class Adapter(Protocol):
    """One platform account. Adapters translate; every decision is the gateway's.

    Lifecycle: ``routes()`` is read before the HTTP server starts; ``start(sink)`` connects and
    checks credentials without receiving yet; ``start_receiving()`` begins (polling/socket; a
    webhook is accepted once the gateway is ready) and every normalized message goes to ``sink``
    before it is acknowledged; ``stop_receiving()`` ends receiving, ``stop()`` closes the clients.
    ``send`` and ``send_typing`` run on the main loop.
    """

    platform: str
    idempotent_send: bool
    """The platform dedupes a resent part by our idempotency key (Feishu ``uuid``): a send left in
    flight by a crash may then be repeated safely; otherwise it is skipped (never sent twice)."""
    receiver_lease: str | None
    """Name of a lease that must be held to receive (Telegram long polling: one poller per bot
    across instances), or ``None`` when every instance may receive (webhooks)."""

    def routes(self) -> list[web.RouteDef]:
        """Webhook routes this adapter serves on the gateway's HTTP server (may be empty)."""
        ...

    async def start(self, sink: InboundSink) -> None:
        """Prepares sending (identity, clients) and remembers ``sink``; does not receive yet."""
        ...

    async def start_receiving(self) -> None:
        """Begins receiving (polling/socket). Webhook adapters receive through ``routes()``."""
        ...

    async def stop_receiving(self) -> None: ...

    async def stop(self) -> None: ...

    async def send(self, message: OutboundMessage, on_part: PartSent | None = None,
                   before_part: BeforePart | None = None) -> DeliveryResult:
        """Delivers one reply (split into several platform messages if needed), skipping the first
        ``message.resume_from`` parts. Never raises for platform errors: they are reported in the
        result, with the ids of the parts delivered before the error. Adapters with ``edit``
        deliver part 1 of a message with ``edit_id`` by editing that message (its id is part 1's id)."""
        ...

    async def send_typing(self, address: ChatAddress) -> None:
        """Shows a typing indicator once (best effort; errors are swallowed)."""
        ...

    async def check(self) -> str:
        """Verifies credentials and reachability for ``gateway doctor``; returns a one-line
        description (e.g. the bot's username). Raises with a plain-words message on failure."""
        ...


class ConversationReader(Protocol):
    """Reads the conversation a platform user is in, for channels that show it themselves (the web
    chat shows the whole transcript, turns written from linked accounts on other platforms too)."""

    async def read(self, platform: str, tenant: str, platform_user_id: str, after_id: int,
                   limit: int = 200) -> tuple[str | None, list[dict[str, Any]]]:
        """``(session_id, entries)``: the user's current DM session (``None`` before their first
        message) and its user and assistant messages with id > ``after_id``, oldest first, at most
        ``limit``. Each entry: ``id`` (int), ``role`` (``user`` | ``assistant``), ``text`` (markdown
        as written), ``platform`` (where the turn came from, or ``None``), ``message_id`` (the platform's id
        of a user message, else ``None``), ``created_at`` (epoch s), ``attachments`` (the row's stored
        file references, ``gateway.core.types.MediaRef`` dicts; never bytes; an assistant message's are
        the files it sent: ``{"kind", "name", "mime_type", "size", "sha256", "caption"?}``)."""
        ...


class BlobStore(Protocol):
    """Content-addressed bytes shared by every instance (``gateway.media.store`` implements it:
    files under ``media.directory`` or the ``blobs`` table). Synchronous: call it from a worker
    thread, or through ``asyncio.to_thread`` on the main loop.
    """

    def put(self, data: bytes, mime_type: str) -> BlobRef:
        """Stores ``data`` (idempotent: equal bytes are stored once) and returns its reference."""
        ...

    def get(self, ref: BlobRef | str) -> bytes:
        """The bytes of ``ref`` (a ``BlobRef`` or its sha256). Raises ``BlobMissing``."""
        ...


class MediaAdapter(Protocol):
    """Optional capability: download the bytes of an attachment (``can_download``)."""

    def download_limit(self, attachment: Attachment) -> int | None:
        """Most bytes the platform lets a bot download for this attachment (Telegram cloud Bot
        API: 20 MB), or ``None`` when it sets no limit below the gateway's own."""
        ...

    async def download(self, message: InboundMessage, attachment: Attachment, max_bytes: int) -> tuple[bytes, str]:
        """``(bytes, mime type as served)`` of ``attachment`` of ``message``, at most ``max_bytes``.

        Raises:
            gateway.core.errors.FileTooBig: the platform says or the body shows it is larger.
            gateway.core.errors.DownloadFailed: anything else (with a plain-words reason).
        """
        ...


def can_download(adapter: object) -> bool:
    """Whether ``adapter`` has the optional ``download`` capability."""
    return callable(getattr(adapter, "download", None))


class Fetch(Protocol):
    """Downloads a file URL a platform handed over (``gateway.media.fetch.GuardedFetch``), for
    adapters that receive a URL instead of calling an SDK (Slack ``url_private_download``)."""

    async def __call__(self, url: str, *, headers: dict[str, str], max_bytes: int,
                       trusted: bool) -> tuple[bytes, str]:
        """``(body, content type)`` of ``GET url``.

        ``trusted``: ``url`` is on the platform API host the operator configured (connected to
        as it is); otherwise every hop is checked by the outbound address guard. Redirects to
        another origin are always checked and lose ``Authorization``.

        Raises:
            gateway.core.errors.FileTooBig: the body is longer than ``max_bytes``.
            gateway.core.errors.DownloadFailed: refused address, HTTP error, network failure.
        """
        ...
