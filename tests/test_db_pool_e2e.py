"""The database pool under load, end to end: 200 Telegram DMs in flight at once against a pool of
5 connections (``database.pool_size = 5``, ``agent.worker_threads = 200``), on SQLite and on
PostgreSQL, through the real python-telegram-bot and openai clients against the loopback fakes.
Each turn fetches a page with ``web_fetch`` and waits 1 s on the model. Every turn must complete
with its own answer, and no connection may be held while a turn waits on the model or a tool
(``tests.pool_guard.PoolGuard``, checked on every model request and every page fetch)."""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Iterator

import pytest
from aiohttp import web

from agent.model import OpenAIChatModel
from gateway.store.db import create_db_engine, read_tx
from tests.conftest import TEST_TOKEN, gateway_config, start_gateway
from tests.fakes import openai as oa
from tests.fakes.server import ThreadedServer
from tests.fakes.telegram import FakeTelegram
from tests.helpers import wait_until
from tests.pool_guard import PoolGuard
from tests.test_telegram_e2e import dm_update, sends_to

TURNS = 200
POOL_SIZE = 5
MODEL_WAIT_S = 1.0


@pytest.fixture
def fake_telegram() -> Iterator[FakeTelegram]:
    """A fresh Bot API fake per test (both backends use the same chat ids)."""
    with FakeTelegram(token=TEST_TOKEN) as fake:
        yield fake


class Pages(ThreadedServer):
    """Serves ``/doc/<n>``; calls ``on_fetch`` while each request is in flight (the turn is then
    inside its tool call), then answers after ``delay_s``."""

    def __init__(self, delay_s: float = 0.2) -> None:
        super().__init__()
        self.delay_s = delay_s
        self.on_fetch = lambda: None
        self.fetched = 0
        self._lock = threading.Lock()

    def build_app(self) -> web.Application:
        async def doc(request: web.Request) -> web.Response:
            self.on_fetch()
            with self._lock:
                self.fetched += 1
            await asyncio.sleep(self.delay_s)
            n = request.match_info["n"]
            return web.Response(text=f"<html><body><p>Document {n} says the code is c{n}x.</p></body></html>",
                                content_type="text/html")

        app = web.Application()
        app.add_routes([web.get("/doc/{n}", doc)])
        return app


@pytest.fixture(scope="module")
def pages() -> Iterator[Pages]:
    with Pages() as server:
        yield server


def respond_with_fetch(pages: Pages):
    """The model: a question ``doc N`` gets a ``web_fetch`` of ``/doc/N`` after ``MODEL_WAIT_S``;
    the page's result gets the code it found, at once."""

    def respond(request: dict) -> oa.Reply:
        last = request["messages"][-1]
        if last["role"] == "tool":
            found = re.search(r"the code is (c\d+x)", last["content"])
            return oa.text(f"The code is {found.group(1) if found else 'missing'}.")
        n = re.search(r"doc (\d+)", last["content"]).group(1)
        return oa.delay(MODEL_WAIT_S, oa.tool_calls(oa.call("web_fetch", {"url": f"{pages.url}/doc/{n}"})))

    return respond


async def test_200_turns_in_flight_complete_on_a_pool_of_5_and_none_holds_a_connection_while_waiting(
        tmp_path, db_url, fake_telegram, fake_openai, pages, running, monkeypatch):
    fake_openai.reset()
    fake_openai.responder = respond_with_fetch(pages)
    config = gateway_config(tmp_path, fake_openai, fake_telegram, database={"url": db_url, "pool_size": POOL_SIZE},
                            agent={"worker_threads": TURNS})
    gateway = await start_gateway(config, running)
    guard = PoolGuard(gateway.engine, monkeypatch)
    in_flight = [0]

    def on_request(_body: dict) -> None:
        guard.check()
        in_flight[0] = max(in_flight[0], sum(1 for r in fake_openai.requests if r["status"] is None))

    fake_openai.on_request = on_request
    pages.on_fetch = guard.check
    fetched_before = pages.fetched
    users = [5570000 + n for n in range(TURNS)]
    try:
        for n, user in enumerate(users):
            fake_telegram.inject(dm_update(f"what does doc {n} say?", 100 + n, user_id=user))
        await wait_until(lambda: guard.violations or sum(len(sends_to(fake_telegram, u)) for u in users) >= TURNS,
                         timeout=120, what=f"{TURNS} replies")
    finally:
        fake_openai.on_request = None
        pages.on_fetch = lambda: None
        guard.close()

    assert guard.violations == []
    assert [[c.params["text"] for c in sends_to(fake_telegram, u)] for u in users] == \
        [[f"The code is c{n}x."] for n in range(TURNS)]  # each turn once, with its own answer
    assert pages.fetched - fetched_before == TURNS
    assert guard.checks == 3 * TURNS and guard.waiting_seen >= 3 * TURNS  # every check saw the waiting turn
    capacity = gateway.engine.pool.size() + gateway.engine.pool._max_overflow  # type: ignore[attr-defined]
    assert capacity == 2 * POOL_SIZE
    assert in_flight[0] > capacity  # more turns waited on the model at once than there are connections
    assert gateway.store.count_inbox("pending") == 0 and gateway.store.count_inbox("failed") == 0


def test_the_guard_sees_a_connection_held_across_a_model_call(tmp_path, fake_openai, monkeypatch):
    """The guard itself: a thread that keeps a transaction open around a model call is reported;
    the same call without it is not."""
    engine = create_db_engine(f"sqlite:///{tmp_path / 'guard.db'}", POOL_SIZE)
    guard = PoolGuard(engine, monkeypatch)
    fake_openai.reset()
    fake_openai.responder = lambda req: oa.text("ok")
    model = OpenAIChatModel(base_url=f"{fake_openai.url}/v1", api_key="sk-test", model="gpt-4o-mini", timeout_s=10,
                            max_retries=0)
    try:
        fake_openai.on_request = lambda _body: guard.check()
        model.complete([{"role": "user", "content": "hi"}], [])
        assert guard.violations == [] and guard.waiting_seen == 1
        with read_tx(engine):
            guard.assert_clean()  # a transaction outside any call is not the fault
        with read_tx(engine):
            model.complete([{"role": "user", "content": "hi again"}], [])
        (violation,) = guard.violations
        assert violation == "thread MainThread holds a connection across a model call"
    finally:
        fake_openai.on_request = None
        guard.close()
        engine.dispose()
