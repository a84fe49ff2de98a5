"""Slack slash commands and the assistant surface end to end, through the real slack-bolt /
slack-sdk against the wire-level fake: a signed form-encoded ``/status`` is stored before its ack
and answered once, ephemerally, through its ``response_url`` (``chat.postEphemeral`` when that is
used up); a forged one gets 401 and changes nothing; ``/new`` works over Socket Mode too, under a
configured prefix; an assistant thread gets suggested prompts, and its status is set while a turn
runs and cleared after the reply."""

from __future__ import annotations

import asyncio
import json

from gateway.app.gateway import Gateway
from tests.conftest import gateway_config, start_gateway
from tests.fakes import openai as oa
from tests.fakes.slack import FakeSlack
from tests.helpers import wait_until

DM, CHANNEL, ALICE = "D0ALICE001", "C0GENERAL1", "U0ALICE001"
SLACK_ACK_S = 3.0  # Slack gives up on a slash command not answered within 3 s ("operation_timeout")


def events_url(gateway: Gateway) -> str:
    return f"http://127.0.0.1:{gateway.http_port}/slack/events"


def inbox_rows(gateway: Gateway) -> int:
    return sum(gateway.store.count_inbox(status) for status in ("pending", "done", "failed"))


def ephemeral(fake: FakeSlack, since: int) -> list[dict]:
    return fake.ephemeral[since:]


async def test_status_is_stored_before_the_ack_and_answered_ephemerally_once(tmp_path, fake_slack, fake_openai,
                                                                            running):
    fake_openai.reset()
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai, fake_slack=fake_slack), running)
    shown, posted = len(fake_slack.ephemeral), len(fake_slack.calls("chat.postMessage"))

    fields = fake_slack.command_payload("/status", channel=CHANNEL)
    delivery = await fake_slack.post_command(events_url(gateway), fields, timeout=SLACK_ACK_S)
    assert delivery.status == 200 and delivery.body == ""  # an empty ack: the answer follows ephemerally
    assert inbox_rows(gateway) == 1  # stored before Slack had its 200

    await wait_until(lambda: ephemeral(fake_slack, shown), what="ephemeral /status answer")
    await wait_until(lambda: gateway.store.outbox_counts().get("sent") == 1, what="outbox row settled")
    (answer,) = ephemeral(fake_slack, shown)
    assert answer["via"] == "response_url" and answer["user"] == ALICE and answer["channel"] == CHANNEL
    assert "gpt-4o-mini" in answer["text"] and answer["mrkdwn_problems"] == []
    assert len(fake_slack.calls("chat.postMessage")) == posted  # nothing for the whole channel
    assert fake_openai.requests == []  # a command, never a model call

    # The same invocation delivered again (same trigger_id) is a duplicate: no second answer.
    assert (await fake_slack.post_command(events_url(gateway), fields, timeout=SLACK_ACK_S)).status == 200
    await wait_until(lambda: gateway.duplicates == 1, what="duplicate dropped")
    await asyncio.sleep(0.5)
    assert len(ephemeral(fake_slack, shown)) == 1 and inbox_rows(gateway) == 1


async def test_forged_command_gets_401_and_unknown_commands_are_answered_in_the_ack(tmp_path, fake_slack,
                                                                                  fake_openai, running):
    fake_openai.reset()
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai, fake_slack=fake_slack), running)
    shown = len(fake_slack.ephemeral)

    forged = await fake_slack.post_command(events_url(gateway), fake_slack.command_payload("/new"),
                                           probe="bad_signature")
    assert forged.status == 401
    other = await fake_slack.post_command(events_url(gateway), fake_slack.command_payload("/deploy", "prod"),
                                          timeout=SLACK_ACK_S)
    assert other.status == 200
    assert json.loads(other.body) == {"response_type": "ephemeral",
                                      "text": "/deploy is not a command of this assistant."}
    await asyncio.sleep(0.5)
    assert inbox_rows(gateway) == 0 and ephemeral(fake_slack, shown) == []


async def test_a_used_up_response_url_falls_back_to_chat_post_ephemeral(tmp_path, fake_slack, fake_openai, running):
    fake_openai.reset()
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai, fake_slack=fake_slack), running)
    shown = len(fake_slack.ephemeral)
    fields = fake_slack.command_payload("/help", channel=DM)
    fake_slack.expire_response_url(fields["response_url"])  # answered after Slack's 30 minutes

    assert (await fake_slack.post_command(events_url(gateway), fields, timeout=SLACK_ACK_S)).status == 200
    await wait_until(lambda: ephemeral(fake_slack, shown), what="ephemeral /help answer")
    (answer,) = ephemeral(fake_slack, shown)
    assert answer["via"] == "chat.postEphemeral" and answer["user"] == ALICE and answer["channel"] == DM
    assert "/new" in answer["text"]

    # A response_url off Slack is never contacted (a retry loop on it would never end in
    # chat.postEphemeral: nothing listens on port 9).
    off_slack = {**fake_slack.command_payload("/help", channel=DM), "response_url": "http://127.0.0.1:9/commands/x"}
    assert (await fake_slack.post_command(events_url(gateway), off_slack, timeout=SLACK_ACK_S)).status == 200
    await wait_until(lambda: len(ephemeral(fake_slack, shown)) == 2, what="second /help answer")
    assert ephemeral(fake_slack, shown)[1]["via"] == "chat.postEphemeral"

    # Authentic but unusable (no user_id): acknowledged so Slack does not retry, nothing stored.
    rows = inbox_rows(gateway)
    broken = {k: v for k, v in fake_slack.command_payload("/help").items() if k != "user_id"}
    delivery = await fake_slack.post_command(events_url(gateway), broken, timeout=SLACK_ACK_S)
    assert delivery.status == 200 and delivery.headers.get("X-Slack-No-Retry") == "1"
    assert inbox_rows(gateway) == rows


async def test_prefixed_new_over_socket_mode_starts_a_new_conversation(tmp_path, fake_slack, fake_openai, running):
    fake_openai.reset()
    fake_openai.responder = lambda req: oa.text(f"{len(req['messages'])} messages")
    config = gateway_config(tmp_path, fake_openai, fake_slack=fake_slack,
                            slack={"mode": "socket", "command_prefix": "agent-"})
    gateway = await start_gateway(config, running)
    await wait_until(lambda: fake_slack.socket_clients == 1, what="socket connection")
    shown, posted = len(fake_slack.ephemeral), len(fake_slack.calls("chat.postMessage"))

    first = fake_slack.push(event={"type": "message", "user": ALICE, "text": "hello", "ts": "1735720000.000100",
                                   "channel": DM, "channel_type": "im", "team": fake_slack.team_id})
    await fake_slack.wait_for_ack(first)
    await wait_until(lambda: len(fake_slack.calls("chat.postMessage")) == posted + 1, what="first answer")

    command = fake_slack.push_command(fake_slack.command_payload("/agent-new"))
    ack = await fake_slack.wait_for_ack(command)
    assert ack == {"envelope_id": command}  # acked with no payload: the answer follows ephemerally
    await wait_until(lambda: ephemeral(fake_slack, shown), what="ephemeral /agent-new answer")
    assert ephemeral(fake_slack, shown)[0]["text"] == (
        "Started a new conversation. The previous one is listed in /agent-sessions.")  # named as typed here

    second = fake_slack.push(event={"type": "message", "user": ALICE, "text": "again", "ts": "1735720000.000300",
                                    "channel": DM, "channel_type": "im", "team": fake_slack.team_id})
    await fake_slack.wait_for_ack(second)
    await wait_until(lambda: len(fake_slack.calls("chat.postMessage")) == posted + 2, what="second answer")
    assert fake_slack.calls("chat.postMessage")[-1].params["text"] == "2 messages"  # the old turn is gone
    assert gateway.store.count_inbox("done") == 3

    # Unprefixed, the name is not ours here (another app may own /new in this workspace).
    unprefixed = fake_slack.push_command(fake_slack.command_payload("/new"))
    answered = await fake_slack.wait_for_ack(unprefixed)
    assert answered["payload"]["text"] == "/new is not a command of this assistant."

    # A frame whose fields have the wrong JSON types is acked (Slack would resend it forever) and dropped.
    rows = gateway.store.count_inbox("done")
    broken = fake_slack.push_command({**fake_slack.command_payload("/agent-status"), "user_id": 5})
    assert await fake_slack.wait_for_ack(broken) == {"envelope_id": broken}
    await asyncio.sleep(0.3)
    assert gateway.store.count_inbox("done") == rows


async def test_assistant_thread_gets_prompts_and_a_status_set_then_cleared(tmp_path, fake_slack, fake_openai,
                                                                          running):
    fake_openai.reset()
    fake_openai.script(oa.DelayedReply(1.2, oa.text("Here you are.")))  # long enough for the indicator
    config = gateway_config(tmp_path, fake_openai, fake_slack=fake_slack,
                            slack={"assistant": True, "suggested_prompts": ["What can you do?", "Plan my day"]})
    gateway = await start_gateway(config, running)
    statuses = len(fake_slack.statuses)

    started = fake_slack.assistant_thread_started()
    thread = started["assistant_thread"]["thread_ts"]
    assert (await fake_slack.post_event(events_url(gateway), started)).status == 200
    await wait_until(lambda: (DM, thread) in fake_slack.prompts, what="suggested prompts")
    assert [p["message"] for p in fake_slack.prompts[(DM, thread)]["prompts"]] == ["What can you do?", "Plan my day"]

    ask = {"type": "message", "user": ALICE, "text": "Plan my day", "ts": "1735730000.000200", "channel": DM,
           "channel_type": "im", "thread_ts": thread, "team": fake_slack.team_id}
    assert (await fake_slack.post_event(events_url(gateway), ask)).status == 200
    reply = await fake_slack.wait_for_call("chat.postMessage", lambda c: c.params.get("thread_ts") == thread,
                                           timeout=10)
    assert reply.params["text"] == "Here you are."
    await wait_until(lambda: fake_slack.statuses[statuses:][-1:] == [(DM, thread, "")], what="status cleared")
    seen = fake_slack.statuses[statuses:]
    assert seen[0] == (DM, thread, "is thinking…") and seen[-1] == (DM, thread, "")
    assert all(c.params["timestamp"] != ask["ts"] for c in fake_slack.calls("reactions.add"))  # status instead

    # Where the workspace has no assistant surface, the reaction stands in for the status.
    fake_slack.assistant_surface = False
    try:
        fake_openai.script(oa.DelayedReply(1.2, oa.text("Again.")))
        again = {**ask, "text": "and tomorrow?", "ts": "1735730000.000400"}
        assert (await fake_slack.post_event(events_url(gateway), again)).status == 200
        await fake_slack.wait_for_call("reactions.add", lambda c: c.params["timestamp"] == again["ts"], timeout=10)
        await fake_slack.wait_for_call("reactions.remove", lambda c: c.params["timestamp"] == again["ts"], timeout=10)
    finally:
        fake_slack.assistant_surface = True


STREAM_FAST = {"stream_first_after_s": 0.2, "stream_edit_interval_s": {"slack": 0.3}}


def mention(text: str, ts: str) -> dict:
    return {"type": "app_mention", "user": ALICE, "text": f"<@U0BOT00001> {text}", "ts": ts, "channel": CHANNEL,
            "event_ts": ts, "team": "T0FAKE0001"}


def since(fake: FakeSlack, method: str, count: int) -> list:
    return fake.calls(method)[count:]


async def test_a_thread_reply_streams_natively_and_falls_back_to_chat_update(tmp_path, fake_slack, fake_openai,
                                                                            running):
    fake_openai.reset()
    final = "Incident summary: the **database** failed over at 09:12 and was back by 09:40."
    fake_openai.script(oa.text(final, pieces=10, piece_delay_s=0.15))
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai, fake_slack=fake_slack, agent=STREAM_FAST),
                                  running)
    counts = {m: len(fake_slack.calls(m)) for m in ("chat.startStream", "chat.appendStream", "chat.stopStream",
                                                    "chat.postMessage", "chat.update")}
    ts = "1735740000.000100"
    assert (await fake_slack.post_event(events_url(gateway), mention("summarise the incident", ts))).status == 200
    stop = await fake_slack.wait_for_call("chat.stopStream", timeout=15, since=len(fake_slack.calls()) - 1)
    (start,) = since(fake_slack, "chat.startStream", counts["chat.startStream"])
    assert start.params["thread_ts"] == ts and start.params["recipient_user_id"] == ALICE
    assert start.params["recipient_team_id"] == "T0FAKE0001" and stop.params["ts"] in fake_slack.channels[CHANNEL]
    assert since(fake_slack, "chat.appendStream", counts["chat.appendStream"])  # the text grew in place
    shown = fake_slack.channels[CHANNEL][stop.params["ts"]]
    assert shown["text"] == final and shown["streaming"] is False  # Markdown as written, Slack renders it
    assert since(fake_slack, "chat.postMessage", counts["chat.postMessage"]) == []
    assert since(fake_slack, "chat.update", counts["chat.update"]) == []
    await wait_until(lambda: gateway.store.outbox_counts().get("sent") == 1, what="reply settled")

    # A workspace without the stream methods: the preview is a post edited with chat.update.
    fake_slack.streaming_methods = False
    try:
        fake_openai.script(oa.text(final, pieces=10, piece_delay_s=0.15))
        posted = len(fake_slack.calls("chat.postMessage"))
        ts2 = "1735740000.000500"
        assert (await fake_slack.post_event(events_url(gateway), mention("again please", ts2))).status == 200
        await wait_until(lambda: any(m["text"] == final.replace("**", "*") for m in fake_slack.posted(CHANNEL, ts2)),
                         timeout=15, what="final edit")
        posts = [c for c in fake_slack.calls("chat.postMessage")[posted:] if c.params.get("thread_ts") == ts2]
        assert len(posts) == 1 and [m["text"] for m in fake_slack.posted(CHANNEL, ts2)] == [final.replace("**", "*")]
    finally:
        fake_slack.streaming_methods = True
