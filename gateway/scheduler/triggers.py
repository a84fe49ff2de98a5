"""The scheduler (DESIGN §8): APScheduler 3 drives each job's trigger in the job's IANA zone.

The only module that imports APScheduler. It knows time, not work: when a fire is due it hands
``(job_id, scheduled time)`` to a callback (``gateway.scheduler.service.PushService.fire``), which claims the
fire in the database and runs it. APScheduler jobs hold the job id only; the definition lives in
the ``jobs`` table and is (re)loaded with ``sync``.

Rules kept here:
- every trigger gets an explicit ``timezone`` (never the host's zone);
- crontab day-of-week numbers (0 or 7 = Sunday, 1 = Monday; POSIX crontab(5)) are translated to
  names before APScheduler 3 sees them: its numbers start at Monday = 0, so ``CronTrigger.
  from_crontab("0 9 * * 1")`` would fire on Tuesdays (APScheduler 3 docs, ``from_crontab``);
- when both day of month and day of week are restricted, crontab fires when *either* matches
  (crontab(5)); APScheduler ANDs its fields, so such a schedule becomes an ``OrTrigger``;
- coalescing plus a misfire grace: fires missed while the loop was busy (or the process was
  down, see ``sync``'s catch-up) run once, late, if the latest one is within the grace; older
  ones are skipped and logged. A one-shot (``at``) fire has no grace: missed while no instance
  ran, it runs late, once, at the next start (as atd runs overdue jobs; its only fire was lost).
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from apscheduler.executors.base import BaseExecutor
from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.triggers.base import BaseTrigger
from apscheduler.triggers.combining import OrTrigger
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.date import DateTrigger
from apscheduler.triggers.interval import IntervalTrigger

from gateway.core.errors import GatewayError

log = logging.getLogger("gateway.scheduler.triggers")

MIN_INTERVAL_S = 60
"""Shortest interval schedule accepted (a report every few seconds is a mistake)."""
MAX_INTERVAL_S = 366 * 86400
"""Longest interval schedule accepted (a year; rarer reports are a cron or ``at`` schedule, and
intervals past what a ``datetime`` holds crashed the planner)."""

_DAY_NAMES = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")  # crontab numbering: index = number
_FULL_DAY_NAMES = ("sunday", "monday", "tuesday", "wednesday", "thursday", "friday", "saturday")
_MACROS = {"@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *", "@weekly": "0 0 * * 0",
           "@daily": "0 0 * * *", "@midnight": "0 0 * * *", "@hourly": "0 * * * *"}
_FIELDS = ("minute", "hour", "day of month", "month", "day of week")
_INTERVAL = re.compile(r"^every\s+(\d+)\s*(s|sec|secs|seconds?|m|min|mins|minutes?|h|hours?|d|days?)$", re.I)
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


class ScheduleError(GatewayError):
    """A schedule or time zone that cannot be used; the message names the problem."""


@dataclass(frozen=True, slots=True)
class Schedule:
    """A parsed schedule: ``kind`` ``cron`` (crontab text), ``interval`` (seconds as text) or
    ``once`` (local ISO date-time ``YYYY-MM-DDTHH:MM``)."""

    kind: str
    expr: str

    def describe(self) -> str:
        """Human form: ``0 9 * * 1-5``, ``every 3600 s``, ``at 2026-12-01T09:00``."""
        if self.kind == "interval":
            return f"every {self.expr} s"
        if self.kind == "once":
            return f"at {self.expr}"
        return self.expr


def zone(name: str) -> ZoneInfo:
    """The IANA zone ``name``. Raises ``ScheduleError`` naming it when unknown."""
    try:
        if not name or name != name.strip() or name.lower() == "localtime":
            raise ValueError(name)
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ScheduleError(f"unknown time zone {name!r}: use an IANA name such as Europe/Warsaw, "
                            "Asia/Shanghai or UTC") from None


def parse_schedule(text: str) -> Schedule:
    """Classifies user text: a 5-field crontab line or ``@daily``-style macro, ``every 30m``,
    or ``at 2026-12-01 09:00``. Only the form is checked here; ``build_trigger`` checks values.

    Raises:
        ScheduleError: the text is none of these forms.
    """
    text = " ".join(text.split())
    if not text:
        raise ScheduleError("the schedule is empty: give a cron expression such as \"0 9 * * 1-5\"")
    lowered = text.lower()
    if lowered in _MACROS:
        return Schedule("cron", _MACROS[lowered])
    if match := _INTERVAL.match(text):
        seconds = int(match.group(1)) * _UNIT_S[match.group(2)[0].lower()]
        return Schedule("interval", str(seconds))
    if lowered.startswith("at "):
        raw = text[3:].strip().replace(" ", "T", 1)
        try:
            when = datetime.fromisoformat(raw)
        except ValueError:
            raise ScheduleError(f"bad time {text[3:]!r}: write it as YYYY-MM-DD HH:MM") from None
        if when.tzinfo is not None:
            raise ScheduleError("give the one-shot time without an offset; the job's time zone applies")
        return Schedule("once", when.isoformat(timespec="minutes"))
    fields = text.split(" ")
    if len(fields) != 5:
        raise ScheduleError(f"bad cron expression {text!r}: expected 5 fields (minute hour day-of-month month "
                            f"day-of-week), got {len(fields)}")
    return Schedule("cron", text)


def crontab_days(field: str) -> str:
    """Translates a crontab day-of-week field to APScheduler 3 weekday names.

    ``1`` -> ``mon``; ``0``/``7`` -> ``sun``; ``1-5`` -> ``mon,tue,wed,thu,fri``; ``*/2`` ->
    ``sun,tue,thu,sat``; names pass through. ``*`` stays ``*``.

    Raises:
        ScheduleError: an unknown day, a value outside 0-7, or a backwards range.
    """
    if field == "*":
        return "*"
    days: set[int] = set()
    for part in field.lower().split(","):
        body, _, step_text = part.partition("/")
        step = 1
        if step_text:
            if not _is_number(step_text) or int(step_text) == 0:
                raise ScheduleError(f"day of week: bad step in {part!r}")
            step = int(step_text)
        if body == "*":
            first, last = 0, 6
        elif "-" in body:
            first_text, _, last_text = body.partition("-")
            first, last = _day_number(first_text), _day_number(last_text)
            if last == 0 and last_text.strip() == "7":
                last = 7
            if first > last:
                raise ScheduleError(f"day of week: range {body!r} runs backwards (0 and 7 are Sunday, 1 is Monday)")
        else:
            first = _day_number(body)
            last = 6 if step_text else first
        days.update(day % 7 for day in range(first, last + 1, step))
    return ",".join(_DAY_NAMES[d] for d in sorted(days, key=lambda d: (d + 6) % 7))


def _is_number(text: str) -> bool:
    """ASCII digits only: ``str.isdigit`` also passes ``²`` and ``①``, which ``int`` refuses."""
    return text.isascii() and text.isdigit()


def _day_number(text: str) -> int:
    text = text.strip()
    if _is_number(text):
        number = int(text)
        if number > 7:
            raise ScheduleError(f"day of week: {number} is out of range (0-7, 0 and 7 are Sunday)")
        return number % 7
    if text in _DAY_NAMES:
        return _DAY_NAMES.index(text)
    if text in _FULL_DAY_NAMES:
        return _FULL_DAY_NAMES.index(text)
    raise ScheduleError(f"day of week: unknown day {text!r}")


class _CrontabTrigger(CronTrigger):
    """A ``CronTrigger`` that fires a fixed wall-clock time once when the clock falls back.

    When DST ends, 02:00-02:59 happens twice; APScheduler would fire ``30 2 * * *`` at both.
    Like Vixie cron (crontab(5)), a job at a fixed hour runs once (at the first occurrence) while a
    job with a wildcard hour follows real time and runs in both hours.
    """

    def __init__(self, *, fixed_hour: bool, **fields: Any) -> None:
        super().__init__(**fields)
        self.fixed_hour = fixed_hour

    def get_next_fire_time(self, previous_fire_time: datetime | None, now: datetime) -> datetime | None:
        """Like ``CronTrigger``'s, skipping the second pass of a repeated wall time (fixed hours)."""
        while True:
            nxt = super().get_next_fire_time(previous_fire_time, now)
            if nxt is None or not self.fixed_hour or not _repeated_wall_time(nxt.astimezone(self.timezone)):
                return nxt
            # Step past it in UTC: wall-clock arithmetic on the local time would drop its fold.
            previous_fire_time = nxt.astimezone(UTC)
            now = previous_fire_time + timedelta(microseconds=1)


def _repeated_wall_time(moment: datetime) -> bool:
    """Whether ``moment``'s local wall time already happened earlier (second pass of a fall-back)."""
    return moment.fold == 1 and moment.replace(fold=0).utcoffset() != moment.utcoffset()


def build_trigger(schedule: Schedule, zone_name: str, *, anchor: float) -> BaseTrigger:
    """The APScheduler trigger for ``schedule`` read in ``zone_name``.

    Args:
        anchor: epoch seconds interval schedules count from (the job's creation time), so every
            instance computes the same fire times.

    Raises:
        ScheduleError: unknown zone, invalid field values, too short or too long an interval, a
            time a ``datetime`` cannot hold.
    """
    try:
        return _build_trigger(schedule, zone_name, anchor=anchor)
    except (ValueError, OverflowError) as exc:  # APScheduler's and datetime's own checks
        raise ScheduleError(f"bad schedule {schedule.describe()!r}: {exc}") from None


def _build_trigger(schedule: Schedule, zone_name: str, *, anchor: float) -> BaseTrigger:
    tz = zone(zone_name)
    if schedule.kind == "interval":
        seconds = int(schedule.expr)
        if seconds < MIN_INTERVAL_S:
            raise ScheduleError(f"interval too short: {seconds} s (the minimum is {MIN_INTERVAL_S} s)")
        if seconds > MAX_INTERVAL_S:
            raise ScheduleError(f"interval too long: {seconds} s (the maximum is {MAX_INTERVAL_S // 86400} days; "
                                "use a cron expression or 'at YYYY-MM-DD HH:MM')")
        return IntervalTrigger(seconds=seconds, start_date=datetime.fromtimestamp(anchor, tz), timezone=tz)
    if schedule.kind == "once":
        return DateTrigger(run_date=datetime.fromisoformat(schedule.expr).replace(tzinfo=tz), timezone=tz)
    if schedule.kind != "cron":
        raise ScheduleError(f"unknown schedule kind {schedule.kind!r}")
    minute, hour, day, month, dow = schedule.expr.split(" ")
    days = crontab_days(dow)
    common = {"minute": minute, "hour": hour, "month": month, "timezone": tz, "fixed_hour": not hour.startswith("*")}
    try:
        if day.startswith("*") or dow.startswith("*"):
            return _CrontabTrigger(day=day, day_of_week=days, **common)  # type: ignore[arg-type]
        return OrTrigger([  # crontab(5): restricted day of month OR restricted day of week
            _CrontabTrigger(day=day, **common),  # type: ignore[arg-type]
            _CrontabTrigger(day_of_week=days, **common),  # type: ignore[arg-type]
        ])
    except ValueError as exc:
        raise ScheduleError(f"bad cron expression {schedule.expr!r}: {_name_field(str(exc))}") from None


def _name_field(message: str) -> str:
    return message.replace('for field "day"', 'for field "day of month"').replace(
        'for field "day_of_week"', 'for field "day of week"')


def next_fire(trigger: BaseTrigger, after: datetime) -> datetime | None:
    """The first fire strictly after ``after`` (aware), in UTC; ``None`` when it never fires again."""
    after = after.astimezone(UTC)
    nxt = trigger.get_next_fire_time(after, after + timedelta(microseconds=1))
    return nxt.astimezone(UTC) if nxt is not None else None


def first_fire(trigger: BaseTrigger, now: datetime) -> datetime | None:
    """The first fire at or after ``now`` (aware), in UTC; ``None`` when it never fires (also when
    the fire lies outside what a ``datetime`` holds, such as year 1 seen from a zone ahead of UTC)."""
    try:
        nxt = trigger.get_next_fire_time(None, now.astimezone(UTC))
        if nxt is None or nxt < now:  # a DateTrigger answers its run date even when it is past
            return None
        return nxt.astimezone(UTC)
    except OverflowError:
        return None


@dataclass(frozen=True, slots=True)
class JobTiming:
    """What the scheduler needs of a stored job: id, schedule, zone, anchor and bookkeeping."""

    id: str
    schedule: Schedule
    timezone: str
    anchor: float
    """Epoch seconds (the job's creation time)."""
    version: float
    """Changes when the definition changes (the job's ``updated_at``)."""
    next_fire_at: float | None = None
    """Stored next fire (epoch s): when it is past but within the grace, the fire runs late once."""


def fire_push(job_id: str) -> None:
    """The callable every APScheduler job names (``gateway.scheduler.triggers:fire_push``, args: the job
    id). It is never called: ``_DueExecutor`` hands the due fire with its scheduled time to the
    gateway instead (APScheduler 3 does not pass the scheduled time to job functions)."""
    raise RuntimeError(f"push job {job_id} must run through the scheduler's executor")


OnDue = Callable[[str, datetime], None]
"""Called on the event loop with a job id and the fire's scheduled time (aware, UTC)."""


class _DueExecutor(BaseExecutor):
    """Hands each due fire to ``on_due`` after the misfire check (APScheduler's documented
    extension point for executors: ``_do_submit_job``)."""

    def __init__(self, on_due: OnDue, clock: Callable[[], datetime], grace_s: float) -> None:
        super().__init__()
        self._on_due = on_due
        self._clock = clock
        self._grace_s = grace_s

    def _do_submit_job(self, job: Any, run_times: list[datetime]) -> None:
        now = self._clock()
        grace_s = float("inf") if job.misfire_grace_time is None else self._grace_s  # None: one-shot
        for run_time in run_times:  # one with coalescing: the latest due time
            late = (now - run_time).total_seconds()
            if late > grace_s:
                log.warning("job %s: fire due at %s missed by %.0f s (grace %g s); skipped", job.id,
                            run_time.astimezone(UTC).isoformat(), late, self._grace_s)
                continue
            try:
                self._on_due(job.id, run_time.astimezone(UTC))
            except Exception:
                log.exception("job %s: could not hand over the fire due at %s", job.id, run_time)
        # Our callback only starts the work: release APScheduler's instance count once
        # submit_job has counted this one (it counts after _do_submit_job returns).
        asyncio.get_running_loop().call_soon(self._run_job_success, job.id, [])


class Scheduler:
    """APScheduler's ``AsyncIOScheduler`` on the main loop, with one job per stored job.

    Args:
        on_due: receives ``(job_id, scheduled_at)`` for each fire to run (see ``OnDue``).
        misfire_grace_s: how late a fire may still run (seconds).
        clock: the executor's "now" (tests); APScheduler's own wake-ups use the real clock.
    """

    def __init__(self, on_due: OnDue, *, misfire_grace_s: float,
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self.misfire_grace_s = misfire_grace_s
        self._clock = clock
        self._grace_aps = max(1, round(misfire_grace_s))  # APScheduler wants a positive int
        self._aps = AsyncIOScheduler(timezone=UTC, executors={"default": _DueExecutor(on_due, clock, misfire_grace_s)},
                                     job_defaults={"coalesce": True, "misfire_grace_time": self._grace_aps,
                                                   "max_instances": 1000})
        self._versions: dict[str, float] = {}
        self._triggers: dict[str, BaseTrigger] = {}

    @property
    def running(self) -> bool:
        """Whether APScheduler is started."""
        return bool(self._aps.running)

    def start(self) -> None:
        """Starts on the running event loop."""
        self._aps.start()

    def stop(self) -> None:
        """Stops firing (idempotent); fires already handed over are not affected."""
        if self._aps.running:
            self._aps.shutdown(wait=False)

    def sync(self, jobs: Iterable[JobTiming]) -> tuple[int, int]:
        """Makes the scheduled set equal to ``jobs``: adds new ones, replaces changed ones,
        removes the rest. Returns ``(added_or_replaced, removed)``. A job whose schedule no longer
        parses is logged and left out."""
        wanted = {job.id: job for job in jobs}
        removed = 0
        for job_id in list(self._versions):
            if job_id not in wanted:
                self.remove(job_id)
                removed += 1
        changed = 0
        for job in wanted.values():
            if self._versions.get(job.id) != job.version:
                changed += int(self.add(job))
        return changed, removed

    def add(self, job: JobTiming) -> bool:
        """Schedules (or reschedules) one job; ``False`` if its schedule cannot be built or never fires."""
        try:
            trigger = build_trigger(job.schedule, job.timezone, anchor=job.anchor)
        except ScheduleError as exc:
            log.error("job %s not scheduled: %s", job.id, exc)
            self.remove(job.id)
            self._versions[job.id] = job.version  # said once per definition, not at every reload
            return False
        now = self._clock()
        next_run = first_fire(trigger, now)
        once = job.schedule.kind == "once"
        if job.next_fire_at is not None:
            stored = datetime.fromtimestamp(job.next_fire_at, UTC)
            if stored < now and (once or (now - stored).total_seconds() <= self.misfire_grace_s):
                next_run = stored  # due while no instance ran: fire it now, late, once
        self._versions[job.id] = job.version
        self._triggers[job.id] = trigger
        if next_run is None:
            self._remove_aps(job.id)
            return False
        self._aps.add_job("gateway.scheduler.triggers:fire_push", trigger=trigger, args=[job.id], id=job.id,
                          name=f"push {job.id}", replace_existing=True, next_run_time=next_run,
                          misfire_grace_time=None if once else self._grace_aps, coalesce=True)
        return True

    def remove(self, job_id: str) -> None:
        """Unschedules ``job_id`` (no-op when it is not scheduled)."""
        self._versions.pop(job_id, None)
        self._triggers.pop(job_id, None)
        self._remove_aps(job_id)

    def _remove_aps(self, job_id: str) -> None:
        if self._aps.get_job(job_id) is not None:
            self._aps.remove_job(job_id)

    def scheduled(self) -> list[str]:
        """Ids of the jobs APScheduler will fire (sorted)."""
        return sorted(job.id for job in self._aps.get_jobs())

    def next_run(self, job_id: str) -> datetime | None:
        """When APScheduler fires ``job_id`` next (UTC), ``None`` if it is not scheduled here."""
        job = self._aps.get_job(job_id)
        return job.next_run_time.astimezone(UTC) if job is not None and job.next_run_time else None

    def next_after(self, job_id: str, when: datetime) -> datetime | None:
        """The fire after ``when`` of a loaded job (UTC), ``None`` when unknown or finished."""
        trigger = self._triggers.get(job_id)
        return next_fire(trigger, when) if trigger is not None else None
