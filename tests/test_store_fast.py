"""The planned statement path (``gateway.store.fast``) gives what SQLAlchemy's ``Connection.execute``
gives, on a real SQLite file: rows (JSON decoded, labels as attributes), row counts, new primary
keys, lists in ``IN``, literals the statement carries, and SQLAlchemy's exceptions."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError

from gateway.store import fast
from gateway.store import prepared as q
from gateway.store.db import create_db_engine, read_tx, upgrade, write_tx


@pytest.fixture
def engine(tmp_path: Path):
    engine = create_db_engine(f"sqlite:///{tmp_path / 'fast.db'}")
    upgrade(engine)
    yield engine
    engine.dispose()


def _inbox(n: int, key: str = "telegram::1") -> dict:
    return {"platform": "telegram", "tenant": "", "platform_message_id": str(n), "session_key": key,
            "user_id": None, "payload": {"text": f"m{n}", "nested": {"ü": [1, 2.5, None]}}, "status": "pending",
            "received_at": 100.0 + n, "finished_at": None}


def test_planned_statements_match_sqlalchemy(engine) -> None:
    with write_tx(engine) as conn:
        ids = [fast.execute(conn, q.INSERT_INBOX, _inbox(n)).inserted_primary_key[0] for n in range(3)]
        assert ids == [1, 2, 3]
        assert conn.execute(q.INSERT_INBOX, _inbox(3)).inserted_primary_key[0] == 4
        fast.execute(conn, q.INSERT_LANE, {"key": "telegram::1", "lease_owner": None, "lease_until": 0.0,
                                           "generation": 7})
    with read_tx(engine) as conn:
        planned = fast.execute(conn, q.PENDING_BATCH, {"b_key": "telegram::1", "b_limit": 3}).all()
        plain = conn.execute(q.PENDING_BATCH, {"b_key": "telegram::1", "b_limit": 3}).all()
    assert [tuple(r) for r in planned] == [tuple(r) for r in plain]
    assert planned[0].payload == {"text": "m0", "nested": {"ü": [1, 2.5, None]}}
    assert planned[0].generation == 7 and planned[0]._mapping["id"] == 1
    with write_tx(engine) as conn:  # an expanding IN of two, then of one: a plan each
        assert fast.execute(conn, q.FINISH_INBOX_MANY, {"b_ids": [1, 2], "status": "merged",
                                                        "finished_at": 5.0}).rowcount == 2
        assert fast.execute(conn, q.FINISH_INBOX_MANY, {"b_ids": [3], "status": "done",
                                                        "finished_at": 6.0}).rowcount == 1
        assert fast.execute(conn, q.FINISH_INBOX_MANY, {"b_ids": [], "status": "done",
                                                        "finished_at": 6.0}).rowcount == 0
        rows = conn.execute(text("SELECT id, status, finished_at FROM inbox ORDER BY id")).all()
    assert [tuple(r) for r in rows] == [(1, "merged", 5.0), (2, "merged", 5.0), (3, "done", 6.0), (4, "pending", None)]
    with read_tx(engine) as conn:
        assert fast.execute(conn, q.ANY_PENDING, {"b_key": "telegram::1"}).scalar() == 4
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
        stored = conn.execute(text("SELECT buttons, address FROM outbox ORDER BY id")).all()
        assert stored[0] == stored[1]
        settled = fast.execute(conn, q.SETTLE_OUTBOX, {"b_id": 1, "b_owner": "me", "status": "sent"})
        assert settled.rowcount == 1
        assert fast.execute(conn, q.SETTLE_OUTBOX, {"b_id": 1, "b_owner": "me", "status": "sent"}).rowcount == 0
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
        fast.execute(conn, q.INSERT_INBOX, _inbox(1))  # planned earlier in this process, or run plainly
        for _ in range(3):
            ad_hoc = select(inbox.c.id).where(inbox.c.id.in_(bindparam("b_ids", expanding=True)))
            assert fast.execute(conn, ad_hoc, {"b_ids": [1, 2]}).scalar() == 1
            assert (id(ad_hoc), frozenset({"b_ids"})) not in fast._EXPANDING
            assert id(ad_hoc) not in fast._KEEP
