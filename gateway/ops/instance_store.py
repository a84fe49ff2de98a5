"""``InstanceStore``: the ``instances`` table, which process holds each instance id.

The instance id is the owner name in every lease and claim (lane leases, the Telegram poller
lease, outbox claims, job-run claims). Taking an id over and giving it up are one transaction
each, together with the leases and claims that name it, so a restarted process has its
predecessor's work back at once and a graceful stop leaves nothing for others to wait out.
Every write is fenced by the ``boot`` nonce: a process that lost the id changes nothing.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

from sqlalchemy import Connection, Engine, delete, func, insert, or_, select, update
from sqlalchemy.exc import IntegrityError

from gateway.store.db import read_tx, write_one, write_tx
from gateway.store.models import InboxRow, InstanceRow, JobRunRow, LaneRow, OutboxRow, table
from gateway.store.prepared import lock_lanes_in_key_order
from gateway.store.sql import retry_locked

_instances = table(InstanceRow)
_lanes = table(LaneRow)
_inbox = table(InboxRow)
_outbox = table(OutboxRow)
_job_runs = table(JobRunRow)

FORGET_AFTER_S = 7 * 24 * 3600.0
"""Rows of ids silent this long (a host or an ephemeral ``gateway chat`` gone for good) are
deleted when any process takes an id."""


@dataclass(frozen=True, slots=True)
class InstanceRecord:
    """One holder of an instance id. Times are epoch seconds; ``pid_scope`` says where ``pid``
    can be checked (see ``gateway.ops.instance.ProcessInfo``)."""

    id: str
    boot: str
    host: str
    pid: int
    pid_scope: str
    pid_start: str | None
    started_at: float
    heartbeat_at: float


@dataclass(frozen=True, slots=True)
class Released:
    """What a take-over or a release gave up: lane leases (receiver leases included), outbox
    claims, running job-run claims; ``crashed``: turns that were running when a crashed holder
    died (their first inbox rows' ``crashes`` counted up; a take-over only)."""

    lanes: int = 0
    replies: int = 0
    runs: int = 0
    crashed: int = 0

    def __str__(self) -> str:
        text = f"{self.lanes} lease(s), {self.replies} reply claim(s), {self.runs} report run claim(s)"
        return text + (f", {self.crashed} turn(s) it was running" if self.crashed else "")


class InstanceStore:
    """The ``instances`` rows on one engine. Blocking calls: run them off the main loop."""

    def __init__(self, engine: Engine, max_turn_crashes: int = 3) -> None:
        self.engine = engine
        self.max_turn_crashes = max_turn_crashes

    def get(self, instance_id: str) -> InstanceRecord | None:
        """The current holder of ``instance_id``, or ``None``."""
        with read_tx(self.engine) as conn:
            row = conn.execute(select(_instances).where(_instances.c.id == instance_id)).first()
        return InstanceRecord(**row._mapping) if row is not None else None

    def records(self) -> list[InstanceRecord]:
        """Every row, by id (admin, tests)."""
        with read_tx(self.engine) as conn:
            rows = conn.execute(select(_instances).order_by(_instances.c.id)).all()
        return [InstanceRecord(**row._mapping) for row in rows]

    @retry_locked
    def take(self, record: InstanceRecord, replacing: str | None) -> Released | None:
        """Makes ``record`` the holder of its id and frees every lease and claim the id holds, in
        one transaction. ``replacing`` is the boot nonce of the holder the caller judged gone
        (``None``: the caller saw no row). Returns ``None`` when the row is no longer what the
        caller saw (another process took the id meanwhile: judge again)."""
        values = {k: getattr(record, k) for k in ("boot", "host", "pid", "pid_scope", "pid_start", "started_at",
                                                  "heartbeat_at")}
        try:
            with write_tx(self.engine) as conn:
                if replacing is None:
                    conn.execute(insert(_instances).values(id=record.id, **values))
                elif conn.execute(update(_instances).where(_instances.c.id == record.id,
                                                           _instances.c.boot == replacing)
                                  .values(**values)).rowcount != 1:
                    return None
                conn.execute(delete(_instances).where(_instances.c.heartbeat_at < record.heartbeat_at - FORGET_AFTER_S))
                crashed = _count_crashes(conn, record.id, self.max_turn_crashes - 1) if replacing is not None else 0
                return dataclasses.replace(_free(conn, record.id), crashed=crashed)
        except IntegrityError:
            return None  # a row appeared since the caller looked

    @retry_locked
    def beat(self, instance_id: str, boot: str) -> bool:
        """Renews the heartbeat; ``False`` when ``boot`` no longer holds the id (taken over)."""
        with write_one(self.engine) as conn:  # one statement: one round trip on PostgreSQL
            return conn.execute(update(_instances).where(_instances.c.id == instance_id, _instances.c.boot == boot)
                                .values(heartbeat_at=time.time())).rowcount == 1

    @retry_locked
    def release(self, instance_id: str, boot: str) -> Released | None:
        """Gives the id up (graceful stop): deletes the row and frees every lease and claim the id
        holds, in one transaction. ``None`` (nothing changed) when ``boot`` no longer holds it."""
        with write_tx(self.engine) as conn:
            if conn.execute(delete(_instances).where(_instances.c.id == instance_id,
                                                     _instances.c.boot == boot)).rowcount != 1:
                return None
            _clear_last_tries(conn, instance_id)
            return _free(conn, instance_id)


def _count_crashes(conn: Connection, owner: str, last_try_from: int) -> int:
    """Counts a crash on the turns ``owner`` (a holder that died without releasing) was running:
    ``crashes`` + 1 on the oldest pending inbox row of each lane it leased (the head of the batch
    its turn answered; a resumed turn reads the same head, ``TurnRunner.run`` gives up at
    ``bus.max_turn_crashes``), except on rows with ``last_try_from`` crashes already that were not
    making their last try: those wait for it one at a time (``InboxRow.last_try``), so a turn that
    takes the process down is counted alone at its last try and the turns that merely ran beside it
    are not given up. Clears ``last_try`` on the owner's lanes. Returns how many rows were counted.
    Runs before ``_free`` (which clears the leases), only when an id is taken over, never on the
    message path."""
    leased = select(_lanes.c.key).where(_lanes.c.lease_owner == owner)
    heads = (select(func.min(_inbox.c.id))
             .where(_inbox.c.session_key.in_(leased), _inbox.c.status == "pending")
             .group_by(_inbox.c.session_key))
    counted = int(conn.execute(update(_inbox).where(_inbox.c.id.in_(heads),
                                                    or_(_inbox.c.crashes < last_try_from, _inbox.c.last_try))
                               .values(crashes=_inbox.c.crashes + 1)).rowcount or 0)
    _clear_last_tries(conn, owner)
    return counted


def _clear_last_tries(conn: Connection, owner: str) -> None:
    """Clears ``last_try`` on the pending rows of the lanes ``owner`` leases, and only there: a
    last try another instance is running keeps its mark (found by a review: clearing every row let
    a poisoned turn's crash go uncounted whenever another instance restarted meanwhile)."""
    leased = select(_lanes.c.key).where(_lanes.c.lease_owner == owner)
    conn.execute(update(_inbox).where(_inbox.c.session_key.in_(leased), _inbox.c.status == "pending",
                                      _inbox.c.last_try).values(last_try=False))


def _free(conn: Connection, owner: str) -> Released:
    """Frees what ``owner`` holds. Lanes: no owner (their pending rows are swept at once). Outbox
    and job-run claims: expired, so the next claim takes them with the usual rules (a reply left
    ``sending`` becomes ``unconfirmed``, never sent twice; a report run is resumed or failed)."""
    held = lock_lanes_in_key_order(_lanes.c.lease_owner == owner)  # the order every lane writer locks in
    # counted from RETURNING: sqlite3 reports rowcount -1 for a statement that starts with WITH
    lanes = len(conn.execute(update(_lanes).where(_lanes.c.key.in_(select(held.c.key)))
                             .values(lease_owner=None, lease_until=0.0).returning(_lanes.c.key)).all())
    replies = conn.execute(update(_outbox).where(_outbox.c.claimed_by == owner,
                                                 _outbox.c.status.in_(("claimed", "sending")))
                           .values(claim_until=0.0)).rowcount
    runs = conn.execute(update(_job_runs).where(_job_runs.c.claimed_by == owner, _job_runs.c.status == "running")
                        .values(claim_until=0.0)).rowcount
    return Released(lanes, replies, runs)
