"""Local adapter: a terminal conversation (``gateway chat``) through the same bus, platform ``local``."""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from collections.abc import Callable

from aiohttp import web

from gateway.core.ports import InboundSink
from gateway.core.types import ChatAddress, DeliveryResult, InboundMessage, OutboundAttachment, OutboundMessage, Sender


class LocalAdapter:
    """Reads lines from ``read_line`` (stdin by default) and prints replies with ``write``.

    ``on_eof`` is called when input ends (Ctrl-D), so the CLI can shut down.
    """

    platform = "local"
    idempotent_send = False
    receiver_lease: str | None = None

    def __init__(self, *, user: str = "local-user", read_line: Callable[[], str] | None = None,
                 write: Callable[[str], None] | None = None, on_eof: Callable[[], None] | None = None) -> None:
        self.address = ChatAddress("local", "local", user)
        self._user = user
        self._read_line = read_line or sys.stdin.readline
        self._write = write or (lambda text: print(text, flush=True))
        self._on_eof = on_eof
        self._task: asyncio.Task[None] | None = None
        self.waiting = asyncio.Event()

    def routes(self) -> list[web.RouteDef]:
        return []

    async def start(self, sink: InboundSink) -> None:
        self._sink = sink

    async def start_receiving(self) -> None:
        self._task = asyncio.create_task(self._read(self._sink), name="local-input")

    async def stop_receiving(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _read(self, sink: InboundSink) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self._write_prompt()
            line = await loop.run_in_executor(None, self._read_line)
            if not line:
                if self._on_eof:
                    self._on_eof()
                return
            text = line.strip()
            if not text:
                continue
            command = text[1:].split()[0].lower() if text.startswith("/") else None
            if command:
                text = text.partition(" ")[2].strip()
            await sink(InboundMessage(
                address=self.address, message_id=uuid.uuid4().hex, chat_type="dm",
                sender=Sender(self._user, "You"), text=text, command=command,
                language=_terminal_language(),
            ))
            self.waiting.clear()
            await self.waiting.wait()

    def _write_prompt(self) -> None:
        sys.stdout.write("you> ")
        sys.stdout.flush()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    def bind_files(self, reader: object) -> None:
        """Files are shown by name only: the terminal needs no bytes."""

    def attachment_problem(self, attachment: OutboundAttachment) -> str | None:
        return None

    async def send(self, message: OutboundMessage, on_part: object = None, before_part: object = None
                   ) -> DeliveryResult:
        if message.text:
            self._write(f"agent> {message.text}")
        for attachment in message.attachments:  # the terminal shows what was sent, not the bytes
            caption = f": {attachment.caption}" if attachment.caption else ""
            self._write(f"agent> [file {attachment.name}, {attachment.mime_type}, {attachment.size} bytes{caption}]")
        self.waiting.set()
        return DeliveryResult(True, (uuid.uuid4().hex,))

    async def send_typing(self, address: ChatAddress) -> None:
        return None

    async def check(self) -> str:
        return "terminal"


def _terminal_language() -> str | None:
    """The terminal's language (POSIX: ``LC_ALL``, then ``LC_MESSAGES``, then ``LANG``, e.g.
    ``zh_CN.UTF-8``): the language hint of ``gateway chat`` messages."""
    return os.environ.get("LC_ALL") or os.environ.get("LC_MESSAGES") or os.environ.get("LANG") or None
