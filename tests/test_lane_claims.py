"""A new chat's lane is claimed in the transaction that stores its first message: the turn starts
without a claim of its own, and the lease still keeps every other instance out (SQLite and
PostgreSQL alike); an admit that waited for another transaction on the lane reads its batch and
generation as that transaction left them."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
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
    assert admit(store, message("5:1"), "k", lambda conn: store.claim_free_lane_in(conn, "k", "a", 60, 1, first))
    first.commit()
    assert told == [True] and first.value.last_used_at is None  # created for this turn
    assert store.current_session_id("k") == first.value.session_id
    store.release_lane("k", "a")
    admit(store, message("5:2"), "k", lambda conn: None)
    again = Prefetch(opened)
    assert store.claim_next("k", "b", 60, 5, again)
    assert told == [True, False] and again.value.session_id == first.value.session_id
    assert again.value.last_used_at is not None  # found, not created


def test_a_free_lane_is_claimed_with_its_oldest_row_and_a_held_one_is_left_alone(store):
    read = Prefetch(lambda conn, batch, fresh: [p.message.text for p in batch])
    claimed = admit(store, message("5:1", "first"), "k",
                    lambda conn: store.claim_free_lane_in(conn, "k", "a", 60, 1, read))
    assert claimed is not None
    batch, generation = claimed
    assert [p.message.text for p in batch] == ["first"] and generation == 0
    read.commit()
    assert read.value == ["first"]  # the prefetch ran on the batch, in that transaction
    assert not store.claim_lane("k", "b", 60)  # the lease is a's: no other instance takes the turn

    # Held (a turn runs on a): a second message neither claims it nor touches a's lease, not even
    # for a itself (its running drain takes the row).
    for owner in ("b", "a"):
        again = admit(store, message(f"5:2{owner}", "second"), "k",
                      lambda conn, owner=owner: store.claim_free_lane_in(conn, "k", owner, 60, 1, None))
        assert again is None
    assert not store.claim_lane("k", "b", 60) and store.claim_lane("k", "a", 60)

    # Free again (the turn ended): the next message's admit claims it, with the oldest row first.
    store.release_lane("k", "a")
    claimed = admit(store, message("5:3"), "k", lambda conn: store.claim_free_lane_in(conn, "k", "b", 60, 1, None))
    assert claimed is not None and [p.message.text for p in claimed[0]] == ["first"]
    assert not store.claim_lane("k", "a", 60)  # b's now

    # Expired (its holder died): taken over the same way.
    store.release_lane("k", "b")
    assert store.claim_lane("k", "a", -1)  # a lease that ran out already
    claimed = admit(store, message("5:4"), "k", lambda conn: store.claim_free_lane_in(conn, "k", "b", 60, 1, None))
    assert claimed is not None and not store.claim_lane("k", "a", 60)


def finishing(store: Store, ran: list[str], gate: threading.Event | None = None):
    """A turn that only marks its rows done and records their texts (``SessionBus.run_turn``);
    with ``gate``, it first waits for it to be set."""
    def run_turn(batch, generation, then, ready) -> str:
        if gate is not None:
            gate.wait(10)
        ran.extend(p.message.text for p in batch)
        store.finish_turn([p.inbox_id for p in batch], "done", [], then=then)
        return "done"
    return run_turn


@contextlib.asynccontextmanager
async def running_bus(store: Store, ran: list[str], lease_s: float = 60.0,
                      gate: threading.Event | None = None) -> AsyncIterator[SessionBus]:
    """A started bus of instance ``a`` on ``store`` whose turns are ``finishing``, stopped after."""
    with ThreadPoolExecutor(2) as workers:
        bus = SessionBus(store=store, run_turn=finishing(store, ran, gate), workers=workers, instance_id="a",
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
        claimed = admit(store, message("5:1", "first"), "k", lambda conn: bus.claim_free_in(conn, "k"))
        assert isinstance(claimed, Claimed)
        bus.kick("k", claimed)
        bus.kick("k")  # a second kick meanwhile (another message's) adds no second turn
        await wait_until(lambda: bus.idle and ran, what="the turn")
        await asyncio.sleep(0.1)
    assert ran == ["first"]
    assert store.claim_lane("k", "b", 60)  # the lease was given up after the turn


async def test_a_chats_next_message_is_claimed_in_its_admit_unless_a_turn_of_it_runs(store):
    """Once a chat's turn ended its lane is free, and the next message's admit claims it (no claim
    transaction of its own); while a turn of the chat runs here the admit claims nothing, and that
    turn's drain runs the message after it, once."""
    ran: list[str] = []
    gate = threading.Event()
    gate.set()
    async with running_bus(store, ran, gate=gate) as bus:
        first = admit(store, message("5:1", "first"), "k", lambda conn: bus.claim_free_in(conn, "k"))
        bus.kick("k", first)
        await wait_until(lambda: bus.idle and ran == ["first"], what="the first turn")
        gate.clear()  # the next turn holds its lane until the gate opens
        second = admit(store, message("5:2", "second"), "k", lambda conn: bus.claim_free_in(conn, "k"))
        assert isinstance(second, Claimed) and [p.message.text for p in second.batch] == ["second"]
        bus.kick("k", second)
        await wait_until(lambda: not bus.idle, what="the second turn")
        third = admit(store, message("5:3", "third"), "k", lambda conn: bus.claim_free_in(conn, "k"))
        assert third is None  # its drain runs here: it reads the row after the running turn
        bus.kick("k", third)
        gate.set()
        await wait_until(lambda: bus.idle and len(ran) == 3, what="the turns")
        await asyncio.sleep(0.1)
    assert ran == ["first", "second", "third"]
    assert store.claim_lane("k", "b", 60)  # given up after the last turn


async def test_a_claim_that_waited_past_its_lease_is_not_trusted(store):
    """Claimed with the first row, then the drain starts only after the lease ran out and another
    instance took the lane and its row: the drain claims again, fails, and runs nothing."""
    ran: list[str] = []
    async with running_bus(store, ran, lease_s=0.3) as bus:
        claimed = admit(store, message("5:1", "first"), "k", lambda conn: bus.claim_free_in(conn, "k"))
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
        claimed = admit(store, message("5:1", "first"), "k", lambda conn: bus.claim_free_in(conn, "k"))
        assert claimed is not None
        bus.begin_stop()
        assert admit(store, message("5:2"), "k2", lambda conn: bus.claim_free_in(conn, "k2")) is None
        bus.kick("k", claimed)
        # another instance need not wait for the lease to run out
        await wait_until(lambda: store.claim_lane("k", "b", 60), what="the lease given up")
    assert ran == []


def _admit_meanwhile(store: Store, key: str, text: str, many: bool) -> tuple[threading.Thread, list]:
    """Starts another instance's admit of a message for ``key`` on a thread (it waits for the
    transaction the caller holds open); its claim's result lands in the returned list. ``many``:
    the claim is a batch's (``claim_free_lanes_in``, with a new chat beside ``key``: on PostgreSQL
    the set-based statement), else the single lane's."""
    out: list = []

    def claim(conn):
        if not many:
            return store.claim_free_lane_in(conn, key, "B", 60, 10, None)
        claimed = store.claim_free_lanes_in(conn, [key, "zz-new"], "B", 60, 10, lambda: None)
        return claimed[key][:2] if key in claimed else None

    def other() -> None:
        out.append(admit(store, message(f"5:{text}", text), key, claim))

    thread = threading.Thread(target=other)
    thread.start()
    return thread, out


@pytest.mark.parametrize("many", [False, True], ids=["lane", "batch"])
def test_an_admit_waiting_for_the_owners_finish_does_not_take_the_row_that_finish_answered(store, many):
    """Another instance's admit finds the lane's lease expired (its owner stalled) while the owner
    is finishing its turn: it waits for the owner's transaction, then claims the lane the finish
    freed. Its batch is read after that wait, so it holds only its own message, never the one the
    owner just answered (PostgreSQL: a read in the claim's statement would see that row as
    pending still, and answer it twice)."""
    from sqlalchemy import text as sql

    from gateway.store import prepared as q
    from gateway.store.sql import run

    key = "k"
    assert store.claim_lane(key, "A", 60)
    store.insert_inbound(message("5:1"), key)
    [answered] = store.pending_batch(key, 10)
    with write_tx(store.engine) as conn:
        conn.execute(sql("UPDATE lanes SET lease_until = 1 WHERE key = :k"), {"k": key})  # A stalled
    with write_tx(store.engine) as conn:  # A's finish: its row done, nothing else waits, lane given up
        run(conn, q.FINISH_INBOX, {"b_id": answered.inbox_id, "status": "done", "finished_at": 1.0})
        assert store._next_or_release(conn, key, "A", 10)[0] == []
        thread, out = _admit_meanwhile(store, key, "second", many)
        thread.join(0.5)  # B waits for A's transaction (SQLite: for the writer; PostgreSQL: the lane's row)
    thread.join(10)
    [(batch, generation)] = out
    assert [p.message.text for p in batch] == ["second"] and generation == 0


@pytest.mark.parametrize("many", [False, True], ids=["lane", "batch"])
def test_an_admit_waiting_for_a_stop_runs_under_the_generation_the_stop_set(store, many):
    """A ``/stop`` moves a free lane's generation on while another instance's admit for the chat
    waits for it: the admit's claim then returns the new generation, so its message (sent after
    the stop) is answered, not cancelled as one of the stopped turn's (PostgreSQL: the claim's own
    snapshot still held the old generation)."""
    key = "k"
    assert store.claim_lane(key, "Z", 60)
    assert store.release_lane(key, "Z") is False  # a free lane, generation 0, nothing waiting
    with write_tx(store.engine) as conn:
        store.insert_inbound_in(conn, message("5:stop", "/stop"), key, cancel="always")
        thread, out = _admit_meanwhile(store, key, "after", many)
        thread.join(0.5)
    thread.join(10)
    [(batch, generation)] = out
    assert generation == store.lane_generation(key) == 1
    assert "after" in [p.message.text for p in batch]


async def test_a_kick_whose_workers_shut_down_before_its_drain_left_leaves_no_lane_busy(store):
    """The drain goes to a worker from the loop's next iteration: when the workers were shut down
    in between (a stop that gave up waiting), the lane is not left marked busy, nothing raises on
    the loop, and the row stays pending for the next start."""
    ran: list[str] = []
    failures: list[dict] = []
    asyncio.get_running_loop().set_exception_handler(lambda loop, context: failures.append(context))
    workers = ThreadPoolExecutor(1)
    bus = SessionBus(store=store, run_turn=finishing(store, ran), workers=workers, instance_id="a",
                     lease_s=60, sweep_interval_s=3600, busy_policy="queue",
                     on_turn_start=lambda address: None, on_turn_end=lambda address: None)
    await bus.start()
    try:
        admit(store, message("5:1", "first"), "k", lambda conn: None)
        bus.kick("k")
        assert not bus.idle  # scheduled
        workers.shutdown(wait=True)
        await asyncio.sleep(0.05)
        assert bus.idle and ran == [] and failures == []
    finally:
        await bus.stop()
    assert store.keys_waiting(time.time()) == ["k"]  # the sweeper of the next start finds it


def _store_rows(store: Store, rows: list[tuple[str, str]], claim) -> object:
    """Stores a batch's ``(key, text)`` rows in one write transaction and runs ``claim(conn)`` in it,
    as a batch's admit does."""
    with write_tx(store.engine) as conn:
        for index, (key, text) in enumerate(rows):
            store.insert_inbound_in(conn, message(f"{key}:{index}", text), key)
        return claim(conn)


def test_a_batchs_lanes_are_claimed_together_new_ones_with_their_sessions_held_ones_left_alone(store):
    """A batch's admit claims its lanes in one go (PostgreSQL: one statement for the lot, the new
    lanes' sessions written together): each new lane is claimed with its oldest row and gets the
    session its prefetch opened; a lane that existed and was free or whose lease ran out is claimed
    with its oldest row; a lane another instance holds is left alone, its lease untouched."""
    for key in ("free", "expired", "held"):
        assert store.claim_lane(key, "Z", 60 if key == "held" else -1)
    store.release_lane("free", "Z")
    store.insert_inbound(message("free:old", "free first"), "free")
    told: dict[str, bool] = {}

    def opened(conn, batch, fresh):
        key = batch[-1].session_key
        told[key] = bool(fresh)
        return store.open_session_in(conn, key, lambda: f"prompt {key}", 10, fresh=fresh)

    keys = ["new-b", "free", "new-a", "held", "expired"]
    rows = [("new-b", "b1"), ("free", "free second"), ("new-a", "a1"), ("new-b", "b2"), ("held", "h1"),
            ("expired", "e1")]
    claimed = _store_rows(store, rows, lambda conn: store.claim_free_lanes_in(
        conn, keys, "a", 60, 1, lambda: Prefetch(opened)))
    assert sorted(claimed) == ["expired", "free", "new-a", "new-b"]
    texts = {key: [p.message.text for p in batch] for key, (batch, _generation, _prefetch) in claimed.items()}
    assert texts == {"new-b": ["b1"], "new-a": ["a1"], "free": ["free first"], "expired": ["e1"]}
    assert told == {"new-b": True, "new-a": True, "free": False, "expired": False}
    for key, (_batch, generation, prefetch) in claimed.items():
        prefetch.commit()
        assert generation == 0
        assert store.current_session_id(key) == prefetch.value.session_id  # the lane points at it
        assert prefetch.value.system_prompt == f"prompt {key}"
        assert not store.claim_lane(key, "b", 60)  # a's now
    assert not store.claim_lane("held", "a", 60) and store.claim_lane("held", "Z", 60)  # still Z's


def test_an_instance_whose_batch_waits_on_another_instances_new_lanes_claims_none_of_them(store):
    """Two instances admit batches naming the same new chats: the second one's claim waits for the
    first one's uncommitted lanes (PostgreSQL: their keys' index entries; SQLite: the writer) and
    then takes none of them, only the chat the first did not name; each lane is won once."""
    keys = [f"chat-{n:02d}" for n in range(6)]
    with write_tx(store.engine) as conn:
        for index, key in enumerate(keys):
            store.insert_inbound_in(conn, message(f"A:{index}", f"A {key}"), key)
        first = store.claim_free_lanes_in(conn, keys, "A", 60, 5, lambda: None)
        out: list = []
        other = ["chat-99", *keys[::-1]]
        thread = threading.Thread(target=lambda: out.append(_store_rows(
            store, [(key, f"B {key}") for key in other],
            lambda conn: store.claim_free_lanes_in(conn, other, "B", 60, 5, lambda: None))))
        thread.start()
        thread.join(0.5)
        assert thread.is_alive()  # waiting for A's transaction
    thread.join(10)
    assert sorted(first) == keys
    [second] = out
    assert list(second) == ["chat-99"] and [p.message.text for p in second["chat-99"][0]] == ["B chat-99"]


def _lock_waiters(store: Store) -> int:
    """How many of the database's sessions wait for a lock (PostgreSQL: pg_stat_activity)."""
    from sqlalchemy import text as sql

    with store.engine.connect() as conn:
        return conn.execute(sql("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                                " AND wait_event_type = 'Lock'")).scalar_one()


def _poll(predicate, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_two_instances_batches_over_new_and_freed_lanes_do_not_deadlock(store):
    """Two instances' batches name lanes that exist and lanes that are new, overlapping, while a
    third transaction holds a new lane's key and an existing lane is freed in between (PostgreSQL).
    Each batch takes its keys' locks in key order, new lanes before existing ones, so neither waits
    for the other in a cycle: no deadlock is reported (it would cost the batch a retry, about a
    second), and each lane is won once."""
    from sqlalchemy import text as sql

    with write_tx(store.engine) as conn:  # a table the size of a busy gateway's, and its statistics
        conn.execute(sql("INSERT INTO lanes (key, lease_owner, lease_until, generation) "
                         "SELECT 'old-' || n, NULL, 0, 0 FROM generate_series(1, 10000) AS n"))
    with store.engine.connect() as conn:
        conn.execute(sql("ANALYZE lanes"))
        conn.commit()
    for key in ("w", "x"):
        assert store.claim_lane(key, "Z", 60)
    store.release_lane("x", "Z")  # x free, w held by Z
    errors: list[BaseException] = []
    results: dict[str, object] = {}

    def batch(owner: str, keys: list[str]) -> threading.Thread:
        def claim() -> None:
            try:
                results[owner] = _store_rows(store, [(key, f"{owner} {key}") for key in keys],
                                             lambda conn: store.claim_free_lanes_in(conn, keys, owner, 60, 5,
                                                                                    lambda: None))
            except BaseException as exc:  # reported by the assertion below
                errors.append(exc)
        thread = threading.Thread(target=claim)
        thread.start()
        return thread

    with store.engine.connect() as holder:  # C: a new lane's key inserted, not committed yet
        holder.execute(sql("INSERT INTO lanes (key, lease_owner, lease_until, generation) "
                           "VALUES ('a0', 'C', :until, 0)"), {"until": time.time() + 60})
        first = batch("A", ["a0", "b0", "w", "x"])
        _poll(lambda: _lock_waiters(store) == 1, "A waiting for C's a0")
        assert not store.release_lane("w", "Z")  # Z's turn ends: w free
        second = batch("B", ["w", "x", "y1", "y2"])
        _poll(lambda: "B" in results or errors or _lock_waiters(store) == 2, "B done or waiting")
        holder.commit()
    first.join(20)
    second.join(20)
    assert errors == []
    assert sorted(results["A"]) == ["b0"]  # a0 is C's, w and x went to B, whose claim did not wait
    assert sorted(results["B"]) == ["w", "x", "y1", "y2"]


def test_a_new_lane_is_claimed_with_its_oldest_rows_up_to_the_batch_size_and_no_session_without_a_prefetch(store):
    """A batch's new chat with more rows waiting than a batch holds is claimed with its oldest ones
    only (the rest wait for its next turn); without a prefetch nothing opens a session in the admit
    (the lane has none: the turn opens it), and the lease is held all the same."""
    rows = [("new-a", f"a{n}") for n in range(5)] + [("new-b", "b0")]
    claimed = _store_rows(store, rows, lambda conn: store.claim_free_lanes_in(
        conn, ["new-b", "new-a"], "a", 60, 3, lambda: None))
    texts = {key: [p.message.text for p in batch] for key, (batch, _generation, _prefetch) in claimed.items()}
    assert texts == {"new-a": ["a0", "a1", "a2"], "new-b": ["b0"]}
    assert all(prefetch is None for _batch, _generation, prefetch in claimed.values())
    for key in ("new-a", "new-b"):
        assert store.current_session_id(key) is None
        assert not store.claim_lane(key, "b", 60)
    assert [p.message.text for p in store.pending_batch("new-a", 10)] == ["a0", "a1", "a2", "a3", "a4"]
