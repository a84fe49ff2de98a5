"""The APScheduler wrapper on a real event loop: misfires within the grace run once (late),
coalesced after a long pause, skipped beyond the grace; a fire due while no instance ran is
caught up after a restart; definitions are added, replaced and removed by ``sync``."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest

from gateway.scheduler.triggers import JobTiming, Schedule, Scheduler

HOUR = Schedule("interval", "3600")


class Recorder:
    def __init__(self) -> None:
        self.fires: list[tuple[str, datetime]] = []

    def __call__(self, job_id: str, scheduled_at: datetime) -> None:
        self.fires.append((job_id, scheduled_at))


def hourly_due_at(job_id: str, due: float, **extra) -> JobTiming:
    """An hourly job whose next fire is at ``due`` (epoch s)."""
    return JobTiming(job_id, HOUR, "Europe/Warsaw", anchor=due - 3600, version=1.0, **extra)


@pytest.fixture
async def make_scheduler():
    made: list[Scheduler] = []

    def make(grace: float = 300.0) -> tuple[Scheduler, Recorder]:
        recorder = Recorder()
        scheduler = Scheduler(recorder, misfire_grace_s=grace)
        made.append(scheduler)
        return scheduler, recorder

    yield make
    for scheduler in made:
        scheduler.stop()
    await asyncio.sleep(0)


async def test_fire_missed_by_two_seconds_runs_once_late(make_scheduler):
    scheduler, recorder = make_scheduler()
    due = time.time() + 0.1
    scheduler.sync([hourly_due_at("j1", due)])
    scheduler.start()
    time.sleep(2.1)  # the loop is busy past 09:00:00 until 09:00:02
    await asyncio.sleep(0.2)
    assert recorder.fires == [("j1", datetime.fromtimestamp(due, UTC))]
    assert abs(scheduler.next_run("j1").timestamp() - (due + 3600)) < 1e-3


async def test_fire_missed_beyond_the_grace_is_skipped(make_scheduler):
    scheduler, recorder = make_scheduler(grace=0.3)
    scheduler.sync([hourly_due_at("j2", time.time() + 0.1)])
    scheduler.start()
    time.sleep(0.7)
    await asyncio.sleep(0.2)
    assert recorder.fires == []
    assert scheduler.next_run("j2") is not None  # the next one is still scheduled


async def test_hourly_job_after_a_three_hour_pause_runs_once(make_scheduler):
    scheduler, recorder = make_scheduler()
    now = time.time()
    latest_due = now - 30
    scheduler.sync([hourly_due_at("j3", latest_due + 3600)])
    # The loop stalled for three hours: APScheduler still holds the fire due 3 h 30 s ago.
    scheduler._aps.modify_job("j3", next_run_time=datetime.fromtimestamp(latest_due - 3 * 3600, UTC))
    scheduler.start()
    await asyncio.sleep(0.3)
    assert recorder.fires == [("j3", datetime.fromtimestamp(latest_due, UTC))]  # coalesced to the latest


async def test_restart_within_the_grace_catches_up_the_missed_fire_once(make_scheduler):
    scheduler, recorder = make_scheduler()
    missed = time.time() - 10
    stale = time.time() - 3600  # beyond the grace: not run late
    scheduler.sync([hourly_due_at("late", missed + 3600, next_fire_at=missed),
                    hourly_due_at("stale", stale + 7200, next_fire_at=stale)])
    scheduler.start()
    await asyncio.sleep(0.3)
    assert recorder.fires == [("late", datetime.fromtimestamp(missed, UTC))]
    assert scheduler.next_run("stale").timestamp() == pytest.approx(stale + 7200, abs=1e-3)


async def test_a_one_shot_missed_while_down_runs_late_once_however_late(make_scheduler):
    """Its only fire: skipping it past the grace lost the report silently, and /jobs kept showing a
    'next' time in the past (found by a review). A recurring job's stale fire is still skipped."""
    scheduler, recorder = make_scheduler()
    missed = time.time() - 3 * 3600
    when = datetime.fromtimestamp(missed, ZoneInfo("Asia/Shanghai")).replace(second=0, microsecond=0)
    once = JobTiming("once", Schedule("once", when.replace(tzinfo=None).isoformat(timespec="minutes")),
                     "Asia/Shanghai", anchor=missed - 86400, version=1.0, next_fire_at=when.timestamp())
    stale = time.time() - 3600
    scheduler.sync([once, hourly_due_at("stale", stale + 7200, next_fire_at=stale)])
    scheduler.start()
    await asyncio.sleep(0.3)
    assert recorder.fires == [("once", when.astimezone(UTC))]
    assert scheduler.next_run("once") is None


async def test_sync_adds_replaces_and_removes(make_scheduler):
    scheduler, _ = make_scheduler()
    scheduler.start()
    cron = Schedule("cron", "0 9 * * 1")
    a = JobTiming("a", cron, "Asia/Shanghai", anchor=0, version=1.0)
    b = JobTiming("b", cron, "UTC", anchor=0, version=1.0)
    assert scheduler.sync([a, b]) == (2, 0)
    assert scheduler.sync([a, b]) == (0, 0)  # unchanged definitions are left alone
    shanghai = ZoneInfo("Asia/Shanghai")
    monday_shanghai = scheduler.next_run("a").astimezone(shanghai)
    assert (monday_shanghai.strftime("%a"), monday_shanghai.hour) == ("Mon", 9)
    changed = JobTiming("a", Schedule("cron", "0 9 * * 2"), "Asia/Shanghai", anchor=0, version=2.0)
    assert scheduler.sync([changed]) == (1, 1)
    assert scheduler.scheduled() == ["a"]
    assert scheduler.next_run("a").astimezone(shanghai).strftime("%a") == "Tue"
    broken = JobTiming("c", Schedule("cron", "0 9 * * 9"), "UTC", anchor=0, version=1.0)
    assert scheduler.sync([changed, broken]) == (0, 0)  # logged and left out, the rest keeps running
    assert scheduler.scheduled() == ["a"]
    tuesday_9_shanghai = datetime(2026, 12, 1, 1, 0, tzinfo=UTC)
    assert scheduler.next_after("a", tuesday_9_shanghai) == datetime(2026, 12, 8, 1, 0, tzinfo=UTC)
