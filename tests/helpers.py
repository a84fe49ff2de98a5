"""Small helpers shared by the end-to-end tests."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


async def wait_until(predicate: Callable[[], object], timeout: float = 10.0, what: str = "condition") -> None:
    """Polls ``predicate`` every 20 ms until it is truthy; fails the test after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")
