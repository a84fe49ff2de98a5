"""The Feishu ``tenant_access_token`` cache, fetched asynchronously by the adapter (never by lark-oapi,
whose fetch is a blocking ``requests`` call on the caller's loop and whose cache is process-global:
PLATFORMS.md §0.1-0.2). Pure asyncio: the fetch coroutine is passed in."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable


class TenantToken:
    """``tenant_access_token`` cache (Feishu auth/v3: valid ``expire`` seconds, 7200 in production).

    One fetch at a time; the token is reused until ``refresh_before_s`` before its expiry, then
    refreshed in the background while the current one is still served, and awaited only once it is
    within ``hard_margin_s`` of expiring. ``invalidate(token)`` drops a token the platform rejected.

    Args:
        fetch: coroutine returning ``(token, expire_seconds)``; raises on failure.
        clock: monotonic seconds (tests may pass their own).
    """

    def __init__(self, fetch: Callable[[], Awaitable[tuple[str, float]]], *, refresh_before_s: float = 600.0,
                 hard_margin_s: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._fetch = fetch
        self._refresh_before = refresh_before_s
        self._hard_margin = hard_margin_s
        self._clock = clock
        self._token: str | None = None
        self._refresh_at = 0.0
        self._usable_until = 0.0
        self._inflight: asyncio.Future[str] | None = None
        self.fetches = 0

    async def get(self) -> str:
        """A valid token (fetching one if needed). Raises what ``fetch`` raised."""
        now = self._clock()
        if self._token is not None and now < self._usable_until:
            if now >= self._refresh_at:
                self._start_fetch()  # proactive: keep serving the current token meanwhile
            return self._token
        return await asyncio.shield(self._start_fetch())

    def invalidate(self, token: str) -> None:
        """Forgets ``token`` if it is the cached one (a newer token is kept)."""
        if self._token == token:
            self._token = None

    def _start_fetch(self) -> asyncio.Future[str]:
        if self._inflight is None or self._inflight.done():
            self._inflight = asyncio.ensure_future(self._do_fetch())
            self._inflight.add_done_callback(lambda f: f.cancelled() or f.exception())  # consumed
        return self._inflight

    async def _do_fetch(self) -> str:
        self.fetches += 1
        token, expire = await self._fetch()
        now = self._clock()
        self._token = token
        self._usable_until = now + max(0.0, expire - self._hard_margin)
        self._refresh_at = now + max(expire / 2, expire - self._refresh_before)
        return token
