"""JobStore contract on SQLite and PostgreSQL: a fire is claimed once, a dead owner's claim is
taken over and fenced, the answer reaches the outbox with the run linked, the run settles with
its outbox row, failures are told once, and the permission look-ups read who has written from which chat."""

from __future__ import annotations

import threading
import time

import pytest

from gateway.core.types import ChatAddress, InboundMessage, OutboundMessage, Sender
from gateway.scheduler.store import MAX_ATTEMPTS, JobStore, NewJob
from gateway.store.db import create_db_engine
from gateway.store.sql import Store

TG_DM = ChatAddress("telegram", "7000000001", "5550001")
SLACK_CHANNEL = ChatAddress("slack", "T0FAKE0001", "C0GENERAL1")


@pytest.fixture
def stores(db_url):
    engine = create_db_engine(db_url)
    yield JobStore(engine), Store(engine)
    engine.dispose()


def new_job(source: str | None = None, target: ChatAddress = SLACK_CHANNEL) -> NewJob:
    return NewJob(owner="telegram:7000000001:5550001", owner_name="Alice", owner_dm=TG_DM, target=target,
                  schedule_kind="cron", schedule="0 9 * * 1-5", timezone="Asia/Shanghai",
                  prompt="Summarise yesterday's sales", source=source)


def test_jobs_are_created_once_per_source_and_listed_by_owner(stores):
    jobs, _ = stores
    job, created = jobs.create_job(new_job("telegram:7000000001:5550001:42"))
    again, created_again = jobs.create_job(new_job("telegram:7000000001:5550001:42"))
    assert created and not created_again and again.id == job.id
    other, _ = jobs.create_job(new_job())
    assert len(job.id) == 6 and other.id != job.id
    assert [j.id for j in jobs.list_jobs("telegram:7000000001:5550001")] == [job.id, other.id]
    assert jobs.list_jobs("slack:T1:U1") == []
    assert job.target == SLACK_CHANNEL and job.owner_dm == TG_DM and job.enabled
    assert jobs.delete_job(job.id) and not jobs.delete_job(job.id)
    assert jobs.get_job(job.id) is None


def test_a_fire_is_claimed_once(stores):
    jobs, _ = stores
    job, _ = jobs.create_job(new_job())
    t = 1_796_000_400.0
    first = jobs.claim_run(job.id, t, "schedule", "a", 60, next_fire_at=t + 86400)
    assert first is not None and first.attempts == 1
    assert jobs.claim_run(job.id, t, "schedule", "b", 60) is None
    assert jobs.claim_run(job.id, t + 86400, "schedule", "b", 60) is not None
    stored = jobs.get_job(job.id)
    assert stored.last_fire_at == t + 86400 and stored.updated_at == job.updated_at


def test_concurrent_claims_of_the_same_fires_have_one_winner_each(db_url):
    engines = [create_db_engine(db_url) for _ in range(2)]
    job, _ = JobStore(engines[0]).create_job(new_job())
    won: dict[str, list[float]] = {"a": [], "b": []}
    start = threading.Barrier(2)

    def claim_all(owner: str, store: JobStore) -> None:
        start.wait()
        for i in range(50):
            t = 1_796_000_000.0 + 60 * i
            if store.claim_run(job.id, t, "schedule", owner, 60) is not None:
                won[owner].append(t)

    threads = [threading.Thread(target=claim_all, args=(o, JobStore(e))) for o, e in zip("ab", engines, strict=True)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for engine in engines:
        engine.dispose()
    assert len(won["a"]) + len(won["b"]) == 50
    assert set(won["a"]).isdisjoint(won["b"])


def test_a_dead_owners_claim_is_taken_over_and_the_dead_owner_is_fenced(stores):
    jobs, store = stores
    job, _ = jobs.create_job(new_job())
    alive = jobs.claim_run(job.id, 1_796_086_800.0, "schedule", "alive", 60)
    dead = jobs.claim_run(job.id, 1_796_000_400.0, "schedule", "dead", 0.05)
    session = jobs.run_session(dead, "system")
    time.sleep(0.1)
    [taken] = jobs.take_over_expired("b", 60)  # the live claim is left alone
    assert (taken.run_id, taken.owner, taken.attempts) == (dead.run_id, "b", 2)
    assert jobs.take_over_expired("c", 60) == []
    assert jobs.renew_run(alive, 60)
    assert jobs.run_session(taken, "system") == session  # the transcript is resumed, not restarted
    assert not jobs.renew_run(dead, 60)
    late = OutboundMessage(SLACK_CHANNEL, "late answer", idempotency_key=f"push:{dead.run_id}")
    assert not jobs.finish_run(dead, reply=late)  # fenced: nothing queued
    assert store.outbox_rows() == []
    answer = OutboundMessage(SLACK_CHANNEL, "the report", idempotency_key=f"push:{taken.run_id}")
    assert jobs.finish_run(taken, reply=answer)
    [row] = store.outbox_rows()
    run = jobs.get_run(taken.run_id)
    assert (run.status, run.outbox_id, run.claimed_by) == ("delivering", row["id"], "b")
    assert row["session_key"] == f"job:{job.id}" and row["text"] == "the report"


def test_a_run_that_keeps_killing_its_instance_is_failed_after_max_attempts(stores):
    jobs, _ = stores
    job, _ = jobs.create_job(new_job())
    jobs.claim_run(job.id, 1_796_000_400.0, "schedule", "x0", 0.01)
    for attempt in range(2, MAX_ATTEMPTS + 1):
        time.sleep(0.03)
        [claim] = jobs.take_over_expired(f"x{attempt}", 0.01)
        assert claim.attempts == attempt
    time.sleep(0.03)
    assert jobs.take_over_expired("last", 60) == []
    [run] = jobs.runs(job.id)
    assert run.status == "failed" and "gave up" in run.error


def test_the_run_settles_with_its_outbox_row_and_failures_are_told_once(stores):
    jobs, store = stores
    job, _ = jobs.create_job(new_job())
    ok = jobs.claim_run(job.id, 1_796_000_400.0, "schedule", "a", 60)
    bad = jobs.claim_run(job.id, 1_796_086_800.0, "schedule", "a", 60)
    for claim in (ok, bad):
        jobs.finish_run(claim, reply=OutboundMessage(SLACK_CHANNEL, "r", idempotency_key=f"push:{claim.run_id}"))
    items = {item.message.idempotency_key: item for item in store.claim_outbox("d", 10, 30)}
    assert len(items) == 1  # one row per chat at a time: order within the chat
    first = items[f"push:{ok.run_id}"]
    assert jobs.get_run(ok.run_id).platform_message_ids is None  # nothing recorded before the platform answers
    store.mark_sent(first.id, "d", ["1735689600.000100"])
    run = jobs.get_run(ok.run_id)
    assert (run.status, run.platform_message_ids) == ("sent", ["1735689600.000100"])
    [second] = store.claim_outbox("d", 10, 30)
    store.mark_failed(second.id, "d", "channel_not_found", [])
    run = jobs.get_run(bad.run_id)
    assert (run.status, run.error) == ("failed", "channel_not_found")

    def notice(job_, run_):
        return OutboundMessage(job_.owner_dm, f"run {run_.id} failed: {run_.error}",
                               idempotency_key=f"pushfail:{run_.id}")

    assert jobs.notify_failures(notice) == 1
    assert jobs.notify_failures(notice) == 0
    told = store.outbox_rows()[-1]
    assert told["address"]["chat_id"] == TG_DM.chat_id and "channel_not_found" in told["text"]


def test_only_the_claims_owner_settles_the_row_and_its_run_and_only_settling_marks_touch_the_run(stores):
    """The row's mark and its run's (one statement on PostgreSQL) are fenced by the claim: another
    instance's *sent* changes neither; *sending* leaves the run delivering."""
    jobs, store = stores
    job, _ = jobs.create_job(new_job())
    claim = jobs.claim_run(job.id, 1_796_000_400.0, "schedule", "a", 60)
    jobs.finish_run(claim, reply=OutboundMessage(SLACK_CHANNEL, "r", idempotency_key=f"push:{claim.run_id}"))
    [item] = store.claim_outbox("d", 10, 30)
    assert store.mark_sending(item.id, "d", [], 30)
    assert jobs.get_run(claim.run_id).status == "delivering"
    assert not store.mark_sent(item.id, "someone-else", ["1"])
    assert jobs.get_run(claim.run_id).status == "delivering"
    assert [r["status"] for r in store.outbox_rows()] == ["sending"]
    assert store.mark_sent(item.id, "d", ["2"])
    run = jobs.get_run(claim.run_id)
    assert (run.status, run.platform_message_ids, run.error) == ("sent", ["2"], None)
    assert run.finished_at is not None


def test_permission_lookups_read_who_has_written_from_which_chat(stores):
    """The scheduler's look-ups answer from the senders recorded when their messages' turns finish
    (or a command's row is stored handled), with the session keys the gateway really uses (a DM is
    ``dm:<user>``; the look-up used to search for ``platform:tenant:dm:<platform user>`` and never
    found a DM, so a report scheduled from a group never told its owner of a failure), and they
    still answer once the inbox rows are gone (deleted ``database.keep_settled_days`` after)."""
    from sqlalchemy import delete

    from gateway.store.models import InboxRow

    jobs, store = stores

    def answered(address: ChatAddress, user: str, message_id: str, key: str, chat_type: str = "group") -> None:
        message = InboundMessage(address, message_id, chat_type, Sender(user, "U"), "hi")
        assert store.insert_inbound(message, key)
        [pending] = store.next_pending(key)
        store.finish_turn([pending.inbox_id], "done", [OutboundMessage(address, "ok", f"r:{message_id}")],
                          session_id=store.new_session(key, "prompt", None), session_key=key)

    answered(SLACK_CHANNEL, "U0ALICE001", "C0GENERAL1:1.1", "slack:T0FAKE0001:chat:C0GENERAL1")
    answered(ChatAddress("slack", "T0FAKE0001", "C0GENERAL1", "1.1"), "U0BOB00001", "C0GENERAL1:1.2",
             "slack:T0FAKE0001:chat:C0GENERAL1:thread:1.1")
    answered(ChatAddress("slack", "T0FAKE0001", "D0ALICE001"), "U0ALICE001", "D0ALICE001:1.3", "dm:u-alice", "dm")
    command = InboundMessage(ChatAddress("slack", "T0FAKE0001", "C0RANDOM01"), "C0RANDOM01:1.4", "group",
                             Sender("U0CAROL001", "Carol"), "/status")
    assert store.insert_inbound(command, "slack:T0FAKE0001:chat:C0RANDOM01",
                                control_reply=OutboundMessage(command.address, "status", "c:1.4"))
    with store.engine.begin() as conn:
        conn.execute(delete(InboxRow))
    assert jobs.has_written_from("slack", "T0FAKE0001", "U0ALICE001", "C0GENERAL1")
    assert jobs.has_written_from("slack", "T0FAKE0001", "U0BOB00001", "C0GENERAL1")  # from a thread of it
    assert jobs.has_written_from("slack", "T0FAKE0001", "U0CAROL001", "C0RANDOM01")  # a command counts
    assert not jobs.has_written_from("slack", "T0FAKE0001", "U0CAROL001", "C0GENERAL1")
    assert not jobs.has_written_from("slack", "T0OTHER001", "U0ALICE001", "C0GENERAL1")
    assert jobs.chat_seen("slack", "T0FAKE0001", "C0GENERAL1") and not jobs.chat_seen("slack", "T0FAKE0001", "C9")
    assert jobs.tenants_of_chat("slack", "C0GENERAL1") == ["T0FAKE0001"]
    assert jobs.dm_address("slack", "T0FAKE0001", "U0ALICE001") == ChatAddress("slack", "T0FAKE0001", "D0ALICE001")
    assert jobs.dm_address("slack", "T0FAKE0001", "U0BOB00001") is None


def test_migrations_match_the_models(db_url):
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from gateway.store.models import Base, include_object

    engine = create_db_engine(db_url)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn, opts={"include_object": include_object}),
                                Base.metadata)
    engine.dispose()
    assert diff == []


def test_migration_0810_fills_chat_members_from_the_inbox(db_url):
    """A database from before 0810: who wrote from which chat is read out of the inbox's payloads
    (one row per sender and chat, the earliest time), so permissions granted by old messages hold."""
    import json

    from alembic import command
    from alembic.config import Config
    from sqlalchemy import text

    from gateway.store.db import MIGRATIONS_DIR, sa_connection, write_tx
    from gateway.store.models import Base

    engine = create_db_engine(db_url)
    Base.metadata.drop_all(engine)
    with engine.begin() as conn:
        conn.exec_driver_sql("DROP TABLE IF EXISTS session_addresses")
        conn.exec_driver_sql("DROP TABLE IF EXISTS alembic_version")
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))

    def migrate(step, target) -> None:
        with write_tx(engine) as conn:
            cfg.attributes["connection"] = sa_connection(conn)
            step(cfg, target)

    migrate(command.upgrade, "0808")
    rows = [("1", ChatAddress("slack", "T1", "D0ALICE"), "dm", "U0ALICE", 30.0),
            ("2", ChatAddress("slack", "T1", "C0GEN", "171.1"), "group", "U0ALICE", 20.0),
            ("3", ChatAddress("slack", "T1", "C0GEN"), "group", "U0ALICE", 10.0)]
    with engine.begin() as conn:
        for mid, address, chat_type, user, at in rows:
            payload = InboundMessage(address, mid, chat_type, Sender(user, "A"), "hi").to_dict()
            conn.execute(text("INSERT INTO inbox (platform, tenant, platform_message_id, session_key, payload, "
                              "status, received_at) VALUES ('slack', 'T1', :mid, 'k', :payload, 'done', :at)"),
                         {"mid": mid, "payload": json.dumps(payload), "at": at})
    migrate(command.upgrade, "heads")
    with engine.connect() as conn:
        members = conn.execute(text("SELECT chat_id, user_id, chat_type, first_seen_at FROM chat_members "
                                    "ORDER BY chat_id")).all()
    assert [tuple(m) for m in members] == [("C0GEN", "U0ALICE", "group", 10.0), ("D0ALICE", "U0ALICE", "dm", 30.0)]
    jobs = JobStore(engine)
    assert jobs.dm_address("slack", "T1", "U0ALICE") == ChatAddress("slack", "T1", "D0ALICE")
    migrate(command.downgrade, "0808")
    migrate(command.upgrade, "heads")
    engine.dispose()
