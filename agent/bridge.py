"""AsyncBridge: one long-lived event loop on its own thread for async tools (DESIGN §2).

Async clients (aiohttp sessions, a browser, MCP sessions) are created on this loop and stay
bound to it, so their state survives between turns. Worker threads call ``run(coro, timeout)``;
there is no ``asyncio.run`` per call and no loop per thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class BridgeTimeout(TimeoutError):
    """The coroutine did not finish within the timeout; it has been cancelled."""


class AsyncBridge:
    """Owns the bridge loop thread. Start once with the process; stop once at shutdown."""

    def __init__(self, name: str = "async-bridge") -> None:
        self._name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._closers: list[Callable[[], Awaitable[None]]] = []

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            raise RuntimeError("AsyncBridge is not started")
        return self._loop

    def start(self) -> None:
        """Starts the loop thread (idempotent)."""
        if self._thread is not None:
            return
        ready = threading.Event()

        def _run() -> None:
            self._loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self._loop)
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=_run, name=self._name, daemon=True)
        self._thread.start()
        ready.wait()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None) -> T:
        """Runs ``coro`` on the bridge loop and blocks the calling (worker) thread for its result.

        Raises:
            BridgeTimeout: after ``timeout`` seconds (the coroutine is cancelled).
            RuntimeError: when called from the bridge loop itself (that would deadlock).
            Whatever the coroutine raises.
        """
        loop = self.loop
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("AsyncBridge.run called from the bridge loop")
        future = asyncio.run_coroutine_threadsafe(coro, loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise BridgeTimeout(f"timed out after {timeout} s") from None

    def on_stop(self, closer: Callable[[], Awaitable[None]]) -> None:
        """Registers an async cleanup (close a client session) run on the bridge loop at ``stop``."""
        self._closers.append(closer)

    def stop(self, timeout: float = 5.0) -> None:
        """Runs registered cleanups, then stops and joins the loop thread (idempotent)."""
        if self._loop is None or self._thread is None:
            return

        async def _close_all() -> None:
            for closer in reversed(self._closers):
                try:
                    await closer()
                except Exception:
                    pass

        try:
            asyncio.run_coroutine_threadsafe(_close_all(), self._loop).result(timeout)
        except Exception:
            pass
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout)
        self._loop.close()
        self._thread = None
        self._loop = None
        self._closers.clear()
