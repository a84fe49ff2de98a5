"""The typing indicator while a turn runs ("bot is typing…" in Telegram, a reaction elsewhere)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

from gateway.core.ports import Adapter
from gateway.core.types import ChatAddress

TYPING_INTERVAL_S = 4.0  # Telegram shows "typing" for ≤ 5 s (Bot API: sendChatAction)
TYPING_DELAY_S = 0.5  # a reply faster than this needs no indicator (and saves a platform call)


class TypingIndicators:
    """One repeating ``send_typing`` task per chat with a turn running (main loop only), started
    ``TYPING_DELAY_S`` after the turn began: until then a timer only (most turns that end sooner cost
    no task).

    Args:
        chat_waiting: ``True`` while a reply to that chat waits in the outbox (the indicator pauses
            then: the platform clears it when the message arrives).
    """

    def __init__(self, adapters: Mapping[str, Adapter], chat_waiting: Callable[[ChatAddress], bool]) -> None:
        self._adapters = adapters
        self._chat_waiting = chat_waiting
        self._tasks: dict[ChatAddress, asyncio.Task[None] | asyncio.TimerHandle] = {}

    def start(self, address: ChatAddress) -> None:
        """A turn for ``address`` began: indicate typing after ``TYPING_DELAY_S``, then every
        ``TYPING_INTERVAL_S`` seconds."""
        if address.platform not in self._adapters or address in self._tasks:
            return
        self._tasks[address] = asyncio.get_running_loop().call_later(TYPING_DELAY_S, self._begin, address)

    def _begin(self, address: ChatAddress) -> None:
        adapter = self._adapters[address.platform]

        async def keep_typing() -> None:
            while True:
                if not self._chat_waiting(address):
                    await adapter.send_typing(address)
                await asyncio.sleep(TYPING_INTERVAL_S)

        self._tasks[address] = asyncio.create_task(keep_typing())

    def end(self, address: ChatAddress) -> None:
        """The turn for ``address`` ended."""
        task = self._tasks.pop(address, None)
        if task is not None:
            task.cancel()

    def stop(self) -> None:
        """Cancels every indicator (the gateway is stopping)."""
        for task in self._tasks.values():
            task.cancel()
        self._tasks.clear()
