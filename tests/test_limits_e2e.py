"""Usage limits and ``/usage`` end to end: python-telegram-bot against the fake Telegram, the openai
client against the fake model reporting usage (cached prompt tokens included). A user over a limit
gets one reply saying when it resets and the model is not asked (requests counted in the fake);
``/usage`` shows exactly the figures the fake reported."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from sqlalchemy import select

from agent.delegate import CHILD_PROMPT
from gateway.store.models import InboxRow, OutboxRow, UsageRow
from tests.conftest import gateway_config, start_gateway
from tests.fakes import openai as oa
from tests.helpers import wait_until
from tests.test_memory_owners_e2e import tg_group_mention
from tests.test_telegram_e2e import dm_update, sends_to

PRICE = {"input": 10.0, "cached_input": 1.0, "output": 100.0}  # USD per 1M tokens
STEP = oa.usage(1500, 20, cached_tokens=1000)  # $ (500*10 + 1000*1 + 20*100) / 1M = $0.0080


def command(text: str, message_id: int, user_id: int) -> dict:
    update = dm_update(text, message_id, user_id=user_id)
    update["message"]["entities"] = [{"type": "bot_command", "offset": 0, "length": len(text.split()[0])}]
    return update


def texts(fake, chat_id: int) -> list[str]:
    return [c.params["text"] for c in sends_to(fake, chat_id)]


def statuses(gateway, chat_id: int) -> list[str]:
    with gateway.engine.connect() as conn:
        rows = conn.execute(select(InboxRow.status, InboxRow.payload).order_by(InboxRow.id)).all()
    return [r.status for r in rows if str(chat_id) in str(r.payload)]


def outbox_texts(gateway, chat_id: int) -> list[str]:
    with gateway.engine.connect() as conn:
        rows = conn.execute(select(OutboxRow.chat_key, OutboxRow.text).order_by(OutboxRow.id)).all()
    return [r.text for r in rows if r.chat_key.endswith(f":{chat_id}")]


def tomorrow_utc() -> str:
    return f"{(datetime.now(UTC) + timedelta(days=1)).date().isoformat()} 00:00 UTC"


async def test_over_the_daily_limit_one_reply_with_the_reset_and_no_model_request(
        tmp_path, fake_telegram, fake_openai, running):
    fake_openai.reset()
    fake_openai.responder = lambda request: oa.text("Paris.", usage=STEP)
    config = gateway_config(tmp_path, fake_openai, fake_telegram, agent={"prices": {"gpt-4o-mini": PRICE}},
                            limits={"user_daily_usd": 0.005})
    gateway = await start_gateway(config, running)
    chat = 5571001

    fake_telegram.inject(dm_update("capital of France?", 1, user_id=chat))
    await wait_until(lambda: texts(fake_telegram, chat) == ["Paris."], timeout=15, what="the first answer")
    assert len(fake_openai.requests) == 1  # $0.0080 spent: over the $0.0050 a day from now on

    fake_telegram.inject(dm_update("and of Spain?", 2, user_id=chat))
    await wait_until(lambda: len(texts(fake_telegram, chat)) == 2, timeout=15, what="the limit reply")
    limit_reply = texts(fake_telegram, chat)[1]
    assert limit_reply == ("💸 You have used today's budget ($0.0080 of $0.0050), so I did not answer. "
                           f"It resets at {tomorrow_utc()}."), limit_reply
    assert len(fake_openai.requests) == 1  # the model was not asked

    fake_telegram.inject(dm_update("hello??", 3, user_id=chat))  # still over: no second notice
    await wait_until(lambda: statuses(gateway, chat) == ["done", "limited", "limited"], timeout=15,
                     what="the third message refused")
    assert len(outbox_texts(gateway, chat)) == 2  # nothing queued for it (the turn's reply would be here)
    assert len(fake_openai.requests) == 1

    fake_telegram.inject(command("/usage", 4, chat))  # commands still answer over the limit
    await wait_until(lambda: len(texts(fake_telegram, chat)) == 3, timeout=15, what="/usage")
    usage = texts(fake_telegram, chat)[2]
    today = datetime.now(UTC).date().isoformat()
    assert f"Today ({today}): $0.0080 · 1500 tokens in (1000 of them cached), 20 out · 1 model calls" in usage, usage
    assert f"This month ({today[:7]}): $0.0080 · 1500 tokens in (1000 of them cached), 20 out" in usage, usage
    assert "Limits: $0.0050 a day." in usage and f"$0.0050 a day: $0.0000 left, resets {tomorrow_utc()}" in usage
    assert "• gpt-4o-mini (default): $0.0080 · 1500 in (1000 cached), 20 out" in usage, usage
    assert "Everyone" not in usage  # not an admin
    assert len(fake_openai.requests) == 1


async def test_messages_per_minute_one_reply_for_a_flood(tmp_path, fake_telegram, fake_openai, running):
    fake_openai.reset()
    fake_openai.responder = lambda request: oa.text("ok", usage=oa.usage(100, 5))
    config = gateway_config(tmp_path, fake_openai, fake_telegram, limits={"user_messages_per_minute": 2})
    gateway = await start_gateway(config, running)
    chat = 5571002
    for number in range(1, 7):
        fake_telegram.inject(dm_update(f"message {number}", 100 + number, user_id=chat))
    await wait_until(lambda: len(statuses(gateway, chat)) == 6 and "pending" not in statuses(gateway, chat),
                     timeout=20, what="all six handled")
    assert statuses(gateway, chat).count("limited") == 4, statuses(gateway, chat)
    assert len(fake_openai.requests) == 2  # the two within the limit
    await wait_until(lambda: len(texts(fake_telegram, chat)) == 3, timeout=15, what="the replies")
    replies = texts(fake_telegram, chat)
    refusals = [t for t in replies if t.startswith("⏳")]
    assert len(refusals) == 1, replies  # one reply for the flood, not one per message
    assert re.fullmatch(r"⏳ You sent more than 2 messages in a minute, so I did not answer the last one\(s\)\. "
                        r"You can write again from \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC \(in \d+ s\)\.", refusals[0]), \
        refusals[0]
    assert len(outbox_texts(gateway, chat)) == 3  # nothing else queued
    wait_s = int(re.search(r"\(in (\d+) s\)", refusals[0]).group(1))
    assert 1 <= wait_s <= 60


async def test_chat_daily_limit_stops_everyone_in_the_group(tmp_path, fake_telegram, fake_openai, running):
    fake_openai.reset()
    fake_openai.responder = lambda request: oa.text("noted", usage=STEP)
    config = gateway_config(tmp_path, fake_openai, fake_telegram, agent={"prices": {"gpt-4o-mini": PRICE}},
                            limits={"chat_daily_usd": 0.005, "user_daily_usd": 1.0})
    gateway = await start_gateway(config, running)
    group, alice, bob = -4000000571, 5571011, 5571012
    fake_telegram.inject(tg_group_mention("plan the trip", 201, alice, "Alice", group))
    await wait_until(lambda: texts(fake_telegram, group) == ["noted"], timeout=15, what="Alice's answer")
    fake_telegram.inject(tg_group_mention("and the hotel?", 202, bob, "Bob", group))
    await wait_until(lambda: len(texts(fake_telegram, group)) == 2, timeout=15, what="the chat limit reply")
    assert texts(fake_telegram, group)[1] == ("💸 This chat has used today's budget ($0.0080 of $0.0050), so I did "
                                              f"not answer. It resets at {tomorrow_utc()}.")
    assert len(fake_openai.requests) == 1
    assert statuses(gateway, group) == ["done", "limited"]
    fake_telegram.inject(dm_update("hi in private", 203, user_id=bob))  # Bob's own DM is another chat
    await wait_until(lambda: texts(fake_telegram, bob) == ["noted"], timeout=15, what="Bob's DM answer")
    assert len(fake_openai.requests) == 2


async def test_admin_usage_shows_everyone(tmp_path, fake_telegram, fake_openai, running):
    fake_openai.reset()
    fake_openai.responder = lambda request: oa.text("sure", usage=STEP)
    admin, user = 5571021, 5571022
    config = gateway_config(tmp_path, fake_openai, fake_telegram, agent={"prices": {"gpt-4o-mini": PRICE}},
                            access={"admins": [f"telegram:{admin}"]})
    gateway = await start_gateway(config, running)
    fake_telegram.inject(dm_update("one", 301, user_id=user))
    fake_telegram.inject(dm_update("two", 302, user_id=user))
    await wait_until(lambda: texts(fake_telegram, user) == ["sure", "sure"], timeout=15, what="the user's answers")
    fake_telegram.inject(command("/usage", 303, user))
    await wait_until(lambda: len(texts(fake_telegram, user)) == 3, timeout=15, what="the user's /usage")
    assert "$0.0160 · 3000 tokens in (2000 of them cached), 40 out · 2 model calls" in texts(fake_telegram, user)[2]
    assert "Limits: none." in texts(fake_telegram, user)[2]

    fake_telegram.inject(command("/usage", 304, admin))
    await wait_until(lambda: len(texts(fake_telegram, admin)) == 1, timeout=15, what="the admin's /usage")
    shown = texts(fake_telegram, admin)[0]
    assert "Today" in shown and "$0.0000 · 0 tokens in (0 of them cached), 0 out · 0 model calls" in shown, shown
    assert "Everyone (you are an admin): today $0.0160, this month $0.0160." in shown, shown
    assert f"• telegram:{user} (Alice): today $0.0160, this month $0.0160 · 2 model calls" in shown, shown
    with gateway.engine.connect() as conn:
        rows = conn.execute(select(UsageRow.platform, UsageRow.provider, UsageRow.model, UsageRow.prompt_tokens,
                                   UsageRow.cached_tokens, UsageRow.completion_tokens, UsageRow.chat_key)).all()
    assert [tuple(r[:6]) for r in rows] == [("telegram", "default", "gpt-4o-mini", 1500, 1000, 20)] * 2
    assert all(r.chat_key.endswith(f":{user}") for r in rows)


async def test_sub_agent_calls_are_counted_for_the_user(tmp_path, fake_telegram, fake_openai, running):
    fake_openai.reset()
    parent, child, final = oa.usage(800, 10, cached_tokens=500), oa.usage(300, 30), oa.usage(900, 15, cached_tokens=800)

    def respond(request):
        messages = request["messages"]
        if messages[0]["content"] == CHILD_PROMPT:
            return oa.text("the child found 42", usage=child)
        if messages[-1]["role"] == "tool":
            return oa.text("It is 42.", usage=final)
        return oa.tool_calls(oa.call("delegate", {"task": "find the number"}), usage=parent)

    fake_openai.responder = respond
    config = gateway_config(tmp_path, fake_openai, fake_telegram, agent={"prices": {"gpt-4o-mini": PRICE}})
    gateway = await start_gateway(config, running)
    chat = 5571031
    fake_telegram.inject(dm_update("what is the number?", 401, user_id=chat))
    await wait_until(lambda: texts(fake_telegram, chat) == ["It is 42."], timeout=20, what="the answer")
    assert len(fake_openai.requests) == 3
    fake_telegram.inject(command("/usage", 402, chat))
    await wait_until(lambda: len(texts(fake_telegram, chat)) == 2, timeout=15, what="/usage")
    # (300*10 + 500*1 + 10*100) + (300*10 + 30*100) + (100*10 + 800*1 + 15*100) per 1M = $0.0138
    assert "$0.0138 · 2000 tokens in (1300 of them cached), 55 out · 3 model calls" in texts(fake_telegram, chat)[1]
    with gateway.engine.connect() as conn:
        keys = conn.execute(select(UsageRow.call_key).order_by(UsageRow.id)).scalars().all()
    assert len(keys) == 3 and len(set(keys)) == 3
