"""A new chat's lane is claimed in the transaction that stores its first message: the turn starts
without a claim of its own, and the lease still keeps every other instance out (SQLite and
PostgreSQL alike)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from gateway.bus.lanes import Claimed, SessionBus
from gateway.core.types import ChatAddress, InboundMessage, Sender
from gateway.store.db import create_db_engine, write_tx
from gateway.store.sql import Prefetch, Store
from tests.helpers import wait_until


@pytest.fixture
def store(db_url):
    engine = create_db_engine(db_url)
    yield Store(engine)
    engine.dispose()


def message(message_id: str, text: str = "hi") -> InboundMessage:
    return InboundMessage(ChatAddress("telegram", "1", "5"), message_id, "dm", Sender("5", "A"), text)


def admit(store: Store, msg: InboundMessage, key: str, claim) -> object:
    """Stores ``msg`` and runs ``claim(conn)`` in the same write transaction, as the admit does."""
    with write_tx(store.engine) as conn:
        store.insert_inbound_in(conn, msg, key)
        return claim(conn)


def test_a_new_lanes_prefetch_is_told_it_is_fresh_and_opens_the_chats_first_session(store):
    """The prefetch of a lane created in the admit is told so (``fresh``): the session it opens
    there, without looking for one, is the lane's, committed with the admit; a lane claimed the
    ordinary way is not fresh and finds that session again."""
    told: list[bool] = []

    def opened(conn, batch, fresh):
        told.append(fresh)
        return store.open_session_in(conn, "k", lambda: "prompt", 10, fresh=fresh)

    first = Prefetch(opened)
    assert admit(store, message("5:1"), "k", lambda conn: store.claim_new_lane_in(conn, "k", "a", 60, 1, first))
    first.commit()
    assert told == [True] and first.value.last_used_at is None  # created for this turn
    assert store.current_session_id("k") == first.value.session_id
    store.release_lane("k", "a")
    admit(store, message("5:2"), "k", lambda conn: None)
    again = Prefetch(opened)
    assert store.claim_next("k", "b", 60, 5, again)
    assert told == [True, False] and again.value.session_id == first.value.session_id
    assert again.value.last_used_at is not None  # found, not created


def test_a_new_lane_is_claimed_with_its_first_row_and_an_existing_one_is_left_alone(store):
    read = Prefetch(lambda conn, batch, fresh: [p.message.text for p in batch])
    claimed = admit(store, message("5:1", "first"), "k",
                    lambda conn: store.claim_new_lane_in(conn, "k", "a", 60, 1, read))
    assert claimed is not None
    batch, generation = claimed
    assert [p.message.text for p in batch] == ["first"] and generation == 0
    read.commit()
    assert read.value == ["first"]  # the prefetch ran on the batch, in that transaction
    assert not store.claim_lane("k", "b", 60)  # the lease is a's: no other instance takes the turn

    # The lane exists now: a second message neither claims it nor touches a's lease.
    again = admit(store, message("5:2", "second"), "k",
                  lambda conn: store.claim_new_lane_in(conn, "k", "b", 60, 1, None))
    assert again is None
    assert not store.claim_lane("k", "b", 60) and store.claim_lane("k", "a", 60)

    # Released and free, it is still not new: the ordinary claim takes it (the oldest row first).
    store.release_lane("k", "a")
    assert admit(store, message("5:3"), "k", lambda conn: store.claim_new_lane_in(conn, "k", "b", 60, 1, None)) is None
    batch, _ = store.claim_next("k", "b", 60)
    assert [p.message.text for p in batch] == ["first"]


def finishing(store: Store, ran: list[str]):
    """A turn that only marks its rows done and records their texts (``SessionBus.run_turn``)."""
    def run_turn(batch, generation, then, ready) -> str:
        ran.extend(p.message.text for p in batch)
        store.finish_turn([p.inbox_id for p in batch], "done", [], then=then)
        return "done"
    return run_turn


@contextlib.asynccontextmanager
async def running_bus(store: Store, ran: list[str], lease_s: float = 60.0) -> AsyncIterator[SessionBus]:
    """A started bus of instance ``a`` on ``store`` whose turns are ``finishing``, stopped after."""
    with ThreadPoolExecutor(2) as workers:
        bus = SessionBus(store=store, run_turn=finishing(store, ran), workers=workers, instance_id="a",
                         lease_s=lease_s, sweep_interval_s=3600, busy_policy="queue",
                         on_turn_start=lambda address: None, on_turn_end=lambda address: None)
        await bus.start()
        try:
            yield bus
        finally:
            await bus.stop()


async def test_a_lane_claimed_with_its_first_row_runs_its_turn_once(store):
    ran: list[str] = []
    async with running_bus(store, ran) as bus:
        claimed = admit(store, message("5:1", "first"), "k", lambda conn: bus.claim_new_in(conn, "k"))
        assert isinstance(claimed, Claimed)
        bus.kick("k", claimed)
        bus.kick("k")  # a second kick meanwhile (another message's) adds no second turn
        await wait_until(lambda: bus.idle and ran, what="the turn")
        await asyncio.sleep(0.1)
    assert ran == ["first"]
    assert store.claim_lane("k", "b", 60)  # the lease was given up after the turn


async def test_a_claim_that_waited_past_its_lease_is_not_trusted(store):
    """Claimed with the first row, then the drain starts only after the lease ran out and another
    instance took the lane and its row: the drain claims again, fails, and runs nothing."""
    ran: list[str] = []
    async with running_bus(store, ran, lease_s=0.3) as bus:
        claimed = admit(store, message("5:1", "first"), "k", lambda conn: bus.claim_new_in(conn, "k"))
        assert claimed is not None
        await asyncio.sleep(0.4)
        taken = store.claim_next("k", "b", 60)  # the other instance runs the turn
        assert taken is not None and [p.message.text for p in taken[0]] == ["first"]
        bus.kick("k", claimed)
        await wait_until(lambda: bus.idle, what="the drain")
    assert ran == []


async def test_a_lane_claimed_while_the_bus_stops_is_given_up_at_once(store):
    ran: list[str] = []
    async with running_bus(store, ran) as bus:
        claimed = admit(store, message("5:1", "first"), "k", lambda conn: bus.claim_new_in(conn, "k"))
        assert claimed is not None
        bus.begin_stop()
        assert admit(store, message("5:2"), "k2", lambda conn: bus.claim_new_in(conn, "k2")) is None
        bus.kick("k", claimed)
        # another instance need not wait for the lease to run out
        await wait_until(lambda: store.claim_lane("k", "b", 60), what="the lease given up")
    assert ran == []
