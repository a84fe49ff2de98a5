"""``GroupCommit``: writes that arrive while one is under way go together in one transaction, each
caller gets its own result or error, and nobody's call returns before its row is committed.

The first tests drive the class with a real SQLite table (rows written in transactions of the
store's own ``write_tx``); the last one drives a running gateway's Telegram webhook while another
writer holds the database, so that its webhooks queue up behind it."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table, insert, select
from sqlalchemy.exc import IntegrityError, OperationalError

from gateway.store.db import create_db_engine, write_tx
from gateway.store.group_commit import GroupCommit
from gateway.store.models import InboxRow
from tests.conftest import gateway_config, start_gateway
from tests.fakes import openai as oa
from tests.test_telegram_e2e import dm_update

_meta = MetaData()
_rows = Table("rows", _meta, Column("id", Integer, primary_key=True, autoincrement=True),
              Column("name", String, unique=True, nullable=False))


class Rows:
    """A table written through a ``GroupCommit``, counting its transactions."""

    def __init__(self, url: str) -> None:
        self.engine = create_db_engine(url)
        _meta.create_all(self.engine)
        self.transactions: list[list[str]] = []
        self.started = threading.Event()
        self.go = threading.Event()
        self.go.set()

    def one(self, name: str) -> int:
        return self.many([name])[0]

    def many(self, names: list[str]) -> list[int]:
        self.started.set()
        self.go.wait(5)
        with write_tx(self.engine) as conn:
            ids = [conn.execute(insert(_rows).values(name=n)).inserted_primary_key[0] for n in names]
        self.transactions.append(list(names))
        return ids

    def names(self) -> list[str]:
        with self.engine.connect() as conn:
            return list(conn.execute(select(_rows.c.name).order_by(_rows.c.id)).scalars())


@pytest.fixture
def rows(tmp_path):
    table = Rows(f"sqlite:///{tmp_path / 'rows.db'}")
    yield table
    table.engine.dispose()


def _on_thread(fn: Any, *args: Any) -> asyncio.Future[Any]:
    """A DB pool's ``submit``: the call on a thread, its future on the loop."""
    return asyncio.ensure_future(asyncio.to_thread(fn, *args))


def _commit(rows: Rows, limit: int = 32, many: Any = None) -> GroupCommit[str, int]:
    return GroupCommit(rows.one, many or rows.many, submit_db=_on_thread, limit=limit)


async def _under_way(rows: Rows, commit: GroupCommit[str, int], name: str) -> asyncio.Future[int]:
    """``name``'s write, started and held in its transaction until ``rows.go`` is set."""
    rows.go.clear()
    rows.started.clear()
    first = asyncio.ensure_future(commit.write(name))
    await asyncio.to_thread(rows.started.wait, 5)
    return first


async def _held_then_released(rows: Rows, commit: GroupCommit[str, int], names: list[str]) -> list[Any]:
    """The first name's transaction waits until the rest have called; then all are written."""
    first = await _under_way(rows, commit, names[0])
    rest = [asyncio.ensure_future(commit.write(n)) for n in names[1:]]
    await asyncio.sleep(0.05)
    assert not any(task.done() for task in [first, *rest])  # nobody returns before its commit
    rows.go.set()
    return await asyncio.gather(first, *rest, return_exceptions=True)


async def test_calls_arriving_during_a_write_are_committed_together_in_order(rows):
    commit = _commit(rows)
    names = [f"n{i}" for i in range(6)]
    ids = await _held_then_released(rows, commit, names)

    assert rows.transactions == [["n0"], ["n1", "n2", "n3", "n4", "n5"]]
    assert rows.names() == names and ids == sorted(ids) and len(set(ids)) == 6
    assert commit.batches == 1
    assert await commit.write("alone") > max(ids) and rows.transactions[-1] == ["alone"]  # idle again


async def test_a_batch_holds_at_most_limit_calls(rows):
    commit = _commit(rows, limit=2)
    await _held_then_released(rows, commit, [f"n{i}" for i in range(6)])
    assert rows.transactions == [["n0"], ["n1", "n2"], ["n3", "n4"], ["n5"]]


async def test_a_refused_row_rolls_the_batch_back_and_each_caller_gets_its_own_outcome(rows):
    commit = _commit(rows)
    await commit.write("taken")
    outcomes = await _held_then_released(rows, commit, ["a", "b", "taken", "c"])

    assert isinstance(outcomes[2], IntegrityError)
    assert [o for i, o in enumerate(outcomes) if i != 2] == sorted(o for i, o in enumerate(outcomes) if i != 2)
    assert rows.names() == ["taken", "a", "b", "c"]  # the batch wrote nothing; then one by one
    assert rows.transactions == [["taken"], ["a"], ["b"], ["c"]]


async def test_a_database_error_reaches_every_caller_of_the_batch(rows):
    calls = []

    def many(names: list[str]) -> list[int]:
        calls.append(names)
        raise OperationalError("INSERT", {}, Exception("disk I/O error"))

    commit = _commit(rows, many=many)  # the batch's transaction fails as a whole
    outcomes = await _held_then_released(rows, commit, ["a", "b", "c"])
    assert outcomes[0] == 1  # the first call was written on its own before
    assert [type(o) for o in outcomes[1:]] == [OperationalError, OperationalError] and calls == [["b", "c"]]
    assert rows.names() == ["a"]


async def test_a_caller_that_gave_up_is_not_written(rows):
    commit = _commit(rows)
    first = await _under_way(rows, commit, "first")
    gone = asyncio.ensure_future(commit.write("gone"))
    kept = asyncio.ensure_future(commit.write("kept"))
    await asyncio.sleep(0.01)
    gone.cancel()  # the webhook's connection closed before anything was written for it
    rows.go.set()
    await asyncio.gather(first, kept)
    assert rows.names() == ["first", "kept"]


async def test_a_write_runs_on_the_loop_when_that_never_waits_else_on_the_pool(rows):
    loop_thread = threading.current_thread()
    on: list[str] = []
    free = [True]

    def now(fn: Any, arg: Any) -> tuple[bool, Any]:  # as gateway.store.db.write_now: only when free
        if not free[0]:
            return False, None
        on.append("loop" if threading.current_thread() is loop_thread else "elsewhere")
        return True, fn(arg)

    def pool(fn: Any, arg: Any) -> asyncio.Future[Any]:
        on.append("pool")
        return _on_thread(fn, arg)

    commit = GroupCommit(rows.one, rows.many, submit_db=pool, now=now)
    await commit.write("a")
    free[0] = False  # the writer is busy: the DB pool, and who comes meanwhile waits for it
    b = await _under_way(rows, commit, "b")
    c, d = asyncio.ensure_future(commit.write("c")), asyncio.ensure_future(commit.write("d"))
    free[0] = True  # free again, but "c" and "d" arrived while "b" was written: they follow it
    await asyncio.sleep(0.01)
    rows.go.set()
    await asyncio.gather(b, c, d)
    assert on == ["loop", "pool", "loop"] and rows.transactions == [["a"], ["b"], ["c", "d"]]
    assert rows.names() == ["a", "b", "c", "d"]


async def test_after_the_db_pool_shut_down_every_write_fails_and_none_hangs(rows):
    from gateway.store.offload import Offload

    pool = Offload(1, "gctest")
    commit = GroupCommit(rows.one, rows.many, submit_db=pool.submit)
    rows.go.clear()
    first = asyncio.ensure_future(commit.write("first"))  # under way on the pool
    await asyncio.to_thread(rows.started.wait, 5)
    queued = [asyncio.ensure_future(commit.write(n)) for n in ("a", "b")]
    await asyncio.sleep(0.01)
    await asyncio.to_thread(pool.shutdown, False)  # the gateway stops meanwhile
    rows.go.set()
    assert await asyncio.wait_for(first, 5) == 1
    for outcome in await asyncio.wait_for(asyncio.gather(*queued, return_exceptions=True), 5):
        assert isinstance(outcome, RuntimeError) and "shut down" in str(outcome)
    with pytest.raises(RuntimeError, match="shut down"):
        await asyncio.wait_for(commit.write("late"), 5)
    with pytest.raises(RuntimeError, match="shut down"):  # and again: the writer was not left busy
        await asyncio.wait_for(commit.write("later"), 5)
    assert rows.names() == ["first"]


def test_limit_must_be_positive(rows):
    with pytest.raises(ValueError, match="at least 1"):
        _commit(rows, limit=0)


class _Writer:
    """Another writer holding the gateway's database (a turn's transaction, say) until released."""

    def __init__(self, engine: Any) -> None:
        self._holding, self._release = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._hold, args=(engine,))

    def _hold(self, engine: Any) -> None:
        with write_tx(engine):
            self._holding.set()
            self._release.wait(10)

    async def __aenter__(self) -> _Writer:
        self._thread.start()
        await asyncio.to_thread(self._holding.wait, 5)
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.release()
        await asyncio.to_thread(self._thread.join, 5)

    def release(self) -> None:
        self._release.set()


async def _post_in_order(fake_telegram, url: str, updates: list[dict[str, Any]]) -> list[asyncio.Future[int]]:
    posts = []
    for update in updates:  # a little apart, so they reach the gateway in this order
        posts.append(asyncio.ensure_future(fake_telegram.post_webhook(url, update, SECRET)))
        await asyncio.sleep(0.02)
    return posts


SECRET = "webhook-secret-0123456789"


@pytest.mark.parametrize("mode", ["webhook"])
async def test_webhooks_arriving_while_the_database_is_busy_are_stored_together_each_once(
        tmp_path, fake_telegram, fake_openai, running, mode):
    fake_openai.reset()
    fake_openai.responder = lambda request: oa.text("noted")
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai, fake_telegram, telegram={"mode": mode}),
                                  running)
    url = f"http://127.0.0.1:{gateway.http_port}/telegram/webhook"
    users = list(range(5552001, 5552007))
    first = [dm_update(f"hello {i}", 9700 + i, user_id=user) for i, user in enumerate(users[:4])]

    async with _Writer(gateway.engine) as writer:
        posts = await _post_in_order(fake_telegram, url, first)
        await asyncio.sleep(0.2)
        assert not any(p.done() for p in posts)  # nothing acknowledged while nothing could be stored
        writer.release()
        assert await asyncio.gather(*posts) == [200] * 4
    assert _stored(gateway) == [(u, 9700 + i) for i, u in enumerate(users[:4])]  # stored when acknowledged
    assert gateway.inbound._admits is not None and gateway.inbound._admits.batches >= 1

    # A redelivery among them: the batch is rolled back and each is admitted on its own.
    second = [dm_update("hello 4", 9704, user_id=users[4]), dm_update("hello 1", 9701, user_id=users[1]),
              dm_update("hello 5", 9705, user_id=users[5])]
    async with _Writer(gateway.engine) as writer:
        posts = await _post_in_order(fake_telegram, url, second)
        writer.release()
        assert await asyncio.gather(*posts) == [200] * 3
    assert _stored(gateway)[4:] == [(users[4], 9704), (users[5], 9705)]
    assert (gateway.inbound.received, gateway.inbound.duplicates) == (6, 1)

    for user in users:
        await fake_telegram.wait_for_call("sendMessage", lambda c, u=user: int(c.params["chat_id"]) == u, timeout=15)
    await asyncio.sleep(0.3)
    assert sorted(int(c.params["chat_id"]) for c in fake_telegram.calls("sendMessage")
                  if int(c.params["chat_id"]) in users) == users  # each answered once


def _stored(gateway: Any) -> list[tuple[int, int]]:
    """(chat, message id) of the inbox rows, in the order they were stored."""
    with gateway.engine.connect() as conn:
        rows = conn.execute(select(InboxRow.payload).order_by(InboxRow.id)).scalars().all()
    return [(int(p["address"]["chat_id"]), int(str(p["message_id"]).rsplit(":", 1)[-1])) for p in rows]


async def test_a_write_under_way_ends_before_the_next_even_when_its_caller_gave_up(rows):
    commit = _commit(rows)
    first = await _under_way(rows, commit, "first")
    later = asyncio.ensure_future(commit.write("later"))
    await asyncio.sleep(0.01)
    first.cancel()  # its transaction is already running on the DB pool
    await asyncio.sleep(0.05)
    assert rows.transactions == []  # the next write waits for it
    rows.go.set()
    await later
    assert rows.names() == ["first", "later"]


async def test_delivery_marks_of_replies_sent_together_share_transactions_and_each_precedes_its_send(tmp_path):
    """Replies handed to delivery at once: their ``sending`` and ``sent`` marks are written in shared
    transactions, yet each row is *sending* (committed) when its platform call starts, and each reply
    is sent once and settled *sent*."""
    from gateway.core.types import ChatAddress, DeliveryResult, InboundMessage, OutboundMessage, Sender
    from gateway.delivery.outbox import Delivery
    from gateway.store.db import create_db_engine, upgrade
    from gateway.store.sql import Store

    engine = create_db_engine(f"sqlite:///{tmp_path / 'd.db'}")
    upgrade(engine)
    store = Store(engine)
    chats = [str(9100 + i) for i in range(8)]
    for chat in chats:
        address = ChatAddress("telegram", "1", chat)
        store.insert_inbound(InboundMessage(address, f"{chat}:1", "dm", Sender(chat), "hi"), f"k{chat}")
        [pending] = store.next_pending(f"k{chat}")
        store.finish_turn([pending.inbox_id], "done", [OutboundMessage(address, f"reply {chat}", f"in{chat}:0")],
                          session_key=f"k{chat}")
    items = store.claim_outbox("me", 100, 30)
    assert len(items) == len(chats)

    def status_of(outbox_id: int) -> str:
        return next(r["status"] for r in store.outbox_rows() if r["id"] == outbox_id)

    class Adapter:
        platform = "telegram"
        idempotent_send = False

        def __init__(self) -> None:
            self.sent: list[tuple[str, str]] = []

        async def send(self, message, on_part=None, before_part=None):
            await before_part(0)
            row = next(i.id for i in items if i.message.idempotency_key == message.idempotency_key)
            self.sent.append((message.address.chat_id, await asyncio.to_thread(status_of, row)))
            return DeliveryResult(True, (f"m{message.address.chat_id}",))

    async def on_thread(fn, *args):
        return await asyncio.to_thread(fn, *args)

    adapter = Adapter()
    delivery = Delivery(store=store, adapters={"telegram": adapter}, instance_id="me", run_db=on_thread)
    await delivery.start()
    try:
        delivery.send_claimed(items)
        for _ in range(200):
            if delivery.sent == len(chats):
                break
            await asyncio.sleep(0.02)
    finally:
        await delivery.stop(1)
    assert sorted(adapter.sent) == [(chat, "sending") for chat in chats]
    assert {r["status"] for r in store.outbox_rows()} == {"sent"}
    assert delivery._marks.batches >= 1
    engine.dispose()
