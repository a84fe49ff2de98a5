"""The turn pool (``gateway.bus.pool.TurnPool``): turns in flight bounded by
``agent.max_turns_in_flight``, not by a small fixed pool; the rest wait (nothing dropped); a turn
waiting for a provider's ``max_concurrency`` slot does not hold a place (the real ``openai`` client
and routing against the fake OpenAI API)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
from pydantic import ValidationError

from agent.model import OpenAIChatModel
from agent.providers import Provider, Target
from agent.routing import HealthBoard, RoutedModel
from gateway.bus.pool import TurnPool
from gateway.core.config import AgentConfig, DatabaseConfig, load_config
from tests.fakes import openai as oa


def _until(predicate: Callable[[], object], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def test_turns_start_on_demand_up_to_the_bound_and_the_rest_wait_their_turn():
    pool = TurnPool(3, warm=0, name="t")
    gate = threading.Event()
    running: list[int] = []

    def turn(i: int) -> int:
        running.append(i)
        gate.wait(10)
        return i

    assert pool.threads == 0  # nothing kept warm: threads start with the work
    futures = [pool.submit(turn, i) for i in range(8)]
    _until(lambda: len(running) == 3)
    time.sleep(0.2)  # room for a fourth to start, were it allowed
    assert len(running) == 3 and pool.in_flight == 3 and pool.queued == 5 and pool.threads == 3
    gate.set()
    assert sorted(f.result(10) for f in futures) == list(range(8))  # every one ran, once
    assert sorted(running) == list(range(8)) and pool.threads <= 3
    pool.shutdown()
    assert pool.threads == 0


def test_a_burst_gets_a_thread_per_turn_and_extra_threads_end_when_idle():
    pool = TurnPool(64, warm=2, idle_s=0.2, name="t")
    assert pool.threads == 2  # kept warm from the start
    gate = threading.Event()
    futures = [pool.submit(gate.wait, 10) for _ in range(40)]
    _until(lambda: pool.in_flight == 40)  # all at once: no waves of a small pool
    gate.set()
    assert all(f.result(10) for f in futures)
    _until(lambda: pool.threads == 2)  # the burst's extra threads ended; the warm ones stay
    pool.shutdown()


def test_shutdown_can_cancel_what_still_waits():
    pool = TurnPool(1, name="t")
    gate = threading.Event()
    first = pool.submit(gate.wait, 10)
    waiting = pool.submit(lambda: "never")
    _until(lambda: pool.in_flight == 1)
    gate.set()
    pool.shutdown(wait=True, cancel_futures=True)
    assert first.result(1) is True
    assert waiting.cancelled() or waiting.result(1) == "never"


def test_max_turns_in_flight_is_the_bound_and_worker_threads_only_the_warm_threads_below_it(monkeypatch):
    assert AgentConfig().turns_in_flight() >= 512
    assert AgentConfig(worker_threads=1000).turns_in_flight() == 1000  # an old config's pool size
    assert AgentConfig(max_turns_in_flight=64, worker_threads=4).turns_in_flight() == 64
    # a bound set below the default warm threads is the bound, and no more threads are kept
    small = AgentConfig(max_turns_in_flight=2)
    assert (small.turns_in_flight(), small.warm_threads()) == (2, 2)
    both = AgentConfig(max_turns_in_flight=100, worker_threads=1000)
    assert (both.turns_in_flight(), both.warm_threads()) == (100, 100)
    monkeypatch.setenv("GATEWAY__AGENT__MAX_TURNS_IN_FLIGHT", "2")  # as an operator sets it
    assert load_config(None).agent.turns_in_flight() == 2


def test_thread_and_connection_counts_out_of_range_are_refused():
    with pytest.raises(ValidationError, match="worker_threads"):
        AgentConfig(worker_threads=10**20)  # would start threads until the process dies
    with pytest.raises(ValidationError, match="pool_size"):
        DatabaseConfig(pool_size=0)  # SQLAlchemy reads 0 as no limit at all


def test_turns_waiting_for_a_slow_providers_slot_leave_room_for_other_providers(fake_openai):
    """Two providers on the fake API: ``slow`` (``max_concurrency = 1``, its answer held) and
    ``fast``. With 3 turns in flight at most, 4 turns for ``slow`` and then 2 for ``fast``: the
    slow ones beyond its one slot are parked, so the fast ones are answered while slow still holds
    (without parking, three slow turns would hold every place until slow answers)."""
    fake_openai.reset()
    gate = threading.Event()
    fake_openai.responder = lambda body: oa.hold(gate, "slow answer") if body["model"] == "slow-model" \
        else oa.text("fast answer")
    url = f"{fake_openai.url}/v1"
    providers = {"slow": Provider("slow", url, fake_openai.api_key, max_concurrency=1),
                 "fast": Provider("fast", url, fake_openai.api_key)}
    pool = TurnPool(3, name="t")
    board = HealthBoard(providers, waiting=pool.parked)

    def client(target: Target, last: bool) -> OpenAIChatModel:
        return OpenAIChatModel(base_url=url, api_key=fake_openai.api_key, model=target.model, max_retries=0)

    slow = RoutedModel("slow", [Target(providers["slow"], "slow-model")], client, board)
    fast = RoutedModel("fast", [Target(providers["fast"], "fast-model")], client, board)

    def turn(model: RoutedModel) -> str:
        return model.complete([{"role": "user", "content": "hi"}], []).content or ""

    try:
        slow_turns = [pool.submit(turn, slow) for _ in range(4)]
        _until(lambda: len(fake_openai.requests) == 1)  # slow's one slot is taken
        fast_turns = [pool.submit(turn, fast) for _ in range(2)]
        assert [f.result(15) for f in fast_turns] == ["fast answer", "fast answer"]
        assert not any(f.done() for f in slow_turns)  # slow still holds its answer
        assert sum(1 for r in fake_openai.requests if r["json"]["model"] == "slow-model") == 1  # its limit held
        gate.set()
        assert [f.result(15) for f in slow_turns] == ["slow answer"] * 4
    finally:
        gate.set()
        pool.shutdown()


def test_a_new_thread_is_started_off_the_submitting_thread() -> None:
    """``submit`` returns before the new worker runs (the event loop never waits for a thread's
    start-up); the work still runs on a worker named after the pool."""
    import threading as th

    pool = TurnPool(4, warm=0, name="s")
    spawned: list[str] = []
    real_start = th.Thread.start

    def start(self: th.Thread) -> None:
        spawned.append(th.current_thread().name)
        real_start(self)

    th.Thread.start = start  # type: ignore[method-assign]
    try:
        ran = pool.submit(lambda: th.current_thread().name).result(5)
    finally:
        th.Thread.start = real_start  # type: ignore[method-assign]
        pool.shutdown()
    assert ran.startswith("s_") and ran != "s_starter"
    assert spawned and all(name == "s_starter" for name in spawned), spawned

