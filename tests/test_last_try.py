"""A turn's last try after crashes (``bus.max_turn_crashes`` - 1 counted) marks its inbox rows
while it runs and clears the mark however it ends short of a crash, here a graceful stop and a
completed answer: ``TurnRunner`` with a real SQLite store and the real openai client against the
fake chat-completions server. A mark left behind counted the next crash for a turn that only
waited (found by a review)."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import text

from agent.bridge import AsyncBridge
from agent.budget import Limits
from agent.cache import AgentCache, AgentSpec
from agent.model import OpenAIChatModel
from agent.tools import ToolRegistry
from gateway.bus.turns import TurnRunner
from gateway.core.errors import TurnInterrupted
from gateway.core.types import ChatAddress, InboundMessage, Sender
from gateway.store.db import create_db_engine, upgrade
from gateway.store.sql import Store
from tests.fakes import openai as oa

KEY = "dm:u1"


@pytest.fixture
def rig(tmp_path, fake_openai):
    fake_openai.reset()
    engine = create_db_engine(f"sqlite:///{tmp_path / 't.db'}")
    upgrade(engine)
    store = Store(engine)
    agents = AgentCache(ToolRegistry(), lambda spec: OpenAIChatModel(base_url=spec.base_url, api_key=spec.api_key,
                                                                     model=spec.model, max_retries=0))
    bridge = AsyncBridge()
    bridge.start()
    runner = TurnRunner(store=store, agents=agents, bridge=bridge, limits=Limits(), history_window=40,
                        system_prompt="Be brief.", max_crashes=3,
                        spec=AgentSpec("gpt-4o-mini", f"{fake_openai.url}/v1", "sk-test", ()))
    yield store, runner
    bridge.stop()
    engine.dispose()


def _pending_after_crashes(store: Store, crashes: int) -> list:
    msg = InboundMessage(ChatAddress("telegram", "1", "42"), "m1", "dm", Sender("42", "ann"), "hello")
    assert store.insert_inbound(msg, KEY)
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE inbox SET crashes = :n"), {"n": crashes})
    return store.pending_batch(KEY, 5)


def _marked(store: Store) -> list[bool]:
    with store.engine.connect() as conn:
        return [bool(v) for v in conn.execute(text("SELECT last_try FROM inbox ORDER BY id")).scalars()]


def test_a_last_try_stopped_by_a_graceful_stop_leaves_no_mark(rig, fake_openai):
    store, runner = rig
    fake_openai.responder = lambda body: oa.text("hi there")
    batch = _pending_after_crashes(store, 2)
    seen: list[list[bool]] = []
    runner.stopping.set()
    original = runner._run

    def run_seeing_the_mark(*args, **kwargs):
        seen.append(_marked(store))
        return original(*args, **kwargs)

    runner._run = run_seeing_the_mark  # type: ignore[method-assign]
    with pytest.raises(TurnInterrupted):
        runner.run(batch, 0)
    assert seen == [[True]]  # marked while it ran
    assert _marked(store) == [False]  # and no longer: the next crash is not its own
    assert [p.crashes for p in store.pending_batch(KEY, 5)] == [2]  # still pending, resumed at the next start


def test_a_last_try_that_answers_leaves_no_mark_and_last_tries_run_one_at_a_time(rig, fake_openai):
    store, runner = rig
    fake_openai.responder = lambda body: oa.text("hi there")
    batch = _pending_after_crashes(store, 2)
    assert runner._last_tries.acquire(timeout=1)  # another last try is running
    outcome: list[str] = []
    worker = threading.Thread(target=lambda: outcome.append(runner.run(batch, 0)))
    worker.start()
    worker.join(0.5)
    assert worker.is_alive() and not fake_openai.requests  # waits for it, unmarked
    assert _marked(store) == [False]
    runner._last_tries.release()
    worker.join(20)
    assert outcome == ["done"] and _marked(store) == [False]
    assert len(fake_openai.requests) == 1
