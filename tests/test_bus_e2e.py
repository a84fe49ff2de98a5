"""The durable bus end to end (real python-telegram-bot and openai clients, loopback fakes):
redelivery, one turn per session at a time, busy policies, /stop, rate-limit waits."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from sqlalchemy import select

from gateway.store.models import MessageRow
from tests.conftest import TEST_TOKEN, gateway_config, start_gateway
from tests.fakes import openai as oa
from tests.fakes.telegram import FakeTelegram
from tests.helpers import wait_until
from tests.test_telegram_e2e import dm_update, sends_to


@pytest.fixture
def fake_telegram() -> Iterator[FakeTelegram]:
    """A fresh Bot API fake per test: each test runs on SQLite and on PostgreSQL (``db_url``) with
    the same chat ids, so nothing recorded may carry over."""
    with FakeTelegram(token=TEST_TOKEN) as fake:
        yield fake


def on_db(tmp_path, db_url: str, fake_openai, fake_telegram, **sections):
    """The gateway config for this test's database (SQLite or PostgreSQL)."""
    return gateway_config(tmp_path, fake_openai, fake_telegram, database={"url": db_url}, **sections)


def texts(fake, chat_id: int) -> list[str]:
    return [c.params["text"] for c in sends_to(fake, chat_id)]


def last_user_text(request: dict) -> str:
    return next(m["content"] for m in reversed(request["messages"]) if m["role"] == "user").splitlines()[-1]


async def test_same_update_after_restart_is_answered_once(tmp_path, db_url, fake_telegram, fake_openai, running):
    fake_openai.reset()
    fake_openai.responder = lambda req: oa.text("hello once")
    config = on_db(tmp_path, db_url, fake_openai, fake_telegram)
    first = await start_gateway(config, running)
    update = dm_update("hi there", 7001, user_id=5552001)
    update["update_id"] = 930001
    fake_telegram.inject(update)
    await wait_until(lambda: len(sends_to(fake_telegram, 5552001)) == 1, what="first reply")
    await first.stop()
    running.remove(first)

    second = await start_gateway(config, running)
    fake_telegram.inject(dict(update))  # Telegram delivers the same update again after the restart
    await wait_until(lambda: second.duplicates == 1, what="duplicate dropped")
    await asyncio.sleep(0.3)
    assert texts(fake_telegram, 5552001) == ["hello once"]
    assert len(fake_openai.requests) == 1


async def test_queue_policy_runs_one_turn_at_a_time_in_order(tmp_path, db_url, fake_telegram, fake_openai, running):
    fake_openai.reset()
    fake_openai.responder = lambda req: oa.delay(0.4, oa.text(f"reply to {last_user_text(req)}"))
    gateway = await start_gateway(on_db(tmp_path, db_url, fake_openai, fake_telegram), running)
    fake_telegram.inject(dm_update("first", 7101, user_id=5552002))
    await asyncio.sleep(0.01)
    fake_telegram.inject(dm_update("second", 7102, user_id=5552002))
    await wait_until(lambda: len(sends_to(fake_telegram, 5552002)) == 2, what="two replies")

    assert texts(fake_telegram, 5552002) == ["reply to first", "reply to second"]
    first_req, second_req = fake_openai.requests
    assert second_req["time"] >= first_req["time"] + 0.39  # never two concurrent turns for one session
    with gateway.engine.connect() as conn:
        rows = conn.execute(select(MessageRow.role, MessageRow.content).order_by(MessageRow.id)).all()
    assert [(r.role, r.content) for r in rows] == [
        ("user", "first"), ("assistant", "reply to first"), ("user", "second"), ("assistant", "reply to second")]


async def test_merge_policy_answers_waiting_messages_in_one_turn(tmp_path, db_url, fake_telegram, fake_openai, running):
    fake_openai.reset()
    fake_openai.responder = lambda req: oa.delay(0.4, oa.text(
        "seen: " + ", ".join(m["content"].splitlines()[-1] for m in req["messages"] if m["role"] == "user")))
    config = on_db(tmp_path, db_url, fake_openai, fake_telegram, bus={"busy_policy": "merge"})
    await start_gateway(config, running)
    fake_telegram.inject(dm_update("one", 7201, user_id=5552003))
    await asyncio.sleep(0.15)
    fake_telegram.inject(dm_update("two", 7202, user_id=5552003))
    await asyncio.sleep(0.01)
    fake_telegram.inject(dm_update("three", 7203, user_id=5552003))
    await wait_until(lambda: len(sends_to(fake_telegram, 5552003)) == 2, what="two replies")
    await asyncio.sleep(0.5)
    assert texts(fake_telegram, 5552003) == ["seen: one", "seen: one, two, three"]
    assert len(fake_openai.requests) == 2


async def test_merge_policy_answers_a_waiting_command_alone(tmp_path, db_url, fake_telegram, fake_openai, running):
    """A command waiting among other messages is run as a command, never merged into the model's turn
    (it was: '/new' sent while a turn ran was dropped and the next message went on in the old
    conversation; '/link CODE' handed the code to the model)."""
    fake_openai.reset()
    fake_openai.responder = lambda req: oa.delay(0.4, oa.text(
        "seen: " + ", ".join(m["content"].splitlines()[-1] for m in req["messages"] if m["role"] == "user")))
    config = on_db(tmp_path, db_url, fake_openai, fake_telegram, bus={"busy_policy": "merge"})
    await start_gateway(config, running)
    fake_telegram.inject(dm_update("one", 7211, user_id=5552013))
    await wait_until(lambda: len(fake_openai.requests) == 1, what="first turn running")
    new = dm_update("/new", 7212, user_id=5552013)
    new["message"]["entities"] = [{"type": "bot_command", "offset": 0, "length": 4}]
    fake_telegram.inject(new)
    await asyncio.sleep(0.01)
    fake_telegram.inject(dm_update("two", 7213, user_id=5552013))
    await wait_until(lambda: len(sends_to(fake_telegram, 5552013)) == 3, what="three replies")
    assert texts(fake_telegram, 5552013) == [
        "seen: one", "Started a new conversation. The previous one is listed in /sessions.", "seen: two"]
    assert len(fake_openai.requests) == 2


async def test_stop_cancels_the_running_turn_and_nothing_from_it_is_sent(tmp_path, db_url, fake_telegram, fake_openai,
                                                                          running):
    fake_openai.reset()
    fake_openai.responder = lambda req: oa.delay(0.6, oa.text("the slow answer"))
    gateway = await start_gateway(on_db(tmp_path, db_url, fake_openai, fake_telegram), running)
    fake_telegram.inject(dm_update("think hard", 7301, user_id=5552004))
    await wait_until(lambda: len(fake_openai.requests) == 1, what="model called")
    stop = dm_update("/stop", 7302, user_id=5552004)
    stop["message"]["entities"] = [{"type": "bot_command", "offset": 0, "length": 5}]
    fake_telegram.inject(stop)
    await wait_until(lambda: texts(fake_telegram, 5552004) == ["Stopped."], what="stop confirmation")
    await asyncio.sleep(1.0)  # the model answers meanwhile; the answer must not be delivered
    assert texts(fake_telegram, 5552004) == ["Stopped."]
    statuses = sorted(r["status"] for r in gateway.store.outbox_rows())
    assert statuses == ["cancelled", "sent"]  # the turn's reply was queued, then cancelled, never sent

    fake_openai.responder = lambda req: oa.text("fresh answer")
    fake_telegram.inject(dm_update("and now?", 7303, user_id=5552004))
    await wait_until(lambda: len(sends_to(fake_telegram, 5552004)) == 2, what="next turn still works")
    assert texts(fake_telegram, 5552004)[-1] == "fresh answer"


async def test_interrupt_policy_cancels_the_running_turn_for_the_new_message(tmp_path, db_url, fake_telegram,
                                                                              fake_openai, running):
    fake_openai.reset()

    def respond(req):
        if last_user_text(req) == "long task":
            return oa.delay(0.5, oa.text("long answer"))
        return oa.text("answer to the new message")

    fake_openai.responder = respond
    config = on_db(tmp_path, db_url, fake_openai, fake_telegram, bus={"busy_policy": "interrupt"})
    await start_gateway(config, running)
    fake_telegram.inject(dm_update("long task", 7401, user_id=5552005))
    await wait_until(lambda: len(fake_openai.requests) == 1, what="first model call")
    fake_telegram.inject(dm_update("never mind, this instead", 7402, user_id=5552005))
    await wait_until(lambda: len(sends_to(fake_telegram, 5552005)) == 1, what="reply")
    await asyncio.sleep(0.8)
    assert texts(fake_telegram, 5552005) == ["answer to the new message"]


async def test_rate_limited_reply_waits_retry_after_with_no_other_call_to_the_chat(tmp_path, db_url, fake_telegram,
                                                                                   fake_openai, running):
    fake_openai.reset()
    fake_openai.responder = lambda req: oa.text(f"reply to {last_user_text(req)}")
    await start_gateway(on_db(tmp_path, db_url, fake_openai, fake_telegram), running)
    fake_telegram.fail_next("sendMessage", 429, "Too Many Requests: retry after 3", {"retry_after": 3})
    fake_telegram.inject(dm_update("first", 7501, user_id=5552006))
    await wait_until(lambda: len(sends_to(fake_telegram, 5552006)) == 1, what="first attempt")
    fake_telegram.inject(dm_update("second", 7502, user_id=5552006))  # its reply must wait behind the first
    await wait_until(lambda: len(fake_telegram.sent_messages(5552006)) == 2, timeout=10, what="both delivered")

    chat_calls = [c for c in fake_telegram.calls() if str(c.params.get("chat_id")) == "5552006"]
    rejected = next(i for i, c in enumerate(chat_calls) if c.method == "sendMessage")
    retried = chat_calls[rejected + 1]
    assert retried.method == "sendMessage" and retried.params["text"] == "reply to first"
    assert retried.time - chat_calls[rejected].time >= 3.0
    assert [m["text"] for m in fake_telegram.sent_messages(5552006)] == ["reply to first", "reply to second"]
