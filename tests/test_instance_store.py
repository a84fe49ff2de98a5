"""Instance ids on SQLite and PostgreSQL: taking an id over frees every lease and claim it holds
at once; a holder that lost its id can neither renew nor release anything; a graceful release
frees everything and deletes the row. Plus the pieces that tell a crashed predecessor from a
live twin (default id, pid checks) and a twin refused inside one process."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from sqlalchemy import text

from gateway.app.gateway import Gateway
from gateway.ops.instance import InstanceInUse, ProcessInfo, _start_ticks, default_instance_id, instance_id_for
from gateway.ops.instance_store import InstanceRecord, InstanceStore
from gateway.scheduler.store import JobStore
from gateway.store.db import create_db_engine
from gateway.store.sql import Store
from tests.conftest import gateway_config, start_gateway
from tests.test_job_store import new_job
from tests.test_store import message, reply_row


@pytest.fixture
def stores(db_url):
    engine = create_db_engine(db_url)
    yield InstanceStore(engine), Store(engine), JobStore(engine)
    engine.dispose()


def record(boot: str, instance_id: str = "gw-1", pid: int = 4242, heartbeat_at: float | None = None) -> InstanceRecord:
    now = time.time() if heartbeat_at is None else heartbeat_at
    return InstanceRecord(instance_id, boot, "host-a", pid, "host-a|boot|pid:[1]", "123", now, now)


def hold_everything(store: Store, jobs: JobStore, owner: str) -> int:
    """Leases a lane, claims a reply (left ``sending``, as at a crash mid-send) and a report run."""
    assert store.claim_lane("k", owner, 600)
    assert store.claim_lane("telegram:poller", owner, 600)
    store.insert_inbound(message("5:1"), "k")
    [pending] = store.next_pending("k")
    store.finish_turn([pending.inbox_id], "done", [reply_row("r1")])
    [item] = store.claim_outbox(owner, 10, claim_s=600)
    assert store.mark_sending(item.id, owner, [], claim_s=600)
    job, _ = jobs.create_job(new_job())
    assert jobs.claim_run(job.id, 1_796_000_400.0, "schedule", owner, 600) is not None
    return item.id


def test_taking_over_a_dead_holders_id_frees_its_leases_and_claims_at_once(stores):
    instances, store, jobs = stores
    assert instances.take(record("boot-old"), None) is not None
    hold_everything(store, jobs, "gw-1")
    assert store.claim_lane("k", "gw-2", 60) is False  # held for another 10 minutes
    assert instances.take(record("boot-new"), None) is None  # the row exists: judged as "no holder" wrongly
    released = instances.take(record("boot-new"), "boot-old")
    assert (released.lanes, released.replies, released.runs) == (2, 1, 1)
    assert instances.get("gw-1").boot == "boot-new"
    # Everything is free now, for any instance: nothing waits out a lease.
    assert store.keys_waiting(time.time()) == [] and store.claim_lane("k", "gw-2", 60)
    [again] = store.claim_outbox("gw-2", 10, claim_s=60)
    assert again.unconfirmed  # the part in flight at the crash is never sent twice
    [run] = jobs.take_over_expired("gw-2", 60)
    assert run.attempts == 2
    assert instances.take(record("boot-third"), "boot-old") is None  # judged a holder that is no longer there


def test_a_holder_that_lost_its_id_renews_and_releases_nothing(stores):
    instances, store, jobs = stores
    instances.take(record("boot-old"), None)
    assert instances.beat("gw-1", "boot-old")
    instances.take(record("boot-new"), "boot-old")
    hold_everything(store, jobs, "gw-1")  # now the new holder's
    assert instances.beat("gw-1", "boot-old") is False
    assert instances.release("gw-1", "boot-old") is None
    assert store.claim_lane("k", "gw-2", 60) is False and store.claim_outbox("gw-2", 10, claim_s=60) == []
    assert instances.get("gw-1").boot == "boot-new" and instances.beat("gw-1", "boot-new")


def test_a_graceful_release_frees_everything_and_deletes_the_row(stores):
    instances, store, jobs = stores
    instances.take(record("boot-1"), None)
    instances.take(record("boot-x", instance_id="gw-2"), None)
    hold_everything(store, jobs, "gw-1")
    released = instances.release("gw-1", "boot-1")
    assert (released.lanes, released.replies, released.runs) == (2, 1, 1)
    assert [r.id for r in instances.records()] == ["gw-2"]
    assert store.claim_lane("k", "gw-2", 60) and store.claim_lane("telegram:poller", "gw-2", 60)
    assert len(store.claim_outbox("gw-2", 10, claim_s=60)) == 1


def test_taking_over_from_a_crashed_holder_counts_a_crash_on_the_turns_it_ran(stores):
    """The head of each lane the dead holder leased (the turn it was running) gets ``crashes`` + 1,
    seen by the batch the resumed turn reads; rows behind it, lanes of others and a graceful
    release count nothing."""
    instances, store, _ = stores
    instances.take(record("boot-1"), None)
    for key, owner, ids in (("a", "gw-1", ("a:1", "a:2")), ("b", "gw-1", ("b:1",)), ("c", "gw-2", ("c:1",))):
        assert store.claim_lane(key, owner, 600)
        for message_id in ids:
            store.insert_inbound(message(message_id, chat=key), key)
    released = instances.take(record("boot-2"), "boot-1")
    assert released.crashed == 2 and "2 turn(s) it was running" in str(released)
    assert [p.crashes for p in store.pending_batch("a", 5)] == [1, 0]
    assert [p.crashes for p in store.pending_batch("b", 5)] == [1]
    assert [p.crashes for p in store.pending_batch("c", 5)] == [0]  # another instance's turn
    assert store.claim_lane("a", "gw-1", 600)
    instances.take(record("boot-3"), "boot-2")  # died again while running lane a's turn
    assert [p.crashes for p in store.pending_batch("a", 5)] == [2, 0]
    assert [p.crashes for p in store.pending_batch("b", 5)] == [1]  # not leased at that crash
    assert store.claim_lane("b", "gw-1", 600)
    assert instances.release("gw-1", "boot-3").crashed == 0  # a graceful stop is no crash
    assert [p.crashes for p in store.pending_batch("b", 5)] == [1]
    # With max_turn_crashes 3, a head with 2 crashes waits for its last try: a crash counts for it
    # only while it makes that try (marked), not while it waits behind another's.
    instances.take(record("boot-4"), None)
    assert store.claim_lane("a", "gw-1", 600) and store.claim_lane("b", "gw-1", 600)
    instances.take(record("boot-5"), "boot-4")
    assert [p.crashes for p in store.pending_batch("a", 5)] == [2, 0]  # now at its last try
    assert [p.crashes for p in store.pending_batch("b", 5)] == [2]
    [head_a, _] = store.pending_batch("a", 5)
    store.mark_last_try([head_a.inbox_id])
    assert store.claim_lane("a", "gw-1", 600) and store.claim_lane("b", "gw-1", 600)
    assert instances.take(record("boot-6"), "boot-5").crashed == 1
    assert [p.crashes for p in store.pending_batch("a", 5)] == [3, 0]  # died in its last try: given up
    assert [p.crashes for p in store.pending_batch("b", 5)] == [2]  # only waited for its turn


def test_rows_silent_for_a_week_are_forgotten_when_an_id_is_taken(stores):
    instances, _, _ = stores
    instances.take(record("old", instance_id="gone", heartbeat_at=time.time() - 8 * 86400), None)
    instances.take(record("b1"), None)
    assert [r.id for r in instances.records()] == ["gw-1"]


def test_the_default_id_is_stable_per_host_and_database_and_never_holds_the_password(tmp_path, monkeypatch):
    pg = "postgresql+psycopg://gateway:{}@db.internal:5432/gateway"
    assert default_instance_id(pg.format("secret-1")) == default_instance_id(pg.format("rotated-2"))
    assert "secret" not in default_instance_id(pg.format("secret-1"))
    assert default_instance_id(pg.format("x")) != default_instance_id(pg.format("x").replace("/gateway", "/other"))
    monkeypatch.chdir(tmp_path)
    assert default_instance_id("sqlite:///./data/gateway.db") == default_instance_id(
        f"sqlite:///{tmp_path / 'data' / 'gateway.db'}")
    assert len(default_instance_id(pg.format("x"))) <= 128
    assert instance_id_for("gw-1", pg, "chat") == f"gw-1+chat.{os.getpid()}"
    assert instance_id_for(None, pg) == default_instance_id(pg)


def test_pid_checks_tell_a_crashed_predecessor_from_a_live_one():
    me = ProcessInfo.current()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        holder = _with(record("b", pid=child.pid), pid_scope=me.scope, pid_start=_start_ticks(child.pid))
        assert me.alive(holder) is True
        assert me.alive(_with(holder, pid_start="1")) is False  # the pid now belongs to another program
        assert me.alive(_with(holder, pid_scope="other-host|x|y")) is None  # cannot be checked from here
    finally:
        child.kill()
        child.wait()
    assert me.alive(holder) is False  # gone
    assert me.alive(_with(holder, pid=os.getpid(), boot="no-gateway-here")) is False  # a predecessor with our pid


def _with(rec: InstanceRecord, **changes: object) -> InstanceRecord:
    fields = {name: getattr(rec, name) for name in InstanceRecord.__slots__}
    return InstanceRecord(**{**fields, **changes})


async def test_a_second_gateway_with_the_same_id_in_one_process_is_refused(tmp_path, fake_openai, running):
    config = gateway_config(tmp_path, fake_openai)
    first = await start_gateway(config, running)
    twin = Gateway(config, [])
    with pytest.raises(InstanceInUse, match=rf"instance id '{first.instance_id}' is in use by pid {os.getpid()}"):
        await twin.start()
    await twin.stop()  # releases nothing: it never held the id
    assert first.instance.running and first.instance.store.get(first.instance_id).boot == first.instance.boot
    other = await start_gateway(config.model_copy(update={"instance_id": "gw-other"}), running)
    assert {r.id for r in other.instance.store.records()} == {first.instance_id, "gw-other"}


def _marks(store: Store) -> dict[str, bool]:
    """``last_try`` of every inbox row, by session key (one row a lane here)."""
    with store.engine.connect() as conn:
        rows = conn.execute(text("SELECT session_key, last_try FROM inbox ORDER BY id")).all()
    return {row.session_key: bool(row.last_try) for row in rows}


def test_last_try_marks_are_cleared_by_their_own_holder_only(stores):
    """A graceful stop clears the marks on the lanes it held (a mark left behind would count the
    next crash for a turn that only waited); a take-over clears its dead holder's marks and keeps
    the mark of a last try another instance is running (else that try's crash goes uncounted).
    Both found by a review; both failed on the code before."""
    instances, store, _ = stores
    instances.take(record("boot-1"), None)
    instances.take(record("boot-x", instance_id="gw-2"), None)
    for key, owner in (("a", "gw-1"), ("b", "gw-2")):
        assert store.claim_lane(key, owner, 600)
        store.insert_inbound(message(f"{key}:1", chat=key), key)
        store.mark_last_try([p.inbox_id for p in store.pending_batch(key, 5)])
    assert _marks(store) == {"a": True, "b": True}
    instances.release("gw-1", "boot-1")
    assert _marks(store) == {"a": False, "b": True}
    instances.take(record("boot-2"), None)
    assert store.claim_lane("a", "gw-1", 600)
    store.mark_last_try([p.inbox_id for p in store.pending_batch("a", 5)])
    instances.take(record("boot-3"), "boot-2")  # gw-1 died running a's last try; gw-2 runs b's
    assert _marks(store) == {"a": False, "b": True}
    assert [p.crashes for p in store.pending_batch("a", 5)] == [1]
    store.mark_last_try([p.inbox_id for p in store.pending_batch("b", 5)], marked=False)
    assert _marks(store) == {"a": False, "b": False}
