"""Scheduled reports with several instances on one PostgreSQL: every fire runs once and is
delivered once; a claim holder killed with SIGKILL mid-run is taken over after the claim timeout
and its report is still delivered exactly once."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gateway.core.types import ChatAddress
from gateway.scheduler.store import JobStore, NewJob
from gateway.store.db import create_db_engine, upgrade
from gateway.store.sql import Store
from tests.conftest import gateway_config, start_gateway
from tests.fakes import openai as oa
from tests.test_telegram_e2e import wait_until

pytestmark = pytest.mark.postgres
ROOT = Path(__file__).resolve().parents[1]
MONDAY_9_SHANGHAI = 2_051_226_000.0  # 2035-01-01 01:00Z


def fresh(db_url: str) -> JobStore:
    engine = create_db_engine(db_url)
    upgrade(engine)
    Store(engine).purge_all()
    return JobStore(engine)


def job_for(chat: int) -> NewJob:
    return NewJob(owner="cli", owner_name="operator", owner_dm=None,
                  target=ChatAddress("telegram", "7000000001", str(chat)), schedule_kind="cron",
                  schedule="0 9 29 2 *", timezone="Asia/Shanghai", prompt="Status report")
    # (fires on leap days only, so no real fire lands during the test)


def report(request) -> oa.Reply:
    user = next(m["content"] for m in reversed(request["messages"]) if m["role"] == "user")
    due = next(line for line in user.splitlines() if line.startswith("[Scheduled report"))
    return oa.text("status " + due.split("due ")[1].rstrip("]"))


def sent_texts(fake, chat: int) -> list[str]:
    return [c.params["text"] for c in fake.calls("sendMessage") if int(c.params["chat_id"]) == chat]


async def test_two_instances_run_and_deliver_each_of_50_fires_once(tmp_path, pg_database, fake_telegram, fake_openai,
                                                                   running):
    jobs = fresh(pg_database)
    chat = 5554001
    job, _ = jobs.create_job(job_for(chat))
    jobs.engine.dispose()
    fake_openai.reset()
    fake_openai.responder = report
    gateways = []
    for name in ("gw-a", "gw-b"):
        config = gateway_config(tmp_path / name, fake_openai, fake_telegram, database={"url": pg_database},
                                scheduler={"reload_interval_s": 0.5}).model_copy(update={"instance_id": name})
        gateways.append(await start_gateway(config, running))
    await wait_until(lambda: all(g.pushes.scheduler.scheduled() == [job.id] for g in gateways), what="loaded")

    fires = [MONDAY_9_SHANGHAI + 3600 * i for i in range(50)]
    results = await asyncio.gather(*(g.pushes.fire(job.id, t) for t in fires for g in gateways))
    ran = [r for r in results if r is not None]
    assert len(ran) == 50 and len(set(ran)) == 50
    assert len(fake_openai.requests) == 50  # the agent ran once per fire
    await wait_until(lambda: len(sent_texts(fake_telegram, chat)) >= 50, timeout=20, what="50 deliveries")
    await asyncio.sleep(0.5)  # a duplicate would show now
    texts = sent_texts(fake_telegram, chat)
    assert len(texts) == 50 and len(set(texts)) == 50
    runs = gateways[0].jobs.runs(job.id)
    assert len(runs) == 50 and {r.status for r in runs} == {"sent"}
    assert all(len(r.platform_message_ids) == 1 for r in runs)
    print("runs per instance:", {g.instance_id: g.pushes.fired for g in gateways})


async def test_killed_claim_holder_is_taken_over_and_delivered_once(tmp_path, pg_database, fake_telegram,
                                                                    fake_openai, running):
    jobs = fresh(pg_database)
    chat = 5554002
    job, _ = jobs.create_job(job_for(chat))
    jobs.engine.dispose()
    fake_openai.reset()
    calls = []

    def respond(request):
        calls.append(time.monotonic())
        if len(calls) == 1:
            return oa.delay(4, oa.text("never sent"))  # the holder is killed long before it comes
        return oa.text("report after takeover")

    fake_openai.responder = respond
    config_file = tmp_path / "cli.toml"
    config_file.write_text(f"""
instance_id = "cli-holder"
[database]
url = "{pg_database}"
[llm]
base_url = "{fake_openai.url}/v1"
api_key_env = "GATEWAY_TEST_OPENAI_KEY"
max_retries = 0
[scheduler]
claim_timeout_s = 1.5
""")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_PROXY": "127.0.0.1,localhost"}
    holder = subprocess.Popen([sys.executable, "-m", "gateway", "--config", str(config_file), "jobs", "run", job.id],
                              cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        await wait_until(lambda: len(calls) == 1, timeout=20, what="the holder's model call")
        [run] = JobStore(create_db_engine(pg_database)).runs(job.id)
        assert run.status == "running" and run.claimed_by.startswith("cli-holder+jobs.")  # the CLI's own id
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)
    finally:
        if holder.poll() is None:
            holder.kill()

    config = gateway_config(tmp_path / "b", fake_openai, fake_telegram, database={"url": pg_database},
                            scheduler={"reload_interval_s": 0.3, "claim_timeout_s": 1.5}
                            ).model_copy(update={"instance_id": "gw-b"})
    killed_at = time.monotonic()
    gateway = await start_gateway(config, running)
    await wait_until(lambda: sent_texts(fake_telegram, chat) == ["report after takeover"], timeout=15,
                     what="delivery after takeover")
    assert len(calls) == 2 and calls[1] - killed_at < 10
    await wait_until(lambda: gateway.jobs.runs(job.id)[0].status == "sent", what="run settled")
    [run] = gateway.jobs.runs(job.id)
    assert (run.claimed_by, run.attempts, run.trigger) == ("gw-b", 2, "manual")
    await asyncio.sleep(0.5)
    assert sent_texts(fake_telegram, chat) == ["report after takeover"]
