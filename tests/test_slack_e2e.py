"""End to end through the real slack-bolt / slack-sdk and openai clients against loopback fakes:
signed Events API posts (and Socket Mode frames) reach the agent, replies come back as mrkdwn in
the right channel and thread, and retries, duplicates and forged requests produce no turn."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from typing import Any

from PIL import Image

from gateway.app.gateway import Gateway
from tests.conftest import FIXTURES, fixture, gateway_config, start_gateway
from tests.fakes import openai as oa
from tests.fakes.slack import FakeSlack, post_interaction
from tests.helpers import wait_until

CHANNEL, DM = "C0GENERAL1", "D0ALICE001"
MENTION_TS = "1735689660.000200"  # channel_app_mention.json: a top-level mention, answered in its thread




def raw(name: str) -> bytes:
    """A fixture's exact bytes (the signature covers them)."""
    return (FIXTURES / "slack" / name).read_bytes()


def events_url(gateway: Gateway) -> str:
    return f"http://127.0.0.1:{gateway.http_port}/slack/events"


def message(text: str, ts: str, *, channel: str = DM, user: str = "U0ALICE001", **extra: Any) -> dict[str, Any]:
    channel_type = "im" if channel.startswith("D") else "channel"
    return {"type": "message", "user": user, "text": text, "ts": ts, "channel": channel,
            "channel_type": channel_type, "event_ts": ts, "team": "T0FAKE0001", **extra}


def posts(fake: FakeSlack, since: int, channel: str) -> list:
    return [c for c in fake.calls("chat.postMessage")[since:] if c.params["channel"] == channel]


def inbox_total(gateway: Gateway) -> int:
    return sum(gateway.store.count_inbox(status) for status in ("pending", "done", "failed"))


async def test_dm_is_answered_in_the_dm(tmp_path, fake_slack, fake_openai, running):
    fake_openai.reset()
    fake_openai.script(oa.DelayedReply(1.2, oa.text("Standup: **shipped** the inbox.")))  # > typing delay
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai, fake_slack=fake_slack), running)
    since = len(fake_slack.calls("chat.postMessage"))

    delivery = await fake_slack.post_event(events_url(gateway), raw("dm_message.json"))
    assert delivery.status == 200 and delivery.latency < 3.0
    call = await fake_slack.wait_for_call("chat.postMessage", lambda c: c.params["channel"] == DM, timeout=10)

    assert call.params["text"] == "Standup: *shipped* the inbox."
    assert "thread_ts" not in call.params  # DMs are answered top level
    assert len(posts(fake_slack, since, DM)) == 1
    user_turn = fake_openai.requests[0]["json"]["messages"][-1]["content"]
    assert user_turn.endswith("Hi! Can you summarise yesterday's standup?") and "from " not in user_turn
    # The indicator: a reaction on the user's message while the turn ran, removed after the reply.
    await fake_slack.wait_for_call("reactions.add", lambda c: c.params["timestamp"] == "1735689600.000100")
    await fake_slack.wait_for_call("reactions.remove", lambda c: c.params["timestamp"] == "1735689600.000100")
    assert fake_slack.reactions[(DM, "1735689600.000100")] == set()

    # A file shared in the DM: the model gets the image (downloaded with the bot token), in the
    # same conversation.
    fake_openai.script(oa.text("It shows the architecture."))
    share = json.loads(raw("dm_file_share.json"))
    picture = io.BytesIO()
    Image.new("RGB", (1200, 800), (10, 120, 200)).save(picture, "PNG")
    share["event"]["files"] = [fake_slack.add_file("F0FAKEIMG1", picture.getvalue(), "image/png", "architecture.png")]
    assert (await fake_slack.post_event(events_url(gateway), share)).status == 200
    await wait_until(lambda: len(posts(fake_slack, since, DM)) == 2, what="reply to the file")
    file_turn = fake_openai.requests[-1]["json"]["messages"]
    assert [m["role"] for m in file_turn] == ["system", "user", "assistant", "user"]
    text = file_turn[-1]["content"][0]["text"]
    assert '[image "architecture.png" (image/png, ' in text and text.endswith("What does this diagram show?")
    assert len(oa.image_parts(fake_openai.requests[-1])) == 1


async def test_channel_mention_starts_a_thread_and_the_thread_continues(tmp_path, fake_slack, fake_openai, running):
    fake_openai.reset()
    fake_openai.responder = lambda req: oa.text(f"answer {len(req['messages'])}")
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai, fake_slack=fake_slack), running)
    url, since = events_url(gateway), len(fake_slack.calls("chat.postMessage"))
    lookups_before = len(fake_slack.calls("users.info"))

    assert (await fake_slack.post_event(url, raw("channel_app_mention.json"))).status == 200
    await wait_until(lambda: len(posts(fake_slack, since, CHANNEL)) == 1, what="reply to the mention")
    first = posts(fake_slack, since, CHANNEL)[0]
    assert first.params["thread_ts"] == MENTION_TS and first.params["text"] == "answer 2"
    mention_turn = fake_openai.requests[0]["json"]["messages"][-1]["content"]
    assert mention_turn.endswith("please summarise the incident thread") and "from Alice" in mention_turn
    assert "<@" not in mention_turn

    # The message.channels twin of the same post, and Slack's retry of the app_mention: no new turn.
    assert (await fake_slack.post_event(url, raw("channel_message_with_mention.json"))).status == 200
    retry = await fake_slack.post_event(url, raw("channel_app_mention_retry.json"), retry_num=1)
    assert retry.status == 200
    await wait_until(lambda: gateway.duplicates == 2, what="both duplicates seen")

    # A follow-up in the thread without a mention joins the same session and is answered there.
    follow_up = message("and who fixed it?", "1735689700.000900", channel=CHANNEL, user="U0BOB00001",
                        thread_ts=MENTION_TS, parent_user_id="U0ALICE001")
    assert (await fake_slack.post_event(url, follow_up)).status == 200
    await wait_until(lambda: len(posts(fake_slack, since, CHANNEL)) == 2, what="thread reply")
    second = posts(fake_slack, since, CHANNEL)[1]
    assert second.params["thread_ts"] == MENTION_TS
    history = fake_openai.requests[-1]["json"]["messages"]
    assert [m["role"] for m in history] == ["system", "user", "assistant", "user"]
    assert history[1]["content"] == mention_turn and history[2]["content"] == "answer 2"
    assert history[3]["content"].endswith("and who fixed it?") and "from Bob" in history[3]["content"]

    # Names come from users.info once per user (cached), not once per message.
    looked_up = [c.params["user"] for c in fake_slack.calls("users.info")[lookups_before:]]
    assert sorted(looked_up) == ["U0ALICE001", "U0BOB00001"]

    # A thread the bot is not part of, the bot's own message, an edit and an event type the adapter
    # has no use for: acknowledged with 200 (Bolt would answer 404 without a listener), no turn.
    stranger = message("unrelated chatter", "1735689800.000950", channel=CHANNEL, thread_ts="1735680000.000001")
    reaction = {"type": "reaction_added", "user": "U0ALICE001", "reaction": "tada", "event_ts": "1735689801.1",
                "item": {"type": "message", "channel": CHANNEL, "ts": MENTION_TS}}
    for body in (stranger, raw("bot_own_message.json"), raw("message_changed.json"), reaction):
        assert (await fake_slack.post_event(url, body)).status == 200
    await asyncio.sleep(0.4)
    assert len(posts(fake_slack, since, CHANNEL)) == 2
    assert len(fake_openai.requests) == 2
    assert inbox_total(gateway) == 2


async def test_forged_requests_get_401_and_store_nothing(tmp_path, fake_slack, fake_openai, running, caplog):
    fake_openai.reset()
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai, fake_slack=fake_slack), running)
    url = events_url(gateway)
    caplog.set_level(logging.INFO, logger="adapters.slack")

    reasons = {"bad_signature": "signature mismatch", "altered": "signature mismatch",
               "stale": "outside the 5-minute window", "unsigned": "missing X-Slack-Request-Timestamp"}
    for index, (probe, reason) in enumerate(reasons.items()):
        caplog.clear()
        event = message(f"forged {probe}", f"1735690000.00{index:04d}")
        delivery = await fake_slack.post_event(url, event, probe=probe)
        assert delivery.status == 401, probe
        assert reason in caplog.text, (probe, caplog.text)
        assert fake_slack.signing_secret not in caplog.text
    await asyncio.sleep(0.2)
    assert inbox_total(gateway) == 0 and gateway.received == 0
    assert fake_openai.requests == []

    for body in (b"{not json", b'{"type": "event_callback", "event": "x"}', b"[]"):
        malformed = await fake_slack.post_event(url, body)  # correctly signed, but not an event: acked, not retried
        assert (malformed.status, malformed.headers.get("X-Slack-No-Retry")) == (200, "1")
    assert inbox_total(gateway) == 0

    challenge = await fake_slack.post_event(url, raw("url_verification.json"))
    assert challenge.status == 200
    assert fixture("slack", "expected.json")["url_verification.json"]["http_response"]["json"]["challenge"] \
        in challenge.body


async def test_signed_bodies_the_gateway_does_not_handle_are_acknowledged_not_retried(tmp_path, fake_slack, fake_openai,
                                                                                       running, caplog):
    """Slack counts every non-2xx answer as a failed delivery, retries it, and disables an app's
    event subscriptions when too many fail (Events API: "Responding to events"). An authentic body
    the gateway has no use for (an ``app_rate_limited`` notice, an interaction type it never asked
    for, a view payload Bolt's own matchers cannot read) is answered 200 with ``X-Slack-No-Retry: 1``
    and logged, never 404 or 500, and stores nothing."""
    fake_openai.reset()
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai, fake_slack=fake_slack), running)
    url = events_url(gateway)
    caplog.set_level(logging.INFO, logger="adapters.slack")
    notices = [{"token": "x", "team_id": "T0TEAM0001", "minute_rate_limited": 1735690000,
                "api_app_id": "A0APP00001", "type": "app_rate_limited"}, {"type": "something_new"}]
    for body in notices:
        delivery = await fake_slack.post_event(url, json.dumps(body).encode())
        assert (delivery.status, delivery.headers.get("X-Slack-No-Retry")) == (200, "1"), (body, delivery)
    user, channel = {"id": "U0ALICE001"}, {"id": DM}
    interactions = [
        {"type": "view_submission", "user": user, "view": {"id": "V1"}},
        {"type": "view_closed", "user": user, "view": {"id": "V1"}},
        {"type": "shortcut", "user": user, "callback_id": "x"},
        {"type": "message_action", "user": user, "channel": channel, "callback_id": "x"},
        {"type": "block_suggestion", "user": user, "action_id": "x"},
        {"type": "block_actions", "user": user, "channel": channel, "actions": []},
        {"type": "block_actions", "user": user, "channel": channel, "actions": [{"type": "static_select"}]},
    ]
    for payload in interactions:
        caplog.clear()
        delivery = await post_interaction(fake_slack, url, payload)
        assert (delivery.status, delivery.headers.get("X-Slack-No-Retry")) == (200, "1"), (payload, delivery)
        assert "Traceback" not in caplog.text and "ERROR" not in caplog.text, caplog.text
    await asyncio.sleep(0.2)
    assert inbox_total(gateway) == 0 and fake_openai.requests == []


async def test_rate_limited_post_is_retried_after_retry_after(tmp_path, fake_slack, fake_openai, running):
    fake_openai.reset()
    fake_openai.script(oa.text("after the rate limit"))
    await start_gateway(gateway_config(tmp_path, fake_openai, fake_slack=fake_slack), running)
    since = len(fake_slack.calls("chat.postMessage"))
    fake_slack.fail_next("chat.postMessage", "ratelimited", retry_after=1)

    gateway = running[-1]
    assert (await fake_slack.post_event(events_url(gateway), message("hi", "1735690100.000100"))).status == 200
    await wait_until(lambda: len(posts(fake_slack, since, DM)) == 2, what="retried post")
    await asyncio.sleep(0.3)
    calls = posts(fake_slack, since, DM)
    assert len(calls) == 2 and calls[1].time - calls[0].time >= 0.9
    assert [m["text"] for m in fake_slack.posted(DM) if m["text"] == "after the rate limit"] == [
        "after the rate limit"]


async def test_markdown_reply_arrives_as_valid_mrkdwn(tmp_path, fake_slack, fake_openai, running):
    fake_openai.reset()
    rows = "\n".join(f"| item {i} | {i * 3} | ok & fine |" for i in range(120))
    reply = (
        "## Summary\n\nSee [the docs](https://example.com/docs?a=1&b=2) and **note** this:\n\n"
        "```python\nif a < b:\n    print('x')\n```\n\n"
        f"| Name | Qty | Note |\n|---|--:|---|\n{rows}\n\n- done\n- *next*"
    )
    fake_openai.script(oa.text(reply))
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai, fake_slack=fake_slack), running)
    since = len(fake_slack.calls("chat.postMessage"))
    mention = {"type": "app_mention", "user": "U0ALICE001", "text": "<@U0BOT00001> report please",
               "ts": "1735690200.000100", "channel": CHANNEL, "event_ts": "1735690200.000100"}
    assert (await fake_slack.post_event(events_url(gateway), mention)).status == 200

    await wait_until(lambda: any("- *next*" in c.params["text"] or "• _next_" in c.params["text"]
                                 for c in posts(fake_slack, since, CHANNEL)), what="last part")
    calls = posts(fake_slack, since, CHANNEL)
    assert len(calls) >= 2  # the table is longer than one message
    stored = fake_slack.posted(CHANNEL, "1735690200.000100")
    assert len(stored) == len(calls)
    for call, msg in zip(calls, stored, strict=True):
        assert call.params["thread_ts"] == "1735690200.000100"
        assert len(call.params["text"]) <= 3900
        assert msg["mrkdwn_problems"] == [], msg["text"][:200]
    text = "\n".join(c.params["text"] for c in calls)
    assert text.startswith("*Summary*\n\nSee <https://example.com/docs?a=1&amp;b=2|the docs> and *note* this:")
    assert "```\nif a &lt; b:\n    print('x')\n```" in text
    assert "Name     | Qty | Note" in text and "item 119 | 357 | ok &amp; fine" in text
    assert text.endswith("• done\n• _next_")


async def test_socket_mode_event_is_acked_and_answered(tmp_path, fake_slack, fake_openai, running):
    fake_openai.reset()
    fake_openai.responder = lambda req: oa.text("root cause: a full disk")
    config = gateway_config(tmp_path, fake_openai, fake_slack=fake_slack, slack={"mode": "socket"})
    opened = len(fake_slack.calls("apps.connections.open"))
    gateway = await start_gateway(config, running)
    assert gateway.adapters["slack"].routes() == []
    await wait_until(lambda: fake_slack.socket_clients == 1, what="socket connection")
    # The app token is checked at start with the call that opens the first connection (Tier 1).
    assert len(fake_slack.calls("apps.connections.open")) - opened == 1
    since = len(fake_slack.calls("chat.postMessage"))

    frame = fixture("slack", "socket_mode_app_mention.json")
    envelope_id = fake_slack.push(frame)
    assert await fake_slack.wait_for_ack(envelope_id) == {"envelope_id": "fake-envelope-0001"}
    await wait_until(lambda: len(posts(fake_slack, since, CHANNEL)) == 1, what="socket reply")
    call = posts(fake_slack, since, CHANNEL)[0]
    assert call.params["thread_ts"] == "1735689000.000050" and call.params["text"] == "root cause: a full disk"

    redelivered = fake_slack.push({**frame, "envelope_id": "fake-envelope-0002", "retry_attempt": 1,
                                   "retry_reason": "timeout"})
    await fake_slack.wait_for_ack(redelivered)
    await wait_until(lambda: gateway.duplicates == 1, what="redelivery deduped")
    await asyncio.sleep(0.3)
    assert len(posts(fake_slack, since, CHANNEL)) == 1


async def test_event_is_not_acknowledged_until_stored(tmp_path, fake_slack, fake_openai, running):
    fake_openai.reset()
    fake_openai.responder = lambda req: oa.text("stored at last")
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai, fake_slack=fake_slack), running)
    since = len(fake_slack.calls("chat.postMessage"))
    insert = gateway.store.insert_inbound_in
    failures = []

    def failing_once(*args: Any, **kwargs: Any) -> None:
        if not failures:
            failures.append(args)
            raise OSError("disk full")
        insert(*args, **kwargs)

    gateway.store.insert_inbound_in = failing_once  # the inbox write fails once
    event = message("are you there?", "1735690300.000100")
    first = await fake_slack.post_event(events_url(gateway), event)
    assert first.status == 500  # not acknowledged: Slack will deliver it again
    assert inbox_total(gateway) == 0
    again = await fake_slack.post_event(events_url(gateway), event, retry_num=1, retry_reason="http_error")
    assert again.status == 200
    await wait_until(lambda: len(posts(fake_slack, since, DM)) == 1, what="reply after redelivery")
    assert posts(fake_slack, since, DM)[0].params["text"] == "stored at last"


async def test_a_failing_auth_test_after_start_loses_no_event(tmp_path, fake_slack, fake_openai, running):
    """Bolt's own authorization called ``auth.test`` again on a process's first request and, when
    Slack answered it 5xx or 429, acknowledged the event with a "reinstall" text and stored nothing
    (over HTTP and Socket Mode; found by a review). The identity read at start serves every request."""
    fake_openai.reset()
    fake_openai.responder = lambda req: oa.text("still here")
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai, fake_slack=fake_slack), running)
    tests_before = len(fake_slack.calls("auth.test"))
    fake_slack.fail_next("auth.test", "internal_error", status=500)
    try:
        delivery = await fake_slack.post_event(events_url(gateway), message("anyone home?", "1735690400.000100"))
        assert delivery.status == 200 and inbox_total(gateway) == 1
        await fake_slack.wait_for_call("chat.postMessage", lambda c: c.params["text"] == "still here", timeout=10)
        assert len(fake_slack.calls("auth.test")) == tests_before  # no call on the request's way
    finally:
        fake_slack.clear_faults("auth.test")


async def test_a_failing_auth_test_after_start_loses_no_socket_mode_event(tmp_path, fake_slack, fake_openai, running):
    fake_openai.reset()
    fake_openai.responder = lambda req: oa.text("socket still here")
    config = gateway_config(tmp_path, fake_openai, fake_slack=fake_slack, slack={"mode": "socket"})
    gateway = await start_gateway(config, running)
    await wait_until(lambda: fake_slack.socket_clients == 1, what="socket connection")
    fake_slack.fail_next("auth.test", "ratelimited", retry_after=1)
    try:
        envelope_id = fake_slack.push(event=message("over the socket?", "1735690500.000100"))
        assert await fake_slack.wait_for_ack(envelope_id) == {"envelope_id": envelope_id}
        await wait_until(lambda: inbox_total(gateway) == 1, what="the event stored")
        await fake_slack.wait_for_call("chat.postMessage", lambda c: c.params["text"] == "socket still here",
                                       timeout=10)
    finally:
        fake_slack.clear_faults("auth.test")
