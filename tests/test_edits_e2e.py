"""Edits and deletions never start a turn or re-run a command, on every platform, end to end through
the real SDKs (python-telegram-bot, slack-bolt, lark-oapi) against the loopback fakes.

Each test first gets one real message answered, then sends the platform's edit/delete/bookkeeping
events, then a last real message; the platform handles events in order (polling) or answers each
request only after handling it (webhooks), so once the last message is answered every earlier event
has been handled and the counts below are final."""

from __future__ import annotations

import copy
from typing import Any

from gateway.app.gateway import Gateway
from tests.conftest import fixture, gateway_config, start_gateway
from tests.fakes import openai as oa
from tests.helpers import wait_until

SLACK_DM, SLACK_CHANNEL, SLACK_BOT, SLACK_BOT_ID = "D0ALICE001", "C0GENERAL1", "U0BOT00001", "B0BOT00001"


def inbox_total(gateway: Gateway) -> int:
    return sum(gateway.store.count_inbox(status) for status in ("pending", "done", "failed"))


# ---- Telegram -------------------------------------------------------------------------------------

def tg_message(text: str, message_id: int, chat_id: int, *, command: bool = False) -> dict[str, Any]:
    message = copy.deepcopy(fixture("telegram", "dm_text.json")["message"])
    message.update(message_id=message_id, text=text)
    message["from"]["id"] = message["chat"]["id"] = chat_id
    if command:
        message["entities"] = [{"type": "bot_command", "offset": 0, "length": len(text.split()[0])}]
    return message


def tg_texts(fake, chat_id: int) -> list[str]:
    return [c.params["text"] for c in fake.calls("sendMessage") if int(c.params["chat_id"]) == chat_id]


async def test_telegram_edits_never_start_a_turn_or_rerun_a_command(tmp_path, fake_telegram, fake_openai, running):
    fake_openai.reset()
    fake_openai.responder = lambda req: oa.text(f"answer {len(fake_openai.requests)}")
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai, fake_telegram), running)
    chat = 5557001
    hello, new = tg_message("hello", 7001, chat), tg_message("/new", 7002, chat, command=True)
    fake_telegram.inject({"message": hello})
    fake_telegram.inject({"message": new})
    await wait_until(lambda: len(tg_texts(fake_telegram, chat)) == 2, what="answer and /new")
    assert tg_texts(fake_telegram, chat)[1].startswith("Started a new conversation")

    edited = [
        {**hello, "text": "hello, edited", "edit_date": hello["date"] + 60},
        {**new, "text": "/new", "edit_date": new["date"] + 60},  # an edited command is not run again
        # an edit that turns a message the bot never saw into a command
        {**tg_message("/status", 7003, chat, command=True), "edit_date": hello["date"] + 90},
    ]
    for message in edited:
        fake_telegram.inject({"edited_message": message})
    group_edit = fixture("telegram", "group_edited_message.json")  # now mentions the bot
    group_edit.pop("update_id")
    fake_telegram.inject(group_edit)
    channel = {"message_id": 9, "chat": {"id": -1009000000001, "type": "channel", "title": "News"},
               "date": hello["date"], "edit_date": hello["date"] + 5, "text": "@gateway_test_bot edited post",
               "entities": [{"type": "mention", "offset": 0, "length": 17}]}
    fake_telegram.inject({"edited_channel_post": channel})

    fake_telegram.inject({"message": tg_message("last one", 7004, chat)})
    await wait_until(lambda: len(tg_texts(fake_telegram, chat)) == 3, what="the last answer")
    assert len(fake_openai.requests) == 2 and inbox_total(gateway) == 3
    assert not [c for c in fake_telegram.calls("sendMessage") if int(c.params["chat_id"]) in (-4000000001,
                                                                                                 -1009000000001)]
    assert fake_telegram.confirmed_offset > 0  # the ignored updates were confirmed, not redelivered forever


# ---- Slack ----------------------------------------------------------------------------------------

def slack_url(gateway: Gateway) -> str:
    return f"http://127.0.0.1:{gateway.http_port}/slack/events"


def slack_message(text: str, ts: str, channel: str = SLACK_DM, **extra: Any) -> dict[str, Any]:
    return {"type": "message", "user": "U0ALICE001", "text": text, "ts": ts, "channel": channel,
            "channel_type": "im" if channel.startswith("D") else "channel", "event_ts": ts, "team": "T0FAKE0001",
            **extra}


def changed(channel: str, new: dict[str, Any], previous: dict[str, Any], ts: str) -> dict[str, Any]:
    """A ``message_changed`` event (Slack: message/message_changed; ``hidden``, the new and old message)."""
    return {"type": "message", "subtype": "message_changed", "hidden": True, "channel": channel, "ts": ts,
            "event_ts": ts, "channel_type": "im" if channel.startswith("D") else "channel",
            "message": new, "previous_message": previous}


def slack_posts(fake, since: int) -> list:
    return fake.calls("chat.postMessage")[since:]


async def test_slack_edits_deletions_and_bookkeeping_never_start_a_turn(tmp_path, fake_slack, fake_openai, running):
    fake_openai.reset()
    fake_openai.responder = lambda req: oa.text(f"answer {len(fake_openai.requests)}")
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai, fake_slack=fake_slack), running)
    url, since = slack_url(gateway), len(fake_slack.calls("chat.postMessage"))

    first = slack_message("look at https://example.com/report", "1735700000.000100")
    assert (await fake_slack.post_event(url, first)).status == 200
    mention = fixture("slack", "channel_app_mention.json")
    mention["event_id"] = "Ev0EDITS00001"
    assert (await fake_slack.post_event(url, mention)).status == 200
    await wait_until(lambda: len(slack_posts(fake_slack, since)) == 2, what="two answers")
    bot_reply = slack_posts(fake_slack, since)[0]
    reply_ts = fake_slack.posted(SLACK_DM)[-1]["ts"]
    stored = inbox_total(gateway)

    bare = {k: v for k, v in first.items() if k not in ("channel", "channel_type", "event_ts")}
    plain = slack_message("hello all", "1735700000.000300", SLACK_CHANNEL)  # never addressed, never stored
    edited_mention = {**plain, "type": "app_mention", "text": f"<@{SLACK_BOT}> hello all",
                      "edited": {"user": "U0ALICE001", "ts": "1735700050.000000"}}
    bot_own = {"type": "message", "user": SLACK_BOT, "bot_id": SLACK_BOT_ID, "text": "answer 1, streaming",
               "ts": reply_ts, "edited": {"user": SLACK_BOT, "ts": "1735700001.000000"}}
    events = [
        # a link unfurl edits the user's message (attachments added, text unchanged)
        changed(SLACK_DM, {**bare, "attachments": [{"from_url": "https://example.com/report", "title": "Report"}]},
                bare, "1735700001.000200"),
        # the bot's own streaming edit of its reply
        changed(SLACK_DM, bot_own, {**bot_own, "text": "answer"}, "1735700001.000300"),
        # the user edits the mention (the fixture: text extended)
        fixture("slack", "message_changed.json"),
        # a message edited to add a mention: Slack sends app_mention again, with "edited"
        edited_mention,
        changed(SLACK_CHANNEL, {**{k: v for k, v in edited_mention.items() if k not in ("channel", "channel_type")},
                                "type": "message"}, plain, "1735700050.000400"),
        # thread bookkeeping: the parent's reply count changes when someone answers in its thread
        {"type": "message", "subtype": "message_replied", "hidden": True, "channel": SLACK_CHANNEL,
         "channel_type": "channel", "ts": "1735700060.000500", "event_ts": "1735700060.000500",
         "message": {"type": "message", "user": "U0ALICE001", "text": mention["event"]["text"],
                     "ts": mention["event"]["ts"], "thread_ts": mention["event"]["ts"], "reply_count": 1,
                     "replies": [{"user": SLACK_BOT, "ts": bot_reply.params.get("thread_ts") or reply_ts}]}},
        # deletions of the user's message and of the bot's reply
        {"type": "message", "subtype": "message_deleted", "hidden": True, "channel": SLACK_DM, "channel_type": "im",
         "ts": "1735700070.000600", "event_ts": "1735700070.000600", "deleted_ts": first["ts"],
         "previous_message": bare},
        {"type": "message", "subtype": "message_deleted", "hidden": True, "channel": SLACK_DM, "channel_type": "im",
         "ts": "1735700071.000700", "event_ts": "1735700071.000700", "deleted_ts": reply_ts,
         "previous_message": bot_own},
    ]
    for event in events:
        delivery = await fake_slack.post_event(url, event)
        assert delivery.status == 200, (event.get("subtype") or event["type"], delivery.body)
    assert inbox_total(gateway) == stored  # acknowledged and stored nothing

    assert (await fake_slack.post_event(url, slack_message("and now?", "1735700100.000800"))).status == 200
    await wait_until(lambda: len(slack_posts(fake_slack, since)) == 3, what="the last answer")
    assert len(fake_openai.requests) == 3 and inbox_total(gateway) == stored + 1
    assert [c.params["text"] for c in slack_posts(fake_slack, since)][2] == "answer 3"


# ---- Feishu ---------------------------------------------------------------------------------------

def feishu_url(gateway: Gateway) -> str:
    return f"http://127.0.0.1:{gateway.http_port}/feishu/events"


def recalled(fake, message_id: str, chat_id: str) -> dict[str, Any]:
    body = fixture("feishu", "message_recalled.json")
    body["header"]["event_id"] = f"recall-{message_id}"
    body["event"].update(message_id=message_id, chat_id=chat_id)
    return body


async def test_feishu_recalls_never_start_a_turn(tmp_path, fake_feishu, fake_openai, running):
    fake_openai.reset()
    fake_openai.responder = lambda req: oa.text(f"answer {len(fake_openai.requests)}")
    fake_feishu.reset()
    config = gateway_config(tmp_path, fake_openai, fake_feishu=fake_feishu)
    gateway = await start_gateway(config, running)
    chat, url = "oc_recall0000000000000000000000001", feishu_url(gateway)
    first = fake_feishu.text_event("hello", chat_id=chat, message_id="om_recall0001")
    assert (await fake_feishu.post_event(url, first))[0] == 200
    await wait_until(lambda: len(fake_feishu.sent(chat)) == 1, what="the first answer")
    bot_message = fake_feishu.sent(chat)[0]["message_id"]

    for body in (recalled(fake_feishu, "om_recall0001", chat), recalled(fake_feishu, bot_message, chat),
                 recalled(fake_feishu, "om_recall0002", chat)):  # a message the bot never saw
        assert await fake_feishu.post_event(url, body) == (200, {"msg": "success"})
    assert inbox_total(gateway) == 1

    assert (await fake_feishu.post_event(url, fake_feishu.text_event("again", chat_id=chat)))[0] == 200
    await wait_until(lambda: len(fake_feishu.sent(chat)) == 2, what="the last answer")
    assert len(fake_openai.requests) == 2 and inbox_total(gateway) == 2


async def test_feishu_recall_over_the_long_connection_is_acked_and_ignored(tmp_path, fake_feishu, fake_openai,
                                                                          running):
    fake_openai.reset()
    fake_openai.responder = lambda req: oa.text("over ws")
    fake_feishu.reset()
    config = gateway_config(tmp_path, fake_openai, fake_feishu=fake_feishu, feishu={"mode": "websocket"})
    gateway = await start_gateway(config, running)
    await fake_feishu.wait_ws_connected()
    chat = "oc_recallws00000000000000000000001"
    assert (await fake_feishu.ws_push(fake_feishu.text_event("hi", chat_id=chat, message_id="om_rws1")))["code"] == 200
    await wait_until(lambda: len(fake_feishu.sent(chat)) == 1, what="the answer")
    assert (await fake_feishu.ws_push(recalled(fake_feishu, "om_rws1", chat)))["code"] == 200
    assert inbox_total(gateway) == 1 and len(fake_openai.requests) == 1
