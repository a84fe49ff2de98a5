"""``PushService``: scheduled reports on the main loop (DESIGN §8).

- Loads job definitions from the ``jobs`` table into the scheduler at start and keeps them in
  sync: every ``reload_interval_s`` (jobs created or removed on another instance), and at once
  when this instance changes one.
- A due fire (from the scheduler, ``/run`` or the CLI) is claimed by inserting its run row; only
  the inserter runs it, on the worker pool, renewing the claim while the agent works.
- Every ``reload_interval_s`` it also takes over runs whose owner stopped renewing (died), and
  tells owners about failed runs in their DM (once per run, across instances).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Executor
from datetime import UTC, datetime
from typing import Any

from gateway.core.i18n import _, in_locale
from gateway.core.types import OutboundMessage
from gateway.scheduler.planner import format_address, job_schedule, local_time
from gateway.scheduler.push_run import PushRunner
from gateway.scheduler.store import Job, JobRun, JobStore, RunClaim
from gateway.scheduler.triggers import JobTiming, Scheduler

log = logging.getLogger("gateway.scheduler.service")


class PushService:
    """Owns the scheduler and the fire -> claim -> run path of this instance.

    Args:
        run_db: runs a blocking store call off the main loop (``Gateway.run_db``).
        workers: the turn worker pool (pushes run the agent there).
        on_queued: called on the main loop after an answer or notice was queued (wakes delivery).
        claim_timeout_s: a run claim not renewed for this long is taken over; renewed every third.
        reload_interval_s: how often definitions are reloaded and orphaned runs looked for.
    """

    def __init__(self, *, jobs: JobStore, runner: PushRunner, run_db: Callable[..., Any], workers: Executor,
                 instance_id: str, on_queued: Callable[[], None], misfire_grace_s: float = 300.0,
                 claim_timeout_s: float = 60.0, reload_interval_s: float = 15.0,
                 on_fired: Callable[[str], None] | None = None, locale: str | None = None) -> None:
        self.jobs = jobs
        self.locale = locale
        """The language of failure notices (``i18n.default``: a notice answers no message)."""
        self._on_fired = on_fired
        self.runner = runner
        self._run_db = run_db
        self._workers = workers
        self.instance_id = instance_id
        self._on_queued = on_queued
        self.claim_timeout_s = claim_timeout_s
        self.reload_interval_s = reload_interval_s
        self.scheduler = Scheduler(self._due, misfire_grace_s=misfire_grace_s)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._fires: set[asyncio.Task[Any]] = set()
        self._reload_now = asyncio.Event()
        self.fired = 0
        """Runs this instance claimed and ran (metrics, tests)."""

    # -- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        """Loads the jobs, takes over runs whose claim expired, starts the scheduler and the
        maintenance loop."""
        self._loop = asyncio.get_running_loop()
        await self.reload()
        try:  # runs this instance id held before a crash were freed at start: resume them now
            await self.take_over()
        except Exception:
            log.exception("scheduled reports: take_over failed")
        self.scheduler.start()
        self._task = asyncio.create_task(self._maintain(), name="pushes")

    async def stop(self) -> None:
        """Stops firing; runs in progress finish on their worker threads (their claims then expire
        if this process exits first, and another instance takes them over)."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        self.scheduler.stop()
        for task in list(self._fires):
            task.cancel()
        await asyncio.gather(*self._fires, return_exceptions=True)

    # -- thread-safe entry points (worker threads: chat commands, the agent's tool) --------------
    def job_changed(self) -> None:
        """Asks for a reload of the definitions now (a job was created or removed here)."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._reload_now.set)

    def fire_soon(self, job_id: str, scheduled_at: float, trigger: str = "manual") -> None:
        """Starts ``fire`` on the main loop without waiting for it."""
        if self._loop is None:
            raise RuntimeError("the push service is not running")
        self._loop.call_soon_threadsafe(self._spawn, job_id, scheduled_at, trigger)

    # -- firing --------------------------------------------------------------------------------
    def _due(self, job_id: str, scheduled_at: datetime) -> None:
        self._spawn(job_id, scheduled_at.timestamp(), "schedule")

    def _spawn(self, job_id: str, scheduled_at: float, trigger: str) -> None:
        task = asyncio.create_task(self.fire(job_id, scheduled_at, trigger), name=f"push-{job_id}")
        self._fires.add(task)
        task.add_done_callback(self._fires.discard)

    async def fire(self, job_id: str, scheduled_at: float, trigger: str = "schedule") -> int | None:
        """Claims and runs the fire of ``job_id`` at ``scheduled_at`` (epoch s). Returns the run id
        when this instance ran it, ``None`` when another instance (or an earlier call) has it.
        A redelivered or concurrent fire of the same time is a no-op: the claim is the run row."""
        next_at: float | None = None
        if trigger == "schedule":
            nxt = self.scheduler.next_after(job_id, datetime.fromtimestamp(scheduled_at, UTC))
            next_at = nxt.timestamp() if nxt is not None else None
        try:
            claim = await self._run_db(self.jobs.claim_run, job_id, scheduled_at, trigger, self.instance_id,
                                       self.claim_timeout_s, next_at)
        except Exception:
            log.exception("job %s: could not claim the fire at %s", job_id, scheduled_at)
            return None
        if claim is None:
            log.debug("job %s: fire at %s already claimed", job_id, scheduled_at)
            return None
        await self._execute(claim)
        return claim.run_id

    async def _execute(self, claim: RunClaim) -> str:
        lost = threading.Event()
        keeper = asyncio.create_task(self._keep_claim(claim, lost))
        try:
            status = await asyncio.get_running_loop().run_in_executor(self._workers, self.runner.run, claim,
                                                                      lost.is_set)
        except Exception:
            log.exception("push run %s of job %s failed on a database error; it will be taken over",
                          claim.run_id, claim.job_id)
            return "error"
        finally:
            keeper.cancel()
        self.fired += 1
        if self._on_fired is not None:
            self._on_fired(status)
        self._on_queued()
        if status == "failed":
            await self.notify_failures()
        return status

    async def _keep_claim(self, claim: RunClaim, lost: threading.Event) -> None:
        while True:
            await asyncio.sleep(self.claim_timeout_s / 3)
            try:
                if not await self._run_db(self.jobs.renew_run, claim, self.claim_timeout_s):
                    lost.set()
                    return
            except Exception:
                log.exception("push run %s: claim renewal failed", claim.run_id)

    # -- maintenance ---------------------------------------------------------------------------
    async def reload(self) -> None:
        """Loads enabled job definitions into the scheduler (adds, replaces, removes)."""
        jobs = await self._run_db(functools.partial(self.jobs.list_jobs, None, enabled_only=True))
        added, removed = self.scheduler.sync(
            JobTiming(j.id, job_schedule(j), j.timezone, j.created_at, j.updated_at, j.next_fire_at) for j in jobs)
        if added or removed:
            log.info("scheduler: %d job(s) (re)loaded, %d removed; %d scheduled", added, removed,
                     len(self.scheduler.scheduled()))

    async def take_over(self) -> int:
        """Runs fires whose claim expired (their instance died); returns how many were taken."""
        claims = await self._run_db(self.jobs.take_over_expired, self.instance_id, self.claim_timeout_s)
        for claim in claims:
            log.warning("push run %s of job %s: owner stopped renewing its claim; taking over (attempt %d)",
                        claim.run_id, claim.job_id, claim.attempts)
            task = asyncio.create_task(self._execute(claim))
            self._fires.add(task)
            task.add_done_callback(self._fires.discard)
        return len(claims)

    async def notify_failures(self) -> int:
        """Queues a DM notice for each failed run not yet notified; returns how many."""
        queued = await self._run_db(in_locale(self.locale, self.jobs.notify_failures), failure_notice)
        if queued:
            self._on_queued()
        return queued

    async def _maintain(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self._reload_now.wait(), self.reload_interval_s)
            except TimeoutError:
                pass
            self._reload_now.clear()
            for step in (self.reload, self.take_over, self.notify_failures):
                try:
                    await step()
                except Exception:
                    log.exception("scheduled reports: %s failed", step.__name__)


def failure_notice(job: Job, run: JobRun) -> OutboundMessage | None:
    """The DM telling a job's owner that a run failed (``None`` when their DM is unknown)."""
    if job.owner_dm is None:
        log.warning("job %s: run %s failed (%s); the owner's DM is unknown, nobody told", job.id, run.id, run.error)
        return None
    text = _("⚠️ Your scheduled report `{id}` ({schedule}, {zone}) due {due} was not delivered to {target}: "
             "{error}", id=job.id, schedule=job_schedule(job).describe(), zone=job.timezone,
             due=local_time(run.scheduled_at, job.timezone), target=format_address(job.target),
             error=run.error or _("unknown error"))
    return OutboundMessage(job.owner_dm, text, idempotency_key=f"pushfail:{run.id}")
