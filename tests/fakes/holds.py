"""Held answers for the fakes: a call is received and takes effect, but its answer waits until the
test releases it. A client killed meanwhile (``kill -9`` of the gateway) never learns the outcome,
which is what the exactly-once rules must survive."""

from __future__ import annotations

import asyncio
import threading
import time


class Holds:
    """Per route name: how many coming calls to hold, how many are held now, and the release."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next: dict[str, int] = {}
        self._held: dict[str, int] = {}
        self._released = threading.Event()

    def hold_next(self, name: str, count: int = 1) -> None:
        """The next ``count`` calls of ``name`` take effect but are not answered until ``release``."""
        with self._lock:
            self._next[name] = self._next.get(name, 0) + count
            self._released.clear()

    def held(self, name: str) -> int:
        """Calls of ``name`` waiting for their answer now."""
        with self._lock:
            return self._held.get(name, 0)

    def wait_held(self, name: str, timeout: float = 10.0) -> None:
        """Blocks until a call of ``name`` is held (``TimeoutError`` after ``timeout``)."""
        deadline = time.monotonic() + timeout
        while self.held(name) == 0:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {name} call was held within {timeout} s")
            time.sleep(0.01)

    def release(self) -> None:
        """Answers every held call (to whoever is still connected)."""
        self._released.set()

    async def gate(self, name: str) -> None:
        """Called by a fake once the call took effect: returns at once, or after ``release``."""
        with self._lock:
            if not self._next.get(name):
                return
            self._next[name] -= 1
            self._held[name] = self._held.get(name, 0) + 1
        try:
            while not self._released.is_set():
                await asyncio.sleep(0.02)
        finally:
            with self._lock:
                self._held[name] -= 1
