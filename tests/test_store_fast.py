"""The planned statement path (``gateway.store.fast``) gives what SQLAlchemy's ``Connection.execute``
gives, on a real SQLite file and on PostgreSQL (psycopg): rows (JSON decoded, labels as
attributes), row counts, new primary keys, lists in ``IN``, literals the statement carries, and
SQLAlchemy's exceptions."""

from __future__ import annotations

import pytest
from sqlalchemy import bindparam, select, text
from sqlalchemy.exc import IntegrityError

from gateway.store import fast
from gateway.store import prepared as q
from gateway.store.db import create_db_engine, read_tx, upgrade, write_tx
from gateway.store.models import InboxRow, table


@pytest.fixture
def engine(db_url: str):
    engine = create_db_engine(db_url)
    upgrade(engine)
    yield engine
    engine.dispose()


def _planned(engine, statement) -> bool:
    """Did ``statement`` run planned (not through SQLAlchemy's ``Connection.execute``)?"""
    return any(key[0] == id(statement) for key in fast._PLANS if fast._PLANS[key] is not None)


_INBOX = table(InboxRow)


def _inbox(n: int, key: str = "telegram::1") -> dict:
    return {"platform": "telegram", "tenant": "", "platform_message_id": str(n), "session_key": key,
            "user_id": None, "payload": {"text": f"m{n}", "nested": {"ü": [1, 2.5, None]}}, "status": "pending",
            "received_at": 100.0 + n, "finished_at": None}


def test_planned_statements_match_sqlalchemy(engine) -> None:
    with write_tx(engine) as conn:
        ids = [fast.execute(conn, q.INSERT_INBOX, _inbox(n)).inserted_primary_key[0] for n in range(3)]
        first = ids[0]  # PostgreSQL's sequence is not reset between tests
        assert isinstance(first, int) and ids == [first, first + 1, first + 2]
        assert conn.execute(q.INSERT_INBOX, _inbox(3)).inserted_primary_key[0] == first + 3
        fast.execute(conn, q.INSERT_LANE, {"key": "telegram::1", "lease_owner": None, "lease_until": 0.0,
                                           "generation": 7})
    assert _planned(engine, q.INSERT_INBOX)
    with read_tx(engine) as conn:
        planned = fast.execute(conn, q.PENDING_BATCH, {"b_key": "telegram::1", "b_limit": 3}).all()
        plain = conn.execute(q.PENDING_BATCH, {"b_key": "telegram::1", "b_limit": 3}).all()
    assert [tuple(r) for r in planned] == [tuple(r) for r in plain]
    assert planned[0].payload == {"text": "m0", "nested": {"ü": [1, 2.5, None]}}
    assert planned[0].generation == 7 and planned[0]._mapping["id"] == first
    with read_tx(engine) as conn:  # a float column: PostgreSQL's numeric result processing by type code
        when = select(_INBOX.c.received_at, _INBOX.c.finished_at).where(_INBOX.c.id == bindparam("b_id"))
        assert tuple(fast.execute(conn, when, {"b_id": first}).first()) == (100.0, None) == \
            tuple(conn.execute(when, {"b_id": first}).first())
    assert _planned(engine, q.PENDING_BATCH)
    with write_tx(engine) as conn:  # an expanding IN of two, then of one: a plan each
        assert fast.execute(conn, q.FINISH_INBOX_MANY, {"b_ids": [first, first + 1], "status": "merged",
                                                        "finished_at": 5.0}).rowcount == 2
        assert fast.execute(conn, q.FINISH_INBOX_MANY, {"b_ids": [first + 2], "status": "done",
                                                        "finished_at": 6.0}).rowcount == 1
        assert fast.execute(conn, q.FINISH_INBOX_MANY, {"b_ids": [], "status": "done",
                                                        "finished_at": 6.0}).rowcount == 0
        rows = conn.execute(text("SELECT id - :first, status, finished_at FROM inbox ORDER BY id"),
                            {"first": first}).all()
    assert [tuple(r) for r in rows] == [(0, "merged", 5.0), (1, "merged", 5.0), (2, "done", 6.0), (3, "pending", None)]
    assert _planned(engine, q.FINISH_INBOX_MANY)
    with read_tx(engine) as conn:
        assert fast.execute(conn, q.ANY_PENDING, {"b_key": "telegram::1"}).scalar() == first + 3
        assert fast.execute(conn, q.LANE_GENERATION, {"b_key": "telegram::1"}).scalar_one_or_none() == 7
        assert fast.execute(conn, q.LANE_GENERATION, {"b_key": "nope"}).first() is None


def test_a_statement_with_literal_lists_and_json_none(engine) -> None:
    """``status IN ('claimed', 'sending')`` is carried by the statement; a JSON ``None`` is stored as
    SQLAlchemy stores it (JSON ``null``), so reads through either path agree."""
    row = {"idempotency_key": "k1", "session_id": None, "session_key": "s", "chat_key": "telegram::1",
           "generation": 0, "address": {"platform": "telegram", "chat_id": "1"}, "text": "hi", "reply_to_id": None,
           "status": "claimed", "attempts": 1, "buttons": None, "next_attempt_at": 0.0, "claim_until": 0.0,
           "created_at": 1.0, "attachments": None}
    with write_tx(engine) as conn:
        fast.execute(conn, q.INSERT_OUTBOX, row)
        conn.execute(q.INSERT_OUTBOX, {**row, "idempotency_key": "k2"})
        conn.execute(text("UPDATE outbox SET claimed_by = 'me'"))
        stored = conn.execute(text("SELECT CAST(buttons AS TEXT), CAST(address AS TEXT) FROM outbox ORDER BY id")).all()
        assert stored[0] == stored[1]
        one = conn.execute(text("SELECT min(id) FROM outbox")).scalar()
        settled = fast.execute(conn, q.SETTLE_OUTBOX, {"b_id": one, "b_owner": "me", "status": "sent"})
        assert settled.rowcount == 1
        assert fast.execute(conn, q.SETTLE_OUTBOX, {"b_id": one, "b_owner": "me", "status": "sent"}).rowcount == 0
        assert fast.execute(conn, q.OUTBOX_BY_KEY, {"b_key": "k1"}).first().status == "sent"


def test_errors_are_sqlalchemy_errors(engine) -> None:
    with pytest.raises(IntegrityError), write_tx(engine) as conn:
        fast.execute(conn, q.INSERT_INBOX, _inbox(1))
        fast.execute(conn, q.INSERT_INBOX, _inbox(1))  # the same platform message: unique
    with read_tx(engine) as conn:  # rolled back as a whole
        assert conn.execute(text("SELECT count(*) FROM inbox")).scalar() == 0


def test_statements_built_per_call_beyond_the_plan_cap_still_run(engine, monkeypatch) -> None:
    """Past ``MAX_PLANS`` a statement never seen runs through SQLAlchemy, and nothing of it is kept
    (a statement built per call must not leave an entry that a later one with its id would reuse)."""
    from sqlalchemy import bindparam, select

    from gateway.store.models import InboxRow, table

    monkeypatch.setattr(fast, "MAX_PLANS", 0)
    inbox = table(InboxRow)
    with write_tx(engine) as conn:
        new = fast.execute(conn, q.INSERT_INBOX, _inbox(1)).inserted_primary_key[0]  # planned earlier, or plainly
        for _ in range(3):
            ad_hoc = select(inbox.c.id).where(inbox.c.id.in_(bindparam("b_ids", expanding=True)))
            assert fast.execute(conn, ad_hoc, {"b_ids": [new, new + 1]}).scalar() == new
            assert not any(key[0] == id(ad_hoc) for key in fast._EXPANDING)
            assert id(ad_hoc) not in fast._KEEP


def test_an_insert_given_its_key_reports_that_key(engine) -> None:
    """A string primary key given in the row is the new row's key (as SQLAlchemy reports it), not
    SQLite's rowid or nothing (psycopg has no ``lastrowid``)."""
    def session(sid: str) -> dict:
        return {"id": sid, "key": "telegram::1", "system_prompt": "p", "created_at": 1.0, "updated_at": 1.0,
                "owner_user_id": None, "title": None, "settings": None}

    with write_tx(engine) as conn:
        planned = fast.execute(conn, q.INSERT_SESSION, session("s-planned")).inserted_primary_key
        plain = conn.execute(q.INSERT_SESSION, session("s-plain")).inserted_primary_key
    assert tuple(planned) == ("s-planned",) and tuple(plain) == ("s-plain",)
    assert _planned(engine, q.INSERT_SESSION)


def test_a_one_statement_transaction_commits_alone_and_leaves_its_connection_transactional(db_url) -> None:
    """``write_one``/``read_one`` (PostgreSQL: autocommit, one round trip): the statement is
    committed by itself; the connection goes back to the pool transactional again, so the next
    transaction on it (one connection in the pool) still rolls back as a whole."""
    from gateway.store.db import read_one, write_one

    engine = create_db_engine(db_url, pool_size=1)
    upgrade(engine)
    try:
        with write_one(engine) as conn:
            fast.execute(conn, q.INSERT_INBOX, _inbox(1))
        with read_one(engine) as conn:
            assert conn.execute(select(_INBOX.c.platform_message_id)).scalars().all() == ["1"]
        with pytest.raises(RuntimeError), write_tx(engine) as conn:
            fast.execute(conn, q.INSERT_INBOX, _inbox(2))
            raise RuntimeError("the block failed: nothing of it may stay")
        with read_tx(engine) as conn:
            assert conn.execute(select(_INBOX.c.platform_message_id)).scalars().all() == ["1"]
    finally:
        engine.dispose()


def test_execute_many_writes_every_row_in_order_and_refuses_a_duplicate_whole(engine) -> None:
    """``execute_many``: SQLite's ``executemany``, PostgreSQL's one multi-row ``INSERT``; the rows'
    ids ascend in their order, the JSON and text survive, and one refused row writes none."""
    texts = ["plain", "with %s and %(x)s and $1", "quote ' ) (", "ü 🙂"]
    rows = [{**_inbox(900 + i), "payload": {"text": text}} for i, text in enumerate(texts)]
    with write_tx(engine) as conn:
        fast.execute_many(conn, q.INSERT_INBOX, rows)
    with read_tx(engine) as conn:
        stored = conn.execute(select(_INBOX.c.platform_message_id, _INBOX.c.payload)
                              .where(_INBOX.c.platform_message_id.like("90%")).order_by(_INBOX.c.id)).all()
    assert [(r.platform_message_id, r.payload["text"]) for r in stored] == [(str(900 + i), t) for i, t in
                                                                             enumerate(texts)]
    with pytest.raises(IntegrityError), write_tx(engine) as conn:
        fast.execute_many(conn, q.INSERT_INBOX, [_inbox(950), _inbox(900)])  # 900 is stored already
    with read_tx(engine) as conn:
        assert conn.execute(select(_INBOX.c.id).where(_INBOX.c.platform_message_id == "950")).first() is None


def test_a_plan_keeps_its_own_multi_row_statement(pg_database) -> None:
    """A multi-row statement (PostgreSQL's) is the plan's own: a plan made after another was
    dropped (and may have its address) never gets the dropped one's SQL."""
    engine = create_db_engine(pg_database)
    upgrade(engine)
    with write_tx(engine) as conn:
        for _ in range(20):
            first = fast._plan(conn, q.INSERT_INBOX, _inbox(1))
            assert first is not None
            made = fast._multi_row(first, 2)
            assert made is not None and made[0].startswith("INSERT INTO inbox ")
            del first
            other = fast._plan(conn, q.INSERT_SESSION, {"id": "s", "key": "k", "system_prompt": "p",
                                                       "created_at": 1.0, "updated_at": 1.0,
                                                       "owner_user_id": None, "settings": None})
            assert other is not None
            again = fast._multi_row(other, 2)
            assert again is not None and again[0].startswith("INSERT INTO sessions ")
    engine.dispose()
