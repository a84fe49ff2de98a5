"""Settled bookkeeping rows are deleted ``database.keep_settled_days`` after they settled, on SQLite
and PostgreSQL: answered messages' inbox rows and sent replies' outbox rows go, in batches; rows
still in flight, an outbox row a scheduled run waits on, recent rows and the transcript stay; the
permission look-ups still answer. A gateway started with the setting prunes at start."""

from __future__ import annotations

import time

from sqlalchemy import func, select, update

from gateway.core.types import ChatAddress, InboundMessage, OutboundMessage, Sender
from gateway.scheduler.store import JobStore
from gateway.store.db import create_db_engine, write_tx
from gateway.store.models import InboxRow, JobRunRow, MessageRow, OutboxRow, table
from gateway.store.prune import prune_settled
from gateway.store.sql import NewMessage, Store
from tests.conftest import gateway_config, start_gateway
from tests.helpers import wait_until

DAY = 86400.0
CHAT = ChatAddress("telegram", "7000000001", "5550101")


def _turn(store: Store, n: int, *, finish: bool = True, send: bool = True, chat: ChatAddress = CHAT) -> None:
    """Message ``n`` stored, answered (a transcript pair, a reply queued) and its reply sent."""
    message = InboundMessage(chat, f"m{n}", "dm", Sender(chat.chat_id, "Ann"), f"question {n}")
    assert store.insert_inbound(message, "dm:u1" if finish else "dm:waiting")
    if not finish:
        return
    [pending] = store.next_pending("dm:u1")
    session = store.new_session("dm:u1", "prompt", None) if n == 0 else _session(store)
    [item] = store.finish_turn([pending.inbox_id], "done", [OutboundMessage(chat, f"answer {n}", f"r{n}")],
                               session_id=session, session_key="dm:u1", claim=("me", 60),
                               messages=[NewMessage(f"in{n}", "user", f"question {n}", {}),
                                         NewMessage(f"in{n}", "assistant", f"answer {n}", {})])
    if send:
        assert store.mark_sent(item.id, "me", [f"p{n}"])


def _session(store: Store) -> str:
    with store.engine.connect() as conn:
        return conn.execute(select(table(MessageRow).c.session_id).limit(1)).scalar_one()


def _age(store: Store, days: float) -> None:
    """Every inbox and outbox row settled ``days`` ago."""
    then = time.time() - days * DAY
    with write_tx(store.engine) as conn:
        conn.execute(update(table(InboxRow)).values(received_at=then, finished_at=then))
        conn.execute(update(table(OutboxRow)).values(created_at=then, sent_at=then))


def _count(store: Store, row: type) -> int:
    with store.engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(table(row))).scalar_one()


def test_settled_rows_go_after_the_retention_and_nothing_in_flight_does(db_url):
    engine = create_db_engine(db_url)
    store, jobs = Store(engine), JobStore(engine)
    for n in range(5):
        _turn(store, n)
    _turn(store, 5, send=False, chat=ChatAddress("telegram", "7000000001", "5550102"))  # claimed, not sent yet
    _age(store, 40)
    _turn(store, 6, finish=False)  # waiting for its turn, but old
    _age_pending = time.time() - 40 * DAY
    with write_tx(engine) as conn:
        conn.execute(update(table(InboxRow)).where(table(InboxRow).c.status == "pending")
                     .values(received_at=_age_pending))
        sent = conn.execute(select(table(OutboxRow).c.id).where(table(OutboxRow).c.status == "sent")
                            .order_by(table(OutboxRow).c.id)).scalars().all()
        conn.execute(table(JobRunRow).insert().values(  # a scheduled run still settling with the first reply
            job_id="j1", scheduled_at=1.0, status="delivering", started_at=1.0, outbox_id=sent[0]))
    _turn(store, 7)  # recent
    transcript = _count(store, MessageRow)

    pruned = prune_settled(engine, 30 * DAY, batch=2)  # batches of two: three rounds for five rows

    assert pruned.rows["inbox"] == 6 and pruned.rows["outbox"] == 4, pruned.describe()
    with engine.connect() as conn:
        inbox = conn.execute(select(table(InboxRow).c.platform_message_id, table(InboxRow).c.status)
                             .order_by(table(InboxRow).c.id)).all()
        outbox = conn.execute(select(table(OutboxRow).c.idempotency_key, table(OutboxRow).c.status)
                              .order_by(table(OutboxRow).c.id)).all()
    assert [tuple(r) for r in inbox] == [("m6", "pending"), ("m7", "done")]
    assert [tuple(r) for r in outbox] == [("r0", "sent"), ("r5", "claimed"), ("r7", "sent")]
    assert _count(store, MessageRow) == transcript  # the conversation stays
    assert jobs.dm_address("telegram", "7000000001", "5550101") == CHAT  # so do the permissions
    assert not prune_settled(engine, 30 * DAY)  # a second run (another instance) finds nothing
    engine.dispose()


async def test_a_gateway_prunes_at_start(tmp_path, fake_telegram, fake_openai, running):
    config = gateway_config(tmp_path, fake_openai, fake_telegram, database={"keep_settled_days": 1})
    engine = create_db_engine(config.database.url)
    from gateway.store.db import upgrade

    upgrade(engine)
    store = Store(engine)
    for n in range(3):
        _turn(store, n)
    _age(store, 2)
    _turn(store, 3)
    await start_gateway(config, running)
    await wait_until(lambda: _count(store, InboxRow) == 1 and _count(store, OutboxRow) == 1,
                     what="the settled rows pruned at start")
    engine.dispose()


def test_the_newest_row_stays_so_no_id_is_handed_out_again(db_url):
    """Everything settled long ago: the newest inbox and outbox rows stay. SQLite (no
    ``AUTOINCREMENT``) hands out max(id) + 1 again, so pruning the newest row gave the next message
    an inbox id, and a turn id ``in<id>``, already in a transcript: taken for a resumed turn, its
    text never reached the model."""
    engine = create_db_engine(db_url)
    store = Store(engine)
    for n in range(3):
        _turn(store, n)
    _age(store, 40)
    with engine.connect() as conn:
        newest = conn.execute(select(func.max(table(InboxRow).c.id))).scalar_one()
    pruned = prune_settled(engine, 30 * DAY)
    assert pruned.rows["inbox"] == 2 and pruned.rows["outbox"] == 2
    _turn(store, 3)
    with engine.connect() as conn:
        ids = conn.execute(select(table(InboxRow).c.id).order_by(table(InboxRow).c.id)).scalars().all()
    assert ids[0] == newest and ids[1] > newest
    engine.dispose()
