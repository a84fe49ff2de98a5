"""Unit tests of ``adapters.feishu.token.TenantToken`` (own async tenant_access_token handling)."""

from __future__ import annotations

import asyncio

import pytest

from adapters.feishu.token import TenantToken


class Fetcher:
    """Issues ``t-1``, ``t-2``, ... with ``expire`` seconds; ``fail`` makes the next fetch raise."""

    def __init__(self, expire: float = 7200.0) -> None:
        self.expire = expire
        self.count = 0
        self.fail = False
        self.gate: asyncio.Event | None = None

    async def __call__(self) -> tuple[str, float]:
        if self.gate is not None:
            await self.gate.wait()
        if self.fail:
            self.fail = False
            raise RuntimeError("token endpoint down")
        self.count += 1
        return f"t-{self.count}", self.expire


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_cached_until_refresh_window_then_refreshed_in_background() -> None:
    fetch, clock = Fetcher(), Clock()
    tokens = TenantToken(fetch, refresh_before_s=600, hard_margin_s=60, clock=clock)
    assert await tokens.get() == "t-1"
    clock.now += 6500  # before expire - 600
    assert await tokens.get() == "t-1" and fetch.count == 1
    clock.now += 200  # inside the refresh window: the old token is served, a refresh starts
    assert await tokens.get() == "t-1"
    await asyncio.sleep(0)
    assert fetch.count == 2 and await tokens.get() == "t-2"


async def test_expired_token_is_awaited_and_concurrent_callers_share_one_fetch() -> None:
    fetch, clock = Fetcher(expire=120), Clock()
    tokens = TenantToken(fetch, refresh_before_s=600, hard_margin_s=60, clock=clock)
    fetch.gate = asyncio.Event()
    waiters = [asyncio.ensure_future(tokens.get()) for _ in range(5)]
    await asyncio.sleep(0)
    fetch.gate.set()
    assert await asyncio.gather(*waiters) == ["t-1"] * 5 and fetch.count == 1
    clock.now += 61  # past expire - hard margin: not served any more
    assert await tokens.get() == "t-2"


async def test_invalidate_and_failures_do_not_loop() -> None:
    fetch = Fetcher()
    tokens = TenantToken(fetch)
    assert await tokens.get() == "t-1"
    tokens.invalidate("t-0")  # an older token: the cached one stays
    assert await tokens.get() == "t-1"
    tokens.invalidate("t-1")
    fetch.fail = True
    with pytest.raises(RuntimeError):
        await tokens.get()
    assert fetch.count == 1
    assert await tokens.get() == "t-2"  # the next call fetches again, once
