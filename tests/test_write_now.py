"""``gateway.store.db.write_now``: a reply's delivery marks written on the main loop itself, only
when that never waits; otherwise nothing is written and the caller uses the DB pool."""

from __future__ import annotations

import sqlite3
import threading
import time

import pytest
from sqlalchemy import text

from gateway.core.types import ChatAddress, OutboundMessage
from gateway.store.db import close_now_connection, create_db_engine, upgrade, write_now, write_tx
from gateway.store.sql import Store


@pytest.fixture
def store(db_url):
    engine = create_db_engine(db_url)
    upgrade(engine)
    yield Store(engine)
    close_now_connection(engine)
    engine.dispose()


def _claimed_reply(store: Store) -> int:
    """A reply queued claimed by ``me``, as a turn's ``finish_turn`` queues it; its row id."""
    reply = OutboundMessage(ChatAddress("telegram", "1", "5"), "hello", idempotency_key=f"k-{time.time_ns()}")
    with write_tx(store.engine) as conn:
        item = Store._queue(conn, reply, None, "dm:u", 0, time.time(), ("me", 30.0))
    assert item is not None
    return item.id


def _status(store: Store, outbox_id: int) -> str:
    return next(r["status"] for r in store.outbox_rows() if r["id"] == outbox_id)


def test_a_mark_is_written_on_the_calling_thread_when_the_writer_is_free(store):
    outbox_id = _claimed_reply(store)
    ran_on: list[threading.Thread] = []

    def mark() -> bool:
        ran_on.append(threading.current_thread())
        return store.mark_sending(outbox_id, "me", [], 30.0)

    done, result = write_now(store.engine, mark)
    if store.engine.dialect.name != "sqlite":  # PostgreSQL: a round trip would block the loop
        assert (done, result, ran_on) == (False, None, [])
        return
    assert (done, result) == (True, True) and ran_on == [threading.current_thread()]
    assert _status(store, outbox_id) == "sending"
    assert write_now(store.engine, store.mark_sent, outbox_id, "me", ["77"]) == (True, True)
    assert _status(store, outbox_id) == "sent"


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_nothing_is_written_when_another_writer_of_the_process_holds_the_lock(store):
    outbox_id = _claimed_reply(store)
    holding, release = threading.Event(), threading.Event()

    def other_writer() -> None:
        with write_tx(store.engine):
            holding.set()
            release.wait(5)

    thread = threading.Thread(target=other_writer)
    thread.start()
    holding.wait(5)
    started = time.monotonic()
    assert write_now(store.engine, store.mark_sending, outbox_id, "me", [], 30.0) == (False, None)
    assert time.monotonic() - started < 0.5  # not waited for
    release.set()
    thread.join()
    assert _status(store, outbox_id) == "claimed"


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_nothing_is_written_when_another_process_holds_the_database(store):
    outbox_id = _claimed_reply(store)
    other = sqlite3.connect(store.engine.url.database, isolation_level=None)  # as another process would
    other.execute("BEGIN IMMEDIATE")
    try:
        started = time.monotonic()
        assert write_now(store.engine, store.mark_sending, outbox_id, "me", [], 30.0) == (False, None)
        assert time.monotonic() - started < 0.5  # busy timeout 0: no wait for the other's lock
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert _status(store, outbox_id) == "claimed"
    assert store.mark_sending(outbox_id, "me", [], 30.0)  # the pool's way still works


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_read_or_a_statement_that_is_not_planned_is_not_run_here_and_nothing_is_written(store):
    outbox_id = _claimed_reply(store)
    assert write_now(store.engine, store.count_inbox, "pending") == (False, None)  # a read: the pool's

    def unplanned_write() -> None:  # a statement the store does not run planned needs the pool's Connection
        with write_tx(store.engine) as conn:
            store.insert_inbound_in(conn, _inbound(), "dm:u")
            conn.execute(text("UPDATE outbox SET status = 'sending' WHERE id = :id"), {"id": outbox_id})

    assert write_now(store.engine, unplanned_write) == (False, None)
    assert _status(store, outbox_id) == "claimed" and store.count_inbox("pending") == 0  # rolled back whole


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_call_making_two_transactions_is_refused_as_a_mistake(store):
    outbox_id = _claimed_reply(store)

    def two() -> None:
        store.mark_sending(outbox_id, "me", [], 30.0)
        store.mark_sent(outbox_id, "me", ["1"])

    with pytest.raises(RuntimeError, match="one transaction"):
        write_now(store.engine, two)


def _inbound():
    from gateway.core.types import InboundMessage, Sender

    return InboundMessage(ChatAddress("telegram", "1", "5"), f"5:{time.time_ns()}", "dm", Sender("5"), "hi")
