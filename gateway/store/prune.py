"""Deletes the bookkeeping rows a settled message leaves behind (``database.keep_settled_days``).

Every message writes an ``inbox`` row and every reply an ``outbox`` row; once settled they only
deduplicate a platform's retries (minutes to hours) and let a crashed turn resume (seconds), so
they are deleted this long after they settled. The conversation itself is the transcript
(``messages``, kept with its session); who has written from which chat stays in ``chat_members``;
spend stays in ``usage``. Also deleted then: finished scheduled-report runs, files the agent sent
(``outbox_files``; their bytes follow media retention), expired pairing and link codes, and
usage-limit notices of past periods.

The newest row of each table with integer ids stays (SQLite would reuse its id). Each table is
deleted in batches of ``BATCH`` rows, one short transaction each, so a first run
over a large backlog never holds locks for long. Every instance may run it: a second run finds
nothing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import ColumnElement, Engine, Table, delete, exists, func, select

from gateway.store.db import write_tx
from gateway.store.models import (
    CodeRow,
    InboxRow,
    JobRunRow,
    LimitNoticeRow,
    OutboxFileRow,
    OutboxRow,
    table,
)
from gateway.store.prepared import SETTLED_INBOX, SETTLED_OUTBOX

BATCH = 2000
"""Rows deleted per transaction."""
NOTICE_DAYS = 40.0
"""Usage-limit notices are for a day or a month (``gateway.ops.usage``): older ones are done with."""
FINISHED_RUNS = ("sent", "unconfirmed", "failed", "skipped")

_inbox = table(InboxRow)
_outbox = table(OutboxRow)
_runs = table(JobRunRow)
_files = table(OutboxFileRow)
_codes = table(CodeRow)
_notices = table(LimitNoticeRow)


@dataclass
class Pruned:
    """Rows deleted per table name (only tables with any)."""

    rows: dict[str, int] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return any(self.rows.values())

    def describe(self) -> str:
        """``inbox 1200, outbox 1180`` (for the log)."""
        return ", ".join(f"{name} {count}" for name, count in sorted(self.rows.items()) if count)


def prune_settled(engine: Engine, older_than_s: float, now: float | None = None, batch: int = BATCH) -> Pruned:
    """Deletes what settled more than ``older_than_s`` seconds before ``now`` (module doc).

    An outbox row a scheduled run still waits on (run *delivering*) is kept whatever its age; rows
    not settled (*pending*, *claimed*, *sending*, *streaming*) are never touched.
    Returns the counts; raises the database's errors (the caller logs and tries again later).
    """
    now = time.time() if now is None else now
    cutoff = now - older_than_s
    waited_on = exists().where(_runs.c.outbox_id == _outbox.c.id, _runs.c.status == "delivering")
    plans: list[tuple[str, Table, Any, list[ColumnElement[bool]]]] = [
        ("inbox", _inbox, _inbox.c.id, [_inbox.c.status.in_(SETTLED_INBOX),
                                        func.coalesce(_inbox.c.finished_at, _inbox.c.received_at) < cutoff]),
        ("outbox", _outbox, _outbox.c.id, [_outbox.c.status.in_(SETTLED_OUTBOX),
                                           func.coalesce(_outbox.c.sent_at, _outbox.c.created_at) < cutoff,
                                           ~waited_on]),
        ("job_runs", _runs, _runs.c.id, [_runs.c.status.in_(FINISHED_RUNS),
                                         func.coalesce(_runs.c.finished_at, _runs.c.started_at) < cutoff]),
        ("outbox_files", _files, _files.c.id, [_files.c.created_at < cutoff]),
        ("codes", _codes, _codes.c.code, [_codes.c.expires_at < cutoff]),
        ("limit_notices", _notices, None, [_notices.c.created_at < now - max(older_than_s, NOTICE_DAYS * 86400)]),
    ]
    pruned = Pruned()
    for name, target, key, where in plans:
        pruned.rows[name] = _delete_in_batches(engine, target, key, where, batch)
    return pruned


def _delete_in_batches(engine: Engine, target: Table, key: Any, where: list[ColumnElement[bool]], batch: int) -> int:
    """Deletes ``target``'s rows matching ``where``, ``batch`` at a time (by ``key``; ``None``: in
    one statement, for small tables without a single-column key). The row with the highest
    integer id is never deleted: SQLite (no ``AUTOINCREMENT``) would hand its id out again, and a
    new message would get the id, and so the turn id ``in<id>``, of one already in a transcript
    (taken for a resumed turn: its text never reached the model)."""
    if key is not None and key.type.python_type is int:
        where = [*where, key < select(func.max(key)).scalar_subquery()]
    total = 0
    while True:
        with write_tx(engine) as conn:
            if key is None:
                return int(conn.execute(delete(target).where(*where)).rowcount or 0)
            chosen = select(key).where(*where).limit(batch)
            deleted = int(conn.execute(delete(target).where(key.in_(chosen))).rowcount or 0)
        total += deleted
        if deleted < batch:
            return total
