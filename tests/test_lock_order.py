"""Transactions that lock several rows take them in one order, so two instances on one PostgreSQL
database never wait for each other in a cycle: lanes in key order (a batch's admit under the busy
policy ``interrupt``, the lease renewal), outbox rows in id order (a stopped turn's reply cancelled
in a transaction of its own, then the claims). A cycle would be reported by PostgreSQL after
``deadlock_timeout`` (1 s) and cost one side its transaction: ``retry_locked`` redoes it, so each
test calls the function without it (``__wrapped__``) and a deadlock fails the test.

Each test plays the other instance with a transaction of its own that holds the first row in the
shared order and then asks for the second while the code under test waits for the first: the
code under test must hold nothing the other asks for."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import select, text, update

from gateway.core.types import ChatAddress, InboundMessage, Sender
from gateway.store import prepared as q
from gateway.store.db import create_db_engine, write_tx
from gateway.store.fast import execute as run
from gateway.store.models import LaneRow, OutboxRow
from gateway.store.sql import Store
from tests.conftest import gateway_config, start_gateway

pytestmark = pytest.mark.parametrize("db_url", ["postgres"], indirect=True)


def _lock_waiters(engine: Any) -> int:
    with engine.connect() as conn:
        return conn.execute(text("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                                 " AND wait_event_type = 'Lock'")).scalar_one()


def _poll(predicate: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def _against(engine: Any, first: str, then: str, code: Callable[[], Any], params: dict[str, Any]) -> Any:
    """Runs ``code`` on a thread while another transaction holds a row (``first``, SQL) and, once
    ``code`` waits for it, asks for another (``then``) and commits. Returns ``code``'s result;
    raises what either side raised (a deadlock among them)."""
    out: dict[str, Any] = {}

    def run_code() -> None:
        try:
            out["result"] = code()
        except BaseException as exc:  # re-raised below
            out["error"] = exc

    with engine.connect() as other:
        other.execute(text(first), params)
        thread = threading.Thread(target=run_code)
        thread.start()
        _poll(lambda: "error" in out or _lock_waiters(engine) == 1, "the code under test waiting for the held row")
        other.execute(text(then), params)  # a cycle: PostgreSQL's deadlock detected, on either side
        other.commit()
    thread.join(20)
    if "error" in out:
        raise out["error"]
    return out["result"]


@pytest.fixture
def store(db_url):
    engine = create_db_engine(db_url)
    yield Store(engine)
    engine.dispose()


def _dm_lane_keys(engine: Any) -> list[str]:
    with engine.connect() as conn:
        return list(conn.execute(select(LaneRow.key).where(LaneRow.key.startswith("dm:")).order_by(LaneRow.key))
                    .scalars())


async def test_a_batch_admitted_under_interrupt_locks_its_lanes_in_key_order(db_url, tmp_path, fake_telegram,
                                                                            fake_openai, running):
    """Under ``interrupt`` a batch's messages are admitted one by one, each moving its busy lane's
    generation on (a lock on the lane). Messages for two chats, in the opposite of their keys'
    order, while another instance holds the first key's lane and then asks for the second: the batch
    waits for the first without holding the second, and both are stored."""
    import asyncio

    config = gateway_config(tmp_path, fake_openai, fake_telegram, database={"url": db_url},
                            bus={"busy_policy": "interrupt"}, agent={"streaming": []})
    gateway = await start_gateway(config, running)
    tenant = "lock-order"

    def dm(user: int, text_: str) -> InboundMessage:
        return InboundMessage(ChatAddress("telegram", tenant, str(user)), f"{user}:{text_}", "dm",
                              Sender(str(user), f"User {user}"), text_, received_at=time.time())

    admit = type(gateway.inbound)._admit_many.__wrapped__  # no retry: a deadlock would fail the test
    first = await asyncio.to_thread(admit, gateway.inbound, [dm(7001, "one"), dm(7002, "two")])
    assert all(entry[4] for entry in first)
    keys = _dm_lane_keys(gateway.engine)
    assert len(keys) == 2
    with write_tx(gateway.engine) as conn:  # both chats busy with another instance's turns
        conn.execute(update(LaneRow).where(LaneRow.key.in_(keys)).values(lease_owner="Z",
                                                                          lease_until=time.time() + 600))
    by_key = {entry[2]: entry[0].sender.user_id for entry in first}
    low, high = keys
    batch = [dm(int(by_key[high]), "later high"), dm(int(by_key[low]), "later low")]  # against key order

    admitted = await asyncio.to_thread(
        _against, gateway.engine, "SELECT 1 FROM lanes WHERE key = :low FOR UPDATE",
        "UPDATE lanes SET lease_until = lease_until WHERE key = :high", lambda: admit(gateway.inbound, batch),
        {"low": low, "high": high})
    assert [entry[2] for entry in admitted] == [high, low]  # the result in the batch's order
    assert all(entry[4] and entry[5] for entry in admitted)  # stored, each cancelling its chat's busy turn


def test_lease_renewal_locks_its_lanes_in_key_order(store):
    """The renewal of an instance's leases over lanes stored against key order (heap order then
    differs from key order) while another transaction holds the lower key and then asks for the
    higher: the renewal holds nothing the other wants, and renews both."""
    for key in ("lane-b", "lane-a"):  # stored in this order
        assert store.claim_lane(key, "me", 60)
    held = _against(store.engine, "SELECT 1 FROM lanes WHERE key = 'lane-a' FOR UPDATE",
                    "UPDATE lanes SET generation = generation WHERE key = 'lane-b'",
                    lambda: Store.renew_lanes.__wrapped__(store, ["lane-b", "lane-a"], "me", 60), {})
    assert held == ["lane-a", "lane-b"]


def test_a_stopped_turns_reply_is_cancelled_before_and_apart_from_the_claims(store):
    """A reply whose turn was stopped (its lane's generation moved on) is cancelled in a
    transaction of its own, committed before any claim. Another instance, whose view predates the
    stop, holds the claim of an earlier row and then claims the stopped one: no cycle; the stopped
    reply stays cancelled, never claimed."""
    now = time.time()
    for key in ("L0", "L1"):
        assert store.claim_lane(key, "Z", 60)
    with write_tx(store.engine) as conn:
        for n, (key, chat) in enumerate((("L0", "X"), ("L1", "Y"))):
            run(conn, q.INSERT_OUTBOX, {"idempotency_key": f"r{n}", "session_id": None, "session_key": key,
                                        "chat_key": chat, "generation": 0, "address": {}, "text": "t",
                                        "reply_to_id": None, "status": "pending", "attempts": 0,
                                        "next_attempt_at": now - 1, "claim_until": 0.0, "claimed_by": None,
                                        "created_at": now})
        conn.execute(update(LaneRow).where(LaneRow.key == "L1").values(generation=1))  # L1's turn stopped
        r0, r1 = conn.execute(select(OutboxRow.id).order_by(OutboxRow.id)).scalars().all()
    claim = ("UPDATE outbox SET status = 'claimed', claimed_by = 'B', claim_until = :until "
             "WHERE id = :{row} AND status = 'pending'")
    claimed = _against(store.engine, claim.format(row="r0"), claim.format(row="r1"),
                       lambda: Store.claim_due.__wrapped__(store, "A", 10, 60),
                       {"r0": r0, "r1": r1, "until": now + 60})
    assert claimed.items == []  # r0 is B's; r1 was cancelled
    with store.engine.connect() as conn:
        rows = dict(conn.execute(select(OutboxRow.id, OutboxRow.status)).all())
    assert rows == {r0: "claimed", r1: "cancelled"}


def test_two_lanes_of_one_chat_finishing_at_once_queue_their_replies_one_after_the_other(store):
    """A forum topic's lane and the whole group's lane finish at once on two instances. Each used to see no
    unsettled row of the chat in its own snapshot and queue its reply *claimed*: both sent at once,
    in no set order. The chat's lock makes the second wait for the first's commit and see its row:
    the second reply is queued *pending*, handed out by ``claim_due`` after the first settles."""
    from gateway.core.types import OutboundMessage
    from gateway.store.outbox import shares_chat

    now = time.time()
    group = "-1001000000077"
    # a forum topic's lane and the whole group's (its General topic has no thread id)
    topic = [ChatAddress("telegram", "lock-order", group, thread_id="1"), ChatAddress("telegram", "lock-order", group)]
    keys = [f"telegram:lock-order:chat:{group}:thread:1", f"telegram:lock-order:chat:{group}"]
    replies = [OutboundMessage(address, f"reply {n}", f"turn-{n}:0") for n, address in enumerate(topic, 1)]
    out: dict[str, Any] = {}

    def second_instance() -> None:
        try:
            with write_tx(store.engine) as conn:
                out["item"] = Store._queue(conn, replies[1], None, keys[1], 0, time.time(), ("B", 60), False)
        except BaseException as exc:  # re-raised below
            out["error"] = exc

    with store.engine.connect() as first:
        first.begin()
        item = Store._queue(first, replies[0], None, keys[0], 0, now, ("A", 60), False)
        assert item is not None  # queued claimed: A sends it at once
        thread = threading.Thread(target=second_instance)
        thread.start()
        _poll(lambda: bool(out) or _lock_waiters(store.engine) == 1, "the second queue waiting for the chat")
        first.commit()
    thread.join(20)
    if "error" in out:
        raise out["error"]
    assert out["item"] is None  # behind the first: pending, not claimed
    with store.engine.connect() as conn:
        rows = dict(conn.execute(select(OutboxRow.idempotency_key, OutboxRow.status)).all())
    assert rows == {"turn-1:0": "claimed", "turn-2:0": "pending"}
    assert shares_chat(keys[0]) and shares_chat(keys[1]) and not shares_chat("dm:u1")
