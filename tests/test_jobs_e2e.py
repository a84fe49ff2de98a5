"""Scheduled reports end to end through the real python-telegram-bot, slack-sdk and openai clients
against the loopback fakes: ``/schedule`` in Telegram targeting a Slack channel, fired by ``/run``
and by the scheduler's fire path, delivered into the channel with the agent's answer; ``/jobs``;
bad input; a push into a busy chat; failure notices in the owner's DM; the agent's tool."""

from __future__ import annotations

import asyncio
import re
import time
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

from gateway.core.types import ChatAddress
from gateway.scheduler.store import NewJob
from tests.conftest import FIXTURES, gateway_config, start_gateway
from tests.fakes import openai as oa
from tests.test_telegram_e2e import dm_update, wait_until

OPERATOR = 5553001
CHANNEL = "C0GENERAL1"
SLACK_TARGET = f"slack:T0FAKE0001:{CHANNEL}"
SALES_PROMPT = "Summarise yesterday's sales"
MONDAY_9_SHANGHAI = datetime(2035, 1, 1, 1, 0, tzinfo=UTC).timestamp()  # far ahead: later than any real fire


def command(text: str, message_id: int, user_id: int) -> dict[str, Any]:
    """A Telegram DM carrying ``/command ...`` (with its bot_command entity), dated now."""
    update = dm_update(text, message_id, user_id=user_id)
    update["message"]["date"] = int(time.time())
    update["message"]["entities"] = [{"type": "bot_command", "offset": 0, "length": len(text.split()[0])}]
    return update


def texts(fake, chat_id: int) -> list[str]:
    return [m["text"] for m in fake.sent_messages(chat_id)]


def last_user(request: dict[str, Any]) -> str:
    return next(m["content"] for m in reversed(request["messages"]) if m["role"] == "user")


def respond(request: dict[str, Any]) -> oa.Reply:
    user = last_user(request)
    if SALES_PROMPT in user:
        return oa.text("Sales yesterday: **42** units.")
    if "think slowly" in user:
        return oa.delay(1.0, oa.text("slow answer"))
    return oa.text("ok: " + user.splitlines()[-1])


def config(tmp_path, fake_openai, fake_telegram, fake_slack, **scheduler):
    return gateway_config(tmp_path, fake_openai, fake_telegram, fake_slack,
                          scheduler={"reload_interval_s": 0.3, "claim_timeout_s": 3,
                                     "operators": [f"telegram:{OPERATOR}"], **scheduler})


async def ask(fake_telegram, text: str, message_id: int, user_id: int = OPERATOR) -> str:
    """Sends a command in the user's DM and returns the gateway's reply text. (Message ids are
    spread out: the fake numbers the bot's replies after the user's message.)"""
    before = len(texts(fake_telegram, user_id))
    fake_telegram.inject(command(text, message_id * 10, user_id))
    await wait_until(lambda: len(texts(fake_telegram, user_id)) > before, what=f"reply to {text[:20]}")
    return texts(fake_telegram, user_id)[before]


async def slack_knows_the_channel(gateway, fake_slack) -> None:
    """Someone mentions the bot in the channel (the bot is part of it; the inbox has its address)."""
    url = f"http://127.0.0.1:{gateway.http_port}/slack/events"
    assert (await fake_slack.post_event(url, (FIXTURES / "slack" / "channel_app_mention.json").read_bytes())).status \
        == 200
    await wait_until(lambda: gateway.jobs.chat_seen("slack", "T0FAKE0001", CHANNEL), what="channel seen")


async def test_schedule_in_telegram_delivers_into_a_slack_channel(tmp_path, fake_telegram, fake_slack, fake_openai,
                                                                 running):
    fake_openai.reset()
    fake_openai.responder = respond
    gateway = await start_gateway(config(tmp_path, fake_openai, fake_telegram, fake_slack), running)
    await slack_knows_the_channel(gateway, fake_slack)

    reply = await ask(fake_telegram, f'/schedule "0 9 * * 1-5" Asia/Shanghai --to {SLACK_TARGET} {SALES_PROMPT}',
                      8001)
    job_id = re.search(r"Scheduled report (\w+)", reply).group(1)
    [job] = gateway.jobs.list_jobs()
    assert job.id == job_id and job.target == ChatAddress("slack", "T0FAKE0001", CHANNEL)
    assert (job.schedule, job.timezone, job.prompt) == ("0 9 * * 1-5", "Asia/Shanghai", SALES_PROMPT)
    assert job.owner_dm == ChatAddress("telegram", "7000000001", str(OPERATOR))
    assert re.search(r"Next: \d{4}-\d\d-\d\d 09:00 Asia/Shanghai", reply)
    await wait_until(lambda: gateway.pushes.scheduler.scheduled() == [job_id], what="job scheduled")
    nxt = gateway.pushes.scheduler.next_run(job_id).astimezone(ZoneInfo("Asia/Shanghai"))
    assert nxt.hour == 9 and nxt.weekday() < 5

    # /run fires it now: the agent's answer goes to the channel (top level), as Slack mrkdwn.
    posts_before = len(fake_slack.calls())
    assert "Running" in await ask(fake_telegram, f"/run {job_id}", 8002)
    call = await fake_slack.wait_for_call("chat.postMessage", lambda c: c.params["channel"] == CHANNEL
                                          and "Sales" in c.params["text"], timeout=10, since=posts_before)
    assert call.params["text"] == "Sales yesterday: *42* units." and "thread_ts" not in call.params
    push_request = next(r["json"] for r in fake_openai.requests if SALES_PROMPT in last_user(r["json"]))
    assert "scheduled report" in push_request["messages"][0]["content"]
    assert "schedule_report" not in str(push_request.get("tools"))  # chat-only tool left out of pushes

    def manual_runs():
        return [r for r in gateway.jobs.runs(job_id) if r.trigger == "manual"]  # (a real 09:00 fire may add one)

    await wait_until(lambda: [r.status for r in manual_runs()] == ["sent"], what="run settled")
    [run] = manual_runs()
    posted_ts = next(m["ts"] for m in fake_slack.posted(CHANNEL) if m["text"].startswith("Sales"))
    assert (run.trigger, run.platform_message_ids) == ("manual", [posted_ts])

    # The scheduler's fire path for a Monday 09:00 Shanghai fire: claimed once, delivered once.
    run_id = await gateway.pushes.fire(job_id, MONDAY_9_SHANGHAI)
    assert run_id is not None and await gateway.pushes.fire(job_id, MONDAY_9_SHANGHAI) is None
    await wait_until(lambda: gateway.jobs.get_run(run_id).status == "sent", what="scheduled run sent")
    channel_posts = [m["text"] for m in fake_slack.posted(CHANNEL) if m["text"].startswith("Sales")]
    assert len(channel_posts) == 2
    assert gateway.metrics.scheduled_fires.labels("delivering")._value.get() >= 2  # /metrics counts fires

    listing = await ask(fake_telegram, "/jobs", 8003)
    assert job_id in listing and "0 9 * * 1-5" in listing and SLACK_TARGET in listing
    assert "last: 2035-01-01 09:00 Asia/Shanghai (sent)" in listing
    assert re.search(r"next: \d{4}-\d\d-\d\d 09:00 Asia/Shanghai", listing)

    assert "Removed" in await ask(fake_telegram, f"/unschedule {job_id}", 8004)
    assert gateway.jobs.list_jobs() == []
    await wait_until(lambda: gateway.pushes.scheduler.scheduled() == [], what="job unscheduled")


async def test_bad_input_gets_a_clear_error_and_creates_no_job(tmp_path, fake_telegram, fake_slack, fake_openai,
                                                                running):
    fake_openai.reset()
    fake_openai.responder = respond
    gateway = await start_gateway(config(tmp_path, fake_openai, fake_telegram, fake_slack), running)
    await slack_knows_the_channel(gateway, fake_slack)
    alice = 5553002  # not an operator: she has written only from her Telegram DM
    cases = [
        ('/schedule "0 9 * * 1-5" Mars/Olympus Sales', "unknown time zone 'Mars/Olympus'"),
        ('/schedule "0 25 * * 1-5" Asia/Shanghai Sales', "bad cron expression '0 25 * * 1-5'"),
        ('/schedule "0 9 * * 8" Asia/Shanghai Sales', "day of week: 8 is out of range"),
        ('/schedule "0 9 30 2 *" UTC Sales', "never fires"),
        (f'/schedule "0 9 * * 1-5" UTC --to {SLACK_TARGET} Sales', "you may not post to slack:T0FAKE0001:C0GENERAL1"),
        ('/schedule "0 9 * * 1-5" UTC --to telegram:7000000001:-100123 Sales', "you may not post to"),
        ('/schedule "0 9 * * 1-5" UTC --to feishu:oc_1 Sales', "platform 'feishu' is not enabled"),
        ('/schedule "0 9 * * 1-5" UTC', "say what the report should contain"),
    ]
    for index, (text, problem) in enumerate(cases):
        answer = await ask(fake_telegram, text, 8100 + index, user_id=alice)
        assert answer.startswith("⚠️") and problem in answer, (text, answer)
    assert "no scheduled report 'nope1'" in await ask(fake_telegram, "/run nope1", 8120, user_id=alice)
    assert gateway.jobs.list_jobs() == []
    assert "You have no scheduled reports" in await ask(fake_telegram, "/jobs", 8121, user_id=alice)
    assert not any("Mars" in str(r["json"]) for r in fake_openai.requests)  # the model never saw a command

    # An operator may not target a chat the bot has never heard from either.
    answer = await ask(fake_telegram, '/schedule "0 9 * * 1-5" UTC --to slack:T0FAKE0001:C0NEVER001 x', 8122)
    assert "not a chat I have received a message from" in answer
    # Another user's job can be neither run nor removed by Alice.
    mine = await ask(fake_telegram, '/schedule "@daily" UTC Morning news', 8123)
    job_id = re.search(r"Scheduled report (\w+)", mine).group(1)
    assert "no scheduled report" in await ask(fake_telegram, f"/unschedule {job_id}", 8124, user_id=alice)
    assert [j.id for j in gateway.jobs.list_jobs()] == [job_id]


async def test_a_redelivered_schedule_command_creates_one_job(tmp_path, fake_telegram, fake_slack, fake_openai,
                                                              running):
    fake_openai.reset()
    fake_openai.responder = respond
    gateway = await start_gateway(config(tmp_path, fake_openai, fake_telegram, fake_slack), running)
    update = command('/schedule "0 8 * * *" Europe/Warsaw Daily digest', 8201, OPERATOR)
    update["update_id"] = 990001
    fake_telegram.inject(update)
    await wait_until(lambda: len(gateway.jobs.list_jobs()) == 1, what="job")
    fake_telegram.inject(dict(update))
    await wait_until(lambda: gateway.duplicates == 1, what="duplicate dropped")
    assert len(gateway.jobs.list_jobs()) == 1


async def test_a_push_into_a_busy_chat_is_delivered_without_waiting_for_the_lane(tmp_path, fake_telegram,
                                                                                 fake_slack, fake_openai, running):
    fake_openai.reset()
    fake_openai.responder = respond
    gateway = await start_gateway(config(tmp_path, fake_openai, fake_telegram, fake_slack), running)
    user = 5553003
    created = await ask(fake_telegram, f'/schedule "0 9 * * 1-5" Asia/Shanghai {SALES_PROMPT}', 8301, user_id=user)
    job_id = re.search(r"Scheduled report (\w+)", created).group(1)
    fake_telegram.inject(dm_update("think slowly about this", 8302, user_id=user))
    await wait_until(lambda: any("think slowly" in last_user(r["json"]) for r in fake_openai.requests),
                     what="slow turn running")
    with gateway.engine.connect() as conn:  # the DM's lane: its key follows the user (dm:<user id>)
        key = conn.exec_driver_sql("SELECT session_key FROM inbox WHERE platform_message_id = ?",
                                   (f"{user}:8302",)).scalar_one()
    assert gateway.store.lane_busy(key)
    run_id = await gateway.pushes.fire(job_id, MONDAY_9_SHANGHAI)
    await wait_until(lambda: "Sales yesterday: 42 units." in texts(fake_telegram, user), what="push delivered")
    assert gateway.store.lane_busy(key)  # delivered while the chat's turn was still running
    await wait_until(lambda: "slow answer" in texts(fake_telegram, user), what="slow answer")
    assert texts(fake_telegram, user)[1:] == ["Sales yesterday: 42 units.", "slow answer"]
    await wait_until(lambda: gateway.jobs.get_run(run_id).status == "sent", what="run sent")


async def test_failures_are_told_to_the_owner_in_their_dm(tmp_path, fake_telegram, fake_slack, fake_openai, running):
    fake_openai.reset()
    fake_openai.responder = respond
    gateway = await start_gateway(config(tmp_path, fake_openai, fake_telegram, fake_slack), running)
    owner = 5553004
    owner_dm = ChatAddress("telegram", "7000000001", str(owner))
    gone, _ = gateway.jobs.create_job(NewJob(
        owner=f"telegram:7000000001:{owner}", owner_name="Olga", owner_dm=owner_dm,
        target=ChatAddress("slack", "T0FAKE0001", "C0ARCHIVED1"), schedule_kind="cron", schedule="0 9 * * 1-5",
        timezone="Asia/Shanghai", prompt=SALES_PROMPT))
    run_id = await gateway.pushes.fire(gone.id, MONDAY_9_SHANGHAI)
    await wait_until(lambda: len(texts(fake_telegram, owner)) == 1, what="delivery failure notice")
    run = gateway.jobs.get_run(run_id)
    assert (run.status, run.error, run.platform_message_ids) == ("failed", "slack error: channel_not_found", [])
    notice = texts(fake_telegram, owner)[0]
    assert gone.id in notice and "slack:T0FAKE0001:C0ARCHIVED1" in notice and "channel_not_found" in notice
    assert "2035-01-01 09:00 Asia/Shanghai" in notice

    # The model failing is a failed run too, told at once (no delivery attempt).
    fake_openai.responder = lambda req: oa.error(500, "The server had an error", "server_error")
    model_run = await gateway.pushes.fire(gone.id, MONDAY_9_SHANGHAI + 86400)
    await wait_until(lambda: len(texts(fake_telegram, owner)) == 2, what="model failure notice")
    assert gateway.jobs.get_run(model_run).status == "failed" and gateway.jobs.get_run(model_run).outbox_id is None
    await asyncio.sleep(0.4)  # another maintenance pass: nobody is told twice
    assert len(texts(fake_telegram, owner)) == 2


async def test_the_agent_schedules_a_report_with_its_tool(tmp_path, fake_telegram, fake_slack, fake_openai, running):
    fake_openai.reset()
    gateway = await start_gateway(config(tmp_path, fake_openai, fake_telegram, fake_slack), running)
    user = 5553005
    good = oa.call("schedule_report", {"schedule": "0 9 * * 1", "timezone": "Europe/Warsaw",
                                       "prompt": "Weekly KPI summary"})
    bad = oa.call("schedule_report", {"schedule": "0 9 * * 1", "timezone": "Europe/Warsw", "prompt": "x",
                                      "target": SLACK_TARGET})
    fake_openai.script(oa.tool_calls(good, bad))
    fake_openai.responder = lambda req: oa.text("Done: " + " | ".join(
        m["content"][:60] for m in req["messages"] if m["role"] == "tool"))
    fake_telegram.inject(dm_update("every Monday 9am Warsaw send me the KPI summary", 8401, user_id=user))
    await wait_until(lambda: len(texts(fake_telegram, user)) == 1, what="agent reply")
    [job] = gateway.jobs.list_jobs()
    assert (job.schedule, job.timezone, job.prompt) == ("0 9 * * 1", "Europe/Warsaw", "Weekly KPI summary")
    assert job.target == ChatAddress("telegram", "7000000001", str(user)) and job.owner == f"telegram:7000000001:{user}"
    tool_results = {m["tool_call_id"]: m["content"] for m in fake_openai.requests[-1]["json"]["messages"]
                    if m["role"] == "tool"}
    assert f"Scheduled report {job.id} created" in tool_results[good.id]
    assert "unknown time zone 'Europe/Warsw'" in tool_results[bad.id]
    assert "Nothing was scheduled" in tool_results[bad.id]
    await wait_until(lambda: gateway.pushes.scheduler.scheduled() == [job.id], what="tool job scheduled")


async def test_slack_commands_after_a_mention_schedule_into_the_thread(tmp_path, fake_telegram, fake_slack,
                                                                       fake_openai, running):
    from tests.test_slack_e2e import message

    fake_openai.reset()
    fake_openai.responder = respond
    gateway = await start_gateway(config(tmp_path, fake_openai, fake_telegram, fake_slack), running)
    url = f"http://127.0.0.1:{gateway.http_port}/slack/events"
    ts = "1735690100.000100"
    since = len(fake_slack.calls())  # wait_for_call counts every call of the log
    event = message(f'<@{fake_slack.bot_user_id}> /schedule "0 9 * * 1-5" Asia/Shanghai Standup notes', ts,
                    channel=CHANNEL, user="U0BOB00001")
    assert (await fake_slack.post_event(url, event)).status == 200
    call = await fake_slack.wait_for_call("chat.postMessage", lambda c: c.params["channel"] == CHANNEL, since=since)
    assert call.params["text"].startswith("Scheduled report") and call.params["thread_ts"] == ts
    [job] = gateway.jobs.list_jobs()
    assert job.target == ChatAddress("slack", "T0FAKE0001", CHANNEL, ts) and job.owner == "slack:T0FAKE0001:U0BOB00001"
    assert fake_openai.requests == []  # answered by the gateway
    run_id = await gateway.pushes.fire(job.id, MONDAY_9_SHANGHAI)
    await wait_until(lambda: gateway.jobs.get_run(run_id).status == "sent", what="push sent")
    [push] = [m for m in fake_slack.posted(CHANNEL, thread_ts=ts) if m["text"].startswith("ok:")]
    assert push["text"] == "ok: Standup notes"  # the report, in the thread it was scheduled from


async def test_a_one_shot_job_fires_once_and_retires(tmp_path, fake_telegram, fake_slack, fake_openai, running):
    fake_openai.reset()
    fake_openai.responder = respond
    gateway = await start_gateway(config(tmp_path, fake_openai, fake_telegram, fake_slack), running)
    user = 5553006
    created = await ask(fake_telegram, "/schedule at 2035-01-01 09:00 Asia/Shanghai New year sales", 8501, user_id=user)
    assert "Next: 2035-01-01 09:00 Asia/Shanghai" in created
    [job] = gateway.jobs.list_jobs()
    await wait_until(lambda: gateway.pushes.scheduler.scheduled() == [job.id], what="scheduled")
    assert gateway.pushes.scheduler.next_run(job.id).timestamp() == MONDAY_9_SHANGHAI
    run_id = await gateway.pushes.fire(job.id, MONDAY_9_SHANGHAI)
    await wait_until(lambda: gateway.jobs.get_run(run_id).status == "sent", what="sent")
    assert not gateway.jobs.get_job(job.id).enabled
    await wait_until(lambda: gateway.pushes.scheduler.scheduled() == [], what="retired")
    listing = await ask(fake_telegram, "/jobs", 8502, user_id=user)
    assert "[finished]" in listing and "next: -" in listing


async def test_scheduled_runs_deny_side_effects_by_default(tmp_path, fake_telegram, fake_slack, fake_openai, running):
    """Nobody is there to approve during a push: a write the model attempts is denied, not run."""
    fake_openai.reset()

    def write_in_push(request: dict[str, Any]) -> oa.Reply:
        last = request["messages"][-1]
        if last["role"] == "tool":
            return oa.text("report: " + ("denied" if "Denied" in last["content"] else "written"))
        if "Scheduled report" in str(last.get("content")):
            return oa.tool_calls(oa.call("write_file", {"path": "push.txt", "content": "x"}))
        return respond(request)

    fake_openai.responder = write_in_push
    cfg = config(tmp_path, fake_openai, fake_telegram, fake_slack)
    cfg = cfg.model_copy(update={  # production defaults: writes need approval
        "tools": cfg.tools.model_copy(update={"workspace": "write", "workspace_root": str(tmp_path / "ws")}),
        "approvals": cfg.approvals.model_copy(update={"require_for": ["write", "external"]})})
    gateway = await start_gateway(cfg, running)
    user = 5553077
    created = await ask(fake_telegram, f'/schedule "0 9 * * 1-5" Asia/Shanghai {SALES_PROMPT}', 8701, user_id=user)
    job_id = re.search(r"Scheduled report (\w+)", created).group(1)
    run_id = await gateway.pushes.fire(job_id, MONDAY_9_SHANGHAI)
    await wait_until(lambda: any(t.startswith("report:") for t in texts(fake_telegram, user)), what="push delivered")
    assert "report: denied" in texts(fake_telegram, user)
    assert gateway.jobs.get_run(run_id) is not None
    assert not list((tmp_path / "ws").rglob("push.txt"))


async def test_a_report_scheduled_in_a_group_knows_its_owners_dm(tmp_path, fake_telegram, fake_openai, running):
    """A member who has talked to the bot in a DM schedules a report from a group: the job keeps
    their DM, where its failures are told. The DM look-up searched the inbox for a session key the
    gateway no longer uses, so such a job had no DM and its failures were told to nobody."""
    fake_openai.reset()
    fake_openai.responder = respond
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai, fake_telegram,
                                                 scheduler={"reload_interval_s": 0.3}), running)
    member, group = 5553071, -4000000071
    fake_telegram.inject(dm_update("hello", 7101, user_id=member))
    await wait_until(lambda: texts(fake_telegram, member), what="the DM answered")
    text = '/schedule@gateway_test_bot "0 9 * * 1-5" UTC team digest'
    fake_telegram.inject({"update_id": 870000071, "message": {
        "message_id": 7102, "from": {"id": member, "is_bot": False, "first_name": "Mia"},
        "chat": {"id": group, "title": "Team", "type": "group"}, "date": int(time.time()), "text": text,
        "entities": [{"type": "bot_command", "offset": 0, "length": len(text.split()[0])}]}})
    await wait_until(lambda: any("Scheduled report" in t for t in texts(fake_telegram, group)),
                     what="the job created in the group")
    [job] = gateway.jobs.list_jobs()
    assert job.target == ChatAddress("telegram", "7000000001", str(group))
    assert job.owner_dm == ChatAddress("telegram", "7000000001", str(member))
