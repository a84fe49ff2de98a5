"""``JobStore``: the durable side of scheduled reports (DESIGN §8): job definitions, run claims,
the answer handed to the outbox, and the inbox look-ups that decide who may post where.

Exactly once across instances: a fire is claimed by inserting its ``job_runs`` row, unique on
(job id, scheduled time); only the inserter runs it. A ``running`` claim is renewed while the agent
works; one left to expire (its owner died) is taken over by another instance, fenced: every later
write names the owner and succeeds only while that owner still holds the claim.

Calls block (SQLAlchemy sync engine): run them on worker threads, never on the main loop.
"""

from __future__ import annotations

import secrets
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, delete, func, insert, select, update
from sqlalchemy.exc import IntegrityError

from gateway.core.types import ChatAddress, OutboundMessage
from gateway.store.db import read_tx, write_tx
from gateway.store.models import ChatMemberRow, JobRow, JobRunRow, OutboxRow, SessionRow, table
from gateway.store.sql import Store, retry_locked

_members = table(ChatMemberRow)
_jobs = table(JobRow)
_outbox = table(OutboxRow)
_runs = table(JobRunRow)
_sessions = table(SessionRow)

_ID_ALPHABET = "abcdefghjkmnpqrstuvwxyz23456789"  # no 0/o, 1/l/i: ids are typed by hand
MAX_ATTEMPTS = 3
"""Claims a run may go through (first + takeovers) before it is failed: a report that kills its
instance every time must not take the others down one by one."""


@dataclass(frozen=True, slots=True)
class NewJob:
    """A validated job definition, ready to store (see ``gateway.scheduler.planner.JobPlanner``)."""

    owner: str
    owner_name: str
    owner_dm: ChatAddress | None
    target: ChatAddress
    schedule_kind: str
    schedule: str
    timezone: str
    prompt: str
    toolset: str = "default"
    source: str | None = None
    next_fire_at: float | None = None


@dataclass(frozen=True, slots=True)
class Job:
    """A stored job (times are epoch seconds, UTC)."""

    id: str
    owner: str
    owner_name: str
    owner_dm: ChatAddress | None
    target: ChatAddress
    schedule_kind: str
    schedule: str
    timezone: str
    prompt: str
    toolset: str
    enabled: bool
    created_at: float
    updated_at: float
    last_fire_at: float | None
    next_fire_at: float | None


@dataclass(frozen=True, slots=True)
class JobRun:
    """A stored run of a job (times are epoch seconds, UTC)."""

    id: int
    job_id: str
    scheduled_at: float
    trigger: str
    status: str
    claimed_by: str | None
    attempts: int
    outbox_id: int | None
    platform_message_ids: list[str] | None
    error: str | None
    started_at: float
    finished_at: float | None


@dataclass(frozen=True, slots=True)
class RunClaim:
    """A run this instance holds: it alone may run it until ``claim_until`` passes unrenewed."""

    run_id: int
    job_id: str
    scheduled_at: float
    owner: str
    attempts: int
    trigger: str = "schedule"
    """``schedule`` | ``manual`` (``/run``, ``gateway jobs run``)."""


def _job(row: Any) -> Job:
    return Job(row.id, row.owner, row.owner_name, ChatAddress.from_dict(row.owner_dm) if row.owner_dm else None,
               ChatAddress.from_dict(row.target), row.schedule_kind, row.schedule, row.timezone, row.prompt,
               row.toolset, bool(row.enabled), row.created_at, row.updated_at, row.last_fire_at, row.next_fire_at)


def _run(row: Any) -> JobRun:
    return JobRun(row.id, row.job_id, row.scheduled_at, row.trigger, row.status, row.claimed_by, row.attempts,
                  row.outbox_id, row.platform_message_ids, row.error, row.started_at, row.finished_at)


class JobStore:
    """Jobs and runs on one SQLAlchemy engine (SQLite or PostgreSQL)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    # -- definitions ---------------------------------------------------------------------------
    @retry_locked
    def create_job(self, new: NewJob) -> tuple[Job, bool]:
        """Stores ``new`` under a fresh short id. Returns ``(job, created)``: when a job with the
        same ``source`` exists (a redelivered command) that job is returned with ``False``."""
        now = time.time()
        for length in (6, 6, 8, 8, 12):
            job_id = "".join(secrets.choice(_ID_ALPHABET) for _ in range(length))
            try:
                with write_tx(self.engine) as conn:
                    if new.source is not None:
                        row = conn.execute(select(_jobs).where(_jobs.c.source == new.source)).first()
                        if row is not None:
                            return _job(row), False
                    conn.execute(insert(_jobs).values(
                        id=job_id, owner=new.owner, owner_name=new.owner_name,
                        owner_dm=new.owner_dm.to_dict() if new.owner_dm else None, target=new.target.to_dict(),
                        schedule_kind=new.schedule_kind, schedule=new.schedule, timezone=new.timezone,
                        prompt=new.prompt, toolset=new.toolset, enabled=True, source=new.source,
                        created_at=now, updated_at=now, last_fire_at=None, next_fire_at=new.next_fire_at,
                    ))
            except IntegrityError:
                continue  # the id was taken, or a concurrent insert of the same source: look again
            job = self.get_job(job_id)
            assert job is not None
            return job, True
        raise RuntimeError("could not allocate a job id")

    def get_job(self, job_id: str) -> Job | None:
        """The job, or ``None`` when there is no such id."""
        with read_tx(self.engine) as conn:
            row = conn.execute(select(_jobs).where(_jobs.c.id == job_id)).first()
        return _job(row) if row is not None else None

    def list_jobs(self, owner: str | None = None, *, enabled_only: bool = False) -> list[Job]:
        """Jobs, oldest first; only ``owner``'s when given."""
        query = select(_jobs).order_by(_jobs.c.created_at, _jobs.c.id)
        if owner is not None:
            query = query.where(_jobs.c.owner == owner)
        if enabled_only:
            query = query.where(_jobs.c.enabled.is_(True))
        with read_tx(self.engine) as conn:
            return [_job(row) for row in conn.execute(query).all()]

    @retry_locked
    def delete_job(self, job_id: str) -> bool:
        """Removes the job (its runs stay as history). Returns whether it existed."""
        with write_tx(self.engine) as conn:
            return conn.execute(delete(_jobs).where(_jobs.c.id == job_id)).rowcount == 1

    @retry_locked
    def set_enabled(self, job_id: str, enabled: bool) -> bool:
        """Pauses (``False``) or resumes a job; schedulers drop or re-add it at their next reload.
        Returns whether the job exists."""
        with write_tx(self.engine) as conn:
            return conn.execute(update(_jobs).where(_jobs.c.id == job_id)
                                .values(enabled=enabled, updated_at=time.time())).rowcount == 1

    @retry_locked
    def set_next_fire(self, job_id: str, next_fire_at: float | None) -> None:
        """Records the next scheduled time (bookkeeping; ``updated_at`` is not touched)."""
        with write_tx(self.engine) as conn:
            conn.execute(update(_jobs).where(_jobs.c.id == job_id).values(next_fire_at=next_fire_at))

    # -- runs ----------------------------------------------------------------------------------
    @retry_locked
    def claim_run(self, job_id: str, scheduled_at: float, trigger: str, owner: str, claim_s: float,
                  next_fire_at: float | None = None) -> RunClaim | None:
        """Claims the fire of ``job_id`` at ``scheduled_at`` by inserting its run row. Returns
        ``None`` when another instance (or an earlier call) already claimed it. For a scheduled
        fire, the job's last/next fire times are updated in the same transaction."""
        now = time.time()
        try:
            with write_tx(self.engine) as conn:
                run_id = conn.execute(insert(_runs).values(  # type: ignore[index]
                    job_id=job_id, scheduled_at=scheduled_at, trigger=trigger, status="running", claimed_by=owner,
                    claim_until=now + claim_s, attempts=1, started_at=now,
                )).inserted_primary_key[0]
                if trigger == "schedule":
                    conn.execute(update(_jobs).where(_jobs.c.id == job_id)
                                 .values(last_fire_at=scheduled_at, next_fire_at=next_fire_at))
        except IntegrityError:
            return None
        return RunClaim(int(run_id), job_id, scheduled_at, owner, 1, trigger)

    @retry_locked
    def renew_run(self, claim: RunClaim, claim_s: float) -> bool:
        """Extends the claim; ``False`` when it was lost (taken over, or settled)."""
        with write_tx(self.engine) as conn:
            return conn.execute(
                update(_runs)
                .where(_runs.c.id == claim.run_id, _runs.c.claimed_by == claim.owner, _runs.c.status == "running")
                .values(claim_until=time.time() + claim_s)
            ).rowcount == 1

    @retry_locked
    def take_over_expired(self, owner: str, claim_s: float, limit: int = 20) -> list[RunClaim]:
        """Claims ``running`` runs whose owner stopped renewing (died). A run that has used
        ``MAX_ATTEMPTS`` claims is failed instead (the owner is then told)."""
        now = time.time()
        claims: list[RunClaim] = []
        with write_tx(self.engine) as conn:
            rows = conn.execute(
                select(_runs.c.id, _runs.c.job_id, _runs.c.scheduled_at, _runs.c.attempts, _runs.c.trigger)
                .where(_runs.c.status == "running", _runs.c.claim_until < now)
                .order_by(_runs.c.id).limit(limit)
            ).all()
            for row in rows:
                expired = [_runs.c.id == row.id, _runs.c.status == "running", _runs.c.claim_until < now]
                if row.attempts >= MAX_ATTEMPTS:
                    conn.execute(update(_runs).where(*expired).values(
                        status="failed", finished_at=now,
                        error=f"gave up after {row.attempts} attempts (the instance running it stopped each time)"))
                    continue
                won = conn.execute(update(_runs).where(*expired).values(
                    claimed_by=owner, claim_until=now + claim_s, attempts=row.attempts + 1)).rowcount
                if won:
                    claims.append(RunClaim(row.id, row.job_id, row.scheduled_at, owner, row.attempts + 1, row.trigger))
        return claims

    @retry_locked
    def run_session(self, claim: RunClaim, system_prompt: str) -> str | None:
        """The run's own agent session: created (with ``system_prompt``) on the first attempt,
        the same one on a takeover (its transcript is resumed). ``None`` if the claim was lost."""
        with write_tx(self.engine) as conn:
            row = conn.execute(select(_runs.c.session_id).where(
                _runs.c.id == claim.run_id, _runs.c.claimed_by == claim.owner, _runs.c.status == "running")).first()
            if row is None:
                return None
            if row.session_id:
                return str(row.session_id)
            session_id, now = uuid.uuid4().hex, time.time()
            conn.execute(insert(_sessions).values(id=session_id, key=f"job:{claim.job_id}",
                                                  system_prompt=system_prompt, created_at=now, updated_at=now))
            conn.execute(update(_runs).where(_runs.c.id == claim.run_id).values(session_id=session_id))
        return session_id

    def session_prompt(self, session_id: str) -> str:
        """The stored system prompt of a run's session (read back byte for byte)."""
        with read_tx(self.engine) as conn:
            return str(conn.execute(select(_sessions.c.system_prompt).where(_sessions.c.id == session_id))
                       .scalar_one())

    @retry_locked
    def finish_run(self, claim: RunClaim, *, reply: OutboundMessage | None = None, status: str = "delivering",
                   error: str | None = None, disable_job: bool = False) -> bool:
        """Ends the agent part of a run, fenced by the claim. With ``reply`` the answer is queued
        in the outbox in the same transaction and the run becomes ``delivering`` (linked to the
        outbox row, settled when the row is); otherwise the run ends with ``status`` (``failed``,
        ``skipped``) and ``error``. ``disable_job`` retires a one-shot job. Returns ``False`` (and
        writes nothing) when the claim was lost."""
        now = time.time()
        with write_tx(self.engine) as conn:
            mine = [_runs.c.id == claim.run_id, _runs.c.claimed_by == claim.owner, _runs.c.status == "running"]
            if conn.execute(select(_runs.c.id).where(*mine)).first() is None:
                return False
            values: dict[str, Any] = {"status": status, "error": error}
            if reply is not None:
                Store._queue(conn, reply, None, f"job:{claim.job_id}", 0, now)
                values["outbox_id"] = conn.execute(
                    select(_outbox.c.id).where(_outbox.c.idempotency_key == reply.idempotency_key)).scalar_one()
                values["status"] = "delivering"
            else:
                values["finished_at"] = now
            conn.execute(update(_runs).where(*mine).values(**values))
            if disable_job:
                conn.execute(update(_jobs).where(_jobs.c.id == claim.job_id).values(enabled=False, updated_at=now,
                                                                                    next_fire_at=None))
        return True

    def get_run(self, run_id: int) -> JobRun | None:
        """The run, or ``None`` when there is no such id."""
        with read_tx(self.engine) as conn:
            row = conn.execute(select(_runs).where(_runs.c.id == run_id)).first()
        return _run(row) if row is not None else None

    def runs(self, job_id: str | None = None, limit: int = 100) -> list[JobRun]:
        """Runs, newest scheduled time first (all jobs when ``job_id`` is ``None``)."""
        query = select(_runs).order_by(_runs.c.scheduled_at.desc(), _runs.c.id.desc()).limit(limit)
        if job_id is not None:
            query = query.where(_runs.c.job_id == job_id)
        with read_tx(self.engine) as conn:
            return [_run(row) for row in conn.execute(query).all()]

    def last_runs(self, job_ids: Sequence[str]) -> dict[str, JobRun]:
        """The latest run (by scheduled time) of each job that has one."""
        if not job_ids:
            return {}
        latest = (select(_runs.c.job_id, func.max(_runs.c.scheduled_at).label("at"))
                  .where(_runs.c.job_id.in_(list(job_ids))).group_by(_runs.c.job_id).subquery())
        with read_tx(self.engine) as conn:
            rows = conn.execute(select(_runs).join(latest, (latest.c.job_id == _runs.c.job_id)
                                                   & (latest.c.at == _runs.c.scheduled_at))).all()
        return {row.job_id: _run(row) for row in rows}

    @retry_locked
    def notify_failures(self, notice_for: Any, limit: int = 50) -> int:
        """Queues one notice per failed run not yet notified, to its job owner's DM, and marks it
        notified in the same transaction (so two instances never both tell). ``notice_for(job,
        run)`` returns the ``OutboundMessage`` or ``None`` (no DM known: nothing to send).
        Returns the number of notices queued."""
        queued = 0
        now = time.time()
        with write_tx(self.engine) as conn:
            rows = conn.execute(
                select(_runs, _jobs.c.id.label("jid"))
                .select_from(_runs.outerjoin(_jobs, _jobs.c.id == _runs.c.job_id))
                .where(_runs.c.status == "failed", _runs.c.notified_at.is_(None))
                .order_by(_runs.c.id).limit(limit)
            ).all()
            for row in rows:
                won = conn.execute(update(_runs).where(_runs.c.id == row.id, _runs.c.notified_at.is_(None))
                                   .values(notified_at=now)).rowcount
                if not won or row.jid is None:
                    continue
                job = _job(conn.execute(select(_jobs).where(_jobs.c.id == row.jid)).one())
                notice = notice_for(job, _run(row))
                if notice is not None:
                    Store._queue(conn, notice, None, f"job:{job.id}", 0, now)
                    queued += 1
        return queued

    # -- who may post where (``chat_members``: who has written to the bot from which chat) ---------
    def has_written_from(self, platform: str, tenant: str, user_id: str, chat_id: str) -> bool:
        """Whether platform user ``user_id`` has written to the bot from chat ``chat_id`` (any thread)."""
        with read_tx(self.engine) as conn:
            return conn.execute(
                select(_members.c.chat_type).where(
                    _members.c.platform == platform, _members.c.tenant == tenant, _members.c.chat_id == chat_id,
                    _members.c.user_id == user_id)
            ).first() is not None

    def chat_seen(self, platform: str, tenant: str, chat_id: str) -> bool:
        """Whether anyone has written to the bot from chat ``chat_id`` (the bot is part of it)."""
        with read_tx(self.engine) as conn:
            return conn.execute(
                select(_members.c.user_id).where(_members.c.platform == platform, _members.c.tenant == tenant,
                                                 _members.c.chat_id == chat_id).limit(1)
            ).first() is not None

    def tenants_of_chat(self, platform: str, chat_id: str) -> list[str]:
        """Tenants (platform accounts) from which chat ``chat_id`` has written to the bot."""
        with read_tx(self.engine) as conn:
            rows = conn.execute(
                select(_members.c.tenant).where(_members.c.platform == platform, _members.c.chat_id == chat_id)
                .group_by(_members.c.tenant).order_by(_members.c.tenant)
            ).scalars().all()
        return list(rows)

    def dm_address(self, platform: str, tenant: str, user_id: str) -> ChatAddress | None:
        """The DM chat of platform user ``user_id`` on that platform account, if they ever wrote to
        the bot there (the latest such chat first seen)."""
        with read_tx(self.engine) as conn:
            chat_id = conn.execute(
                select(_members.c.chat_id).where(_members.c.platform == platform, _members.c.tenant == tenant,
                                                 _members.c.user_id == user_id, _members.c.chat_type == "dm")
                .order_by(_members.c.first_seen_at.desc()).limit(1)
            ).scalar_one_or_none()
        return ChatAddress(platform, tenant, chat_id) if chat_id is not None else None

