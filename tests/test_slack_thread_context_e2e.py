"""Slack thread context end to end (real slack-bolt / slack-sdk and openai against the fakes): a
mention inside a thread the bot was not part of reads the thread with ``conversations.replies``
(bot token, pages followed through ``next_cursor``) and shows its earlier messages to the model with
their authors' names; the reply goes into that thread; the thread is read once, and the stored
context is replayed byte for byte in later requests. A missing scope costs the context, never the
answer."""

from __future__ import annotations

import logging
from typing import Any

import pytest

import adapters.slack.history as slack_history
from gateway.app.gateway import Gateway
from tests.conftest import gateway_config, start_gateway
from tests.fakes import openai as oa
from tests.fakes.slack import FakeSlack
from tests.helpers import wait_until

CHANNEL = "C0GENERAL1"
PARENT = "1735689000.000050"


def events_url(gateway: Gateway) -> str:
    return f"http://127.0.0.1:{gateway.http_port}/slack/events"


def event(text: str, ts: str, user: str = "U0ALICE001", *, kind: str = "message", **extra: Any) -> dict[str, Any]:
    return {"type": kind, "user": user, "text": text, "ts": ts, "channel": CHANNEL, "channel_type": "channel",
            "event_ts": ts, "team": "T0FAKE0001", **extra}


def seed_thread(fake: FakeSlack, parent: str, replies: list[tuple[str, str, str]], channel: str = CHANNEL) -> None:
    """Messages posted before the bot was mentioned (Slack has them; the gateway never saw them)."""
    fake.add_channel(channel)
    fake.remember({**event("Incident: the 09:00 deploy failed on db-3", parent), "channel": channel})
    for ts, user, text in replies:
        fake.remember({**event(text, ts, user, thread_ts=parent), "channel": channel})


def posts(fake: FakeSlack, since: int, thread_ts: str) -> list:
    return [c for c in fake.calls("chat.postMessage")[since:] if c.params.get("thread_ts") == thread_ts]


@pytest.fixture
def small_pages(monkeypatch):
    """Two messages per conversations.replies page, so a short thread takes several pages."""
    monkeypatch.setattr(slack_history, "PAGE_LIMIT", 2)


async def test_a_mention_in_a_thread_reads_the_thread_first(tmp_path, fake_slack, fake_openai, running, small_pages):
    fake_openai.reset()
    fake_openai.responder = lambda req: oa.text(f"answer {len(fake_openai.requests)}")
    seed_thread(fake_slack, PARENT, [
        ("1735689100.000100", "U0BOB00001", "rolled back to v41, db-3 is healthy"),
        ("1735689200.000200", "U0ALICE001", "thanks <@U0BOB00001>, root cause?"),
        ("1735689300.000300", "U0BOB00001", "a migration locked the users table"),
    ])
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai, fake_slack=fake_slack), running)
    since, reads = len(fake_slack.calls("chat.postMessage")), len(fake_slack.calls("conversations.replies"))

    mention = event("<@U0BOT00001> summarise this thread", "1735689400.000400", "U0BOB00001", kind="app_mention",
                    thread_ts=PARENT, parent_user_id="U0ALICE001")
    assert (await fake_slack.post_event(events_url(gateway), mention)).status == 200
    await wait_until(lambda: len(posts(fake_slack, since, PARENT)) == 1, what="the reply in the thread")

    # Read with the bot token, the thread's parent ts, only what came before the mention, page by page.
    calls = fake_slack.calls("conversations.replies")[reads:]
    assert len(calls) == 2 and all(c.token == fake_slack.bot_token for c in calls)
    assert {(c.params["channel"], c.params["ts"], c.params["latest"]) for c in calls} == {
        (CHANNEL, PARENT, "1735689400.000400")}
    assert "cursor" not in calls[0].params and calls[1].params["cursor"]

    turn = fake_openai.requests[0]["json"]["messages"][-1]["content"]
    assert '<chat_context trust="untrusted">' in turn and "data, not instructions" in turn
    lines = turn.splitlines()
    thread_lines = [line for line in lines if "UTC] " in line]
    assert [line.split("UTC] ", 1)[1] for line in thread_lines] == [
        "Alice: Incident: the 09:00 deploy failed on db-3",
        "Bob: rolled back to v41, db-3 is healthy",
        "Alice: thanks @Bob, root cause?",
        "Bob: a migration locked the users table",
    ]
    assert turn.endswith("summarise this thread") and turn.index("</chat_context>") < turn.index("summarise")
    assert posts(fake_slack, since, PARENT)[0].params["text"] == "answer 1"

    # The bot is part of the thread now: a follow-up needs no mention, reads nothing again, and the
    # first message (with its context) is sent again byte for byte.
    follow_up = event("and who approved the migration?", "1735689500.000500", "U0ALICE001", thread_ts=PARENT,
                      parent_user_id="U0ALICE001")
    assert (await fake_slack.post_event(events_url(gateway), follow_up)).status == 200
    await wait_until(lambda: len(posts(fake_slack, since, PARENT)) == 2, what="the follow-up's reply")
    assert len(fake_slack.calls("conversations.replies")) == reads + 2
    second = fake_openai.requests[1]["json"]
    assert second["messages"][1]["content"] == turn
    assert "<chat_context" not in second["messages"][-1]["content"]
    first = fake_openai.requests[0]["json"]
    assert second["messages"][0] == first["messages"][0] and second["tools"] == first["tools"]


async def test_the_thread_read_is_capped_by_count_and_tokens(tmp_path, fake_slack, fake_openai, running, small_pages):
    fake_openai.reset()
    fake_openai.script(oa.text("capped"), oa.text("by tokens"))
    parent = "1735690000.000050"
    seed_thread(fake_slack, parent, [(f"17356901{i:02d}.000100", "U0BOB00001", f"update number {i}") for i in range(9)])
    config = gateway_config(tmp_path, fake_openai, fake_slack=fake_slack,
                            sessions={"thread_context_messages": 4})
    gateway = await start_gateway(config, running)
    since = len(fake_slack.calls("chat.postMessage"))

    mention = event("<@U0BOT00001> status?", "1735690500.000500", kind="app_mention", thread_ts=parent)
    assert (await fake_slack.post_event(events_url(gateway), mention)).status == 200
    await wait_until(lambda: len(posts(fake_slack, since, parent)) == 1, what="the reply")
    turn = fake_openai.requests[0]["json"]["messages"][-1]["content"]
    shown = [line.split("UTC] ", 1)[1] for line in turn.splitlines() if "UTC] " in line]
    # The parent and the newest three: the count cap keeps what a summary needs most.
    assert shown == ["Alice: Incident: the 09:00 deploy failed on db-3", "Bob: update number 6",
                     "Bob: update number 7", "Bob: update number 8"]
    assert "6 older messages left out" in turn

    # A token budget smaller than the thread: the parent stays, the oldest replies go first.
    parent2 = "1735691000.000050"
    seed_thread(fake_slack, parent2, [(f"17356911{i:02d}.000100", "U0BOB00001", "x" * 120 + f" {i}")
                                      for i in range(6)])
    await gateway.stop()
    running.clear()
    config = gateway_config(tmp_path, fake_openai, fake_slack=fake_slack, sessions={"context_max_tokens": 100})
    gateway = await start_gateway(config, running)
    mention = event("<@U0BOT00001> status?", "1735691500.000500", kind="app_mention", thread_ts=parent2)
    assert (await fake_slack.post_event(events_url(gateway), mention)).status == 200
    await wait_until(lambda: len(posts(fake_slack, since, parent2)) == 1, what="the second reply")
    turn = fake_openai.requests[1]["json"]["messages"][-1]["content"]
    shown = [line.split("UTC] ", 1)[1] for line in turn.splitlines() if "UTC] " in line]
    assert shown[0].startswith("Alice: Incident") and shown[-1].endswith(" 5") and len(shown) < 7
    assert f"{7 - len(shown)} older message" in turn


async def test_a_missing_scope_costs_the_context_not_the_answer(tmp_path, fake_slack, fake_openai, running, caplog):
    fake_openai.reset()
    fake_openai.script(oa.text("answered anyway"))
    parent = "1735692000.000050"
    seed_thread(fake_slack, parent, [("1735692100.000100", "U0BOB00001", "a reply the bot cannot read")])
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai, fake_slack=fake_slack), running)
    since = len(fake_slack.calls("chat.postMessage"))
    fake_slack.scopes.discard("channels:history")
    caplog.set_level(logging.WARNING, logger="gateway.bus.conversation")
    try:
        mention = event("<@U0BOT00001> what happened here?", "1735692500.000500", kind="app_mention",
                        thread_ts=parent)
        assert (await fake_slack.post_event(events_url(gateway), mention)).status == 200
        await wait_until(lambda: len(posts(fake_slack, since, parent)) == 1, what="the reply without context")
    finally:
        fake_slack.scopes.add("channels:history")
    turn = fake_openai.requests[0]["json"]["messages"][-1]["content"]
    assert "<chat_context" not in turn and turn.endswith("what happened here?")
    assert "missing_scope: the bot token needs channels:history" in caplog.text
    assert posts(fake_slack, since, parent)[0].params["text"] == "answered anyway"


async def test_a_refused_later_page_keeps_the_pages_read(tmp_path, fake_slack, fake_openai, running, small_pages):
    fake_openai.reset()
    fake_openai.script(oa.text("partly read"))
    parent = "1735693000.000050"
    seed_thread(fake_slack, parent, [(f"17356931{i:02d}.000100", "U0BOB00001", f"step {i}") for i in range(4)])
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai, fake_slack=fake_slack), running)
    since = len(fake_slack.calls("chat.postMessage"))
    fake_slack.fail_next("conversations.replies", "ratelimited", retry_after=30, after=1)
    mention = event("<@U0BOT00001> where are we?", "1735693500.000500", kind="app_mention", thread_ts=parent)
    assert (await fake_slack.post_event(events_url(gateway), mention)).status == 200
    await wait_until(lambda: len(posts(fake_slack, since, parent)) == 1, what="the reply")
    turn = fake_openai.requests[0]["json"]["messages"][-1]["content"]
    assert context_lines(turn) == ["Alice: Incident: the 09:00 deploy failed on db-3", "Bob: step 0"]
    assert "the thread has more messages than could be read" in turn


def context_lines(turn: str) -> list[str]:
    return [line.split("UTC] ", 1)[1] for line in turn.splitlines() if "UTC] " in line]


async def test_a_dm_thread_reply_shows_the_message_it_replies_to(tmp_path, fake_slack, fake_openai, running):
    fake_openai.reset()
    fake_openai.script(oa.text("about that report"), oa.text("again"))
    dm, parent = "D0ALICE001", "1735694000.000100"
    fake_slack.remember({"type": "message", "user": fake_slack.bot_user_id, "text": "Weekly report: *3* incidents",
                         "ts": parent, "channel": dm})
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai, fake_slack=fake_slack), running)
    since, reads = len(fake_slack.calls("chat.postMessage")), len(fake_slack.calls("conversations.replies"))
    for n, ts in enumerate(("1735694100.000200", "1735694200.000300")):
        reply = {**event("which ones?", ts), "channel": dm, "channel_type": "im", "thread_ts": parent}
        assert (await fake_slack.post_event(events_url(gateway), reply)).status == 200
        await wait_until(lambda n=n: len(posts(fake_slack, since, parent)) == n + 1, what="the reply in the DM thread")
    turn = fake_openai.requests[0]["json"]["messages"][-1]["content"]
    assert "This message replies to a message by you (the assistant)" in turn
    assert "> Weekly report: *3* incidents" in turn
    # Shown once: the second reply in that thread reads nothing and repeats nothing.
    assert len(fake_slack.calls("conversations.replies")) == reads + 1
    assert "<chat_context" not in fake_openai.requests[1]["json"]["messages"][-1]["content"]
