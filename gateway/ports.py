"""Protocols between the gateway and the adapters it hosts."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

from aiohttp import web

from gateway.types import ChatAddress, DeliveryResult, InboundMessage, OutboundMessage

InboundSink = Callable[[InboundMessage], Awaitable[bool]]
"""Stores a normalized message durably; returns ``False`` for a duplicate. Raises if storing failed
(the adapter must then not acknowledge the platform, so the platform delivers it again)."""


class Adapter(Protocol):
    """One platform account. Adapters translate; every decision is the gateway's.

    Lifecycle: ``routes()`` is read before the HTTP server starts; ``start(sink)`` begins receiving
    (polling/socket) and hands every normalized message to ``sink`` before acknowledging it;
    ``stop()`` ends receiving. ``send`` and ``send_typing`` run on the main loop.
    """

    platform: str

    def routes(self) -> list[web.RouteDef]:
        """Webhook routes this adapter serves on the gateway's HTTP server (may be empty)."""
        ...

    async def start(self, sink: InboundSink) -> None: ...

    async def stop(self) -> None: ...

    async def send(self, message: OutboundMessage) -> DeliveryResult:
        """Delivers one reply (split into several platform messages if needed). Never raises for
        platform errors: they are reported in the result."""
        ...

    async def send_typing(self, address: ChatAddress) -> None:
        """Shows a typing indicator once (best effort; errors are swallowed)."""
        ...

    async def check(self) -> str:
        """Verifies credentials and reachability for ``gateway doctor``; returns a one-line
        description (e.g. the bot's username). Raises with a plain-words message on failure."""
        ...
