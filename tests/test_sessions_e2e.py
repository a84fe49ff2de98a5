"""One conversation across platforms, session commands, isolation and access control, end to end
through the real python-telegram-bot and slack-sdk against loopback fakes."""

from __future__ import annotations

import asyncio
import re

from tests.conftest import gateway_config, start_gateway
from tests.fakes import openai as oa
from tests.helpers import wait_until
from tests.test_slack_e2e import events_url, message
from tests.test_telegram_e2e import dm_update, sends_to

SLACK_DM = "D0CROSS001"


def tg_command(text: str, message_id: int, user_id: int) -> dict:
    update = dm_update(text, message_id, user_id=user_id)
    command = text.split()[0]
    update["message"]["entities"] = [{"type": "bot_command", "offset": 0, "length": len(command)}]
    return update


def tg_texts(fake, chat_id: int) -> list[str]:
    return [c.params["text"] for c in sends_to(fake, chat_id)]


def slack_texts(fake, channel: str) -> list[str]:
    return [c.params["text"] for c in fake.calls("chat.postMessage") if c.params["channel"] == channel]


def user_contents(request: dict) -> list[str]:
    return [m["content"] for m in request["json"]["messages"] if m["role"] == "user"]


async def test_a_linked_user_continues_one_conversation_from_telegram_to_slack(
        tmp_path, fake_telegram, fake_slack, fake_openai, running):
    fake_openai.reset()
    fake_openai.responder = lambda req: oa.text(f"ok ({len(req['messages'])} messages)")
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai, fake_telegram, fake_slack=fake_slack),
                                  running)
    alice_tg = 5553001

    fake_telegram.inject(dm_update("my codeword is APPLE", 8001, user_id=alice_tg))
    await wait_until(lambda: len(sends_to(fake_telegram, alice_tg)) == 1, what="first reply")
    fake_telegram.inject(tg_command("/link", 8002, alice_tg))
    await wait_until(lambda: len(sends_to(fake_telegram, alice_tg)) == 2, what="link code")
    code = re.search(r"/link ([A-Z0-9]{5}-[A-Z0-9]{5})", tg_texts(fake_telegram, alice_tg)[-1]).group(1)
    assert len(fake_openai.requests) == 1  # commands never reach the model

    url = events_url(gateway)
    assert (await fake_slack.post_event(url, message(f"/link {code}", "1800000000.000100",
                                                     channel=SLACK_DM))).status == 200
    await wait_until(lambda: len(slack_texts(fake_slack, SLACK_DM)) == 1, what="linked")
    assert slack_texts(fake_slack, SLACK_DM)[0].startswith("Linked.")

    assert (await fake_slack.post_event(url, message("what is my codeword?", "1800000000.000200",
                                                     channel=SLACK_DM))).status == 200
    await wait_until(lambda: len(slack_texts(fake_slack, SLACK_DM)) == 2, what="answer on slack")
    telegram_turn, slack_turn = fake_openai.requests[0]["json"], fake_openai.requests[1]["json"]
    assert slack_turn["messages"][0] == telegram_turn["messages"][0]  # the same stored system prompt
    users = user_contents(fake_openai.requests[1])
    assert users[0].endswith("my codeword is APPLE") and users[-1].endswith("what is my codeword?")
    assert len(sends_to(fake_telegram, alice_tg)) == 2  # the reply went to Slack, not Telegram

    fake_telegram.inject(dm_update("and where did I ask that?", 8003, user_id=alice_tg))
    await wait_until(lambda: len(sends_to(fake_telegram, alice_tg)) == 3, what="back on telegram")
    back = user_contents(fake_openai.requests[2])
    assert [u.splitlines()[-1] for u in back] == [
        "my codeword is APPLE", "what is my codeword?", "and where did I ask that?"]

    # /unlink: Slack starts a conversation of its own again.
    assert (await fake_slack.post_event(url, message("/unlink", "1800000000.000300", channel=SLACK_DM))).status == 200
    await wait_until(lambda: len(slack_texts(fake_slack, SLACK_DM)) == 3, what="unlinked")
    assert (await fake_slack.post_event(url, message("still there?", "1800000000.000400",
                                                     channel=SLACK_DM))).status == 200
    await wait_until(lambda: len(fake_openai.requests) == 4, what="turn after unlink")
    assert [u.splitlines()[-1] for u in user_contents(fake_openai.requests[3])] == ["still there?"]


async def test_link_codes_are_single_use(tmp_path, fake_telegram, fake_openai, running):
    fake_openai.reset()
    await start_gateway(gateway_config(tmp_path, fake_openai, fake_telegram), running)
    fake_telegram.inject(tg_command("/link", 8101, 5553101))
    await wait_until(lambda: len(sends_to(fake_telegram, 5553101)) == 1, what="code")
    code = re.search(r"/link ([A-Z0-9]{5}-[A-Z0-9]{5})", tg_texts(fake_telegram, 5553101)[0]).group(1)
    fake_telegram.inject(tg_command(f"/link {code}", 8102, 5553102))
    fake_telegram.inject(tg_command(f"/link {code}", 8103, 5553103))
    await wait_until(lambda: sends_to(fake_telegram, 5553102) and sends_to(fake_telegram, 5553103), what="answers")
    answers = sorted(tg_texts(fake_telegram, user)[0] for user in (5553102, 5553103))  # they race: one wins
    assert answers[0].startswith("Linked.") and "not valid" in answers[1]


async def test_threads_of_one_group_are_isolated_and_sessions_are_private(tmp_path, fake_telegram, fake_openai,
                                                                          running):
    fake_openai.reset()
    fake_openai.responder = lambda req: oa.text("noted")
    await start_gateway(gateway_config(tmp_path, fake_openai, fake_telegram), running)
    forum = -1003000000001

    def topic_message(text: str, message_id: int, user_id: int, topic: int) -> dict:
        update = dm_update(f"@gateway_test_bot {text}", message_id, user_id=user_id)
        update["message"]["chat"] = {"id": forum, "title": "Forum", "type": "supergroup", "is_forum": True}
        update["message"].update(message_thread_id=topic, is_topic_message=True)
        update["message"]["entities"] = [{"type": "mention", "offset": 0, "length": 17}]
        return update

    fake_telegram.inject(topic_message("the secret is PLUM", 8201, 5553201, topic=11))
    await wait_until(lambda: len(fake_openai.requests) == 1, what="A's turn")
    fake_telegram.inject(topic_message("what is the secret?", 8202, 5553202, topic=22))
    await wait_until(lambda: len(fake_openai.requests) == 2, what="B's turn")
    assert "PLUM" not in str(fake_openai.requests[1]["json"]["messages"])

    # Alice's DM conversation id; Bob may not resume it, and the refusal reveals nothing.
    fake_telegram.inject(dm_update("hello", 8203, user_id=5553201))
    fake_telegram.inject(tg_command("/sessions", 8204, 5553201))
    await wait_until(lambda: len(sends_to(fake_telegram, 5553201)) == 2, what="alice's sessions")
    listing = tg_texts(fake_telegram, 5553201)[1]
    alice_session = re.search(r"^([0-9a-f]{8}) - hello", listing, re.M).group(1)
    fake_telegram.inject(tg_command("/resume ____", 8212, 5553201))  # LIKE wildcards are characters
    await wait_until(lambda: len(sends_to(fake_telegram, 5553201)) == 3, what="alice's /resume ____")
    assert tg_texts(fake_telegram, 5553201)[2] == "No conversation of yours has that ID. See /sessions."
    fake_telegram.inject(tg_command(f"/resume {alice_session}", 8205, 5553202))
    fake_telegram.inject(tg_command("/resume 00000000", 8206, 5553202))
    await wait_until(lambda: len(sends_to(fake_telegram, 5553202)) == 2, what="bob's refusals")
    refused, missing = tg_texts(fake_telegram, 5553202)
    assert refused == missing == "No conversation of yours has that ID. See /sessions."
    fake_telegram.inject(tg_command("/resume", 8211, 5553202))  # no ID at all: how to use it
    await wait_until(lambda: len(sends_to(fake_telegram, 5553202)) == 3, what="bob's /resume")
    assert tg_texts(fake_telegram, 5553202)[2] == "Usage: /resume ID (see /sessions)."

    # /new then /resume brings Alice's first conversation back.
    fake_telegram.inject(tg_command("/new", 8207, 5553201))
    fake_telegram.inject(dm_update("fresh start", 8208, user_id=5553201))
    await wait_until(lambda: len(sends_to(fake_telegram, 5553201)) == 5, what="new conversation")
    assert [u.splitlines()[-1] for u in user_contents(fake_openai.requests[-1])] == ["fresh start"]
    fake_telegram.inject(tg_command(f"/resume {alice_session}", 8209, 5553201))
    fake_telegram.inject(dm_update("where were we?", 8210, user_id=5553201))
    await wait_until(lambda: len(sends_to(fake_telegram, 5553201)) == 7, what="resumed")
    assert [u.splitlines()[-1] for u in user_contents(fake_openai.requests[-1])] == ["hello", "where were we?"]


async def test_unknown_dm_user_gets_a_pairing_code_and_no_model_call(tmp_path, fake_telegram, fake_openai, running):
    fake_openai.reset()
    fake_openai.responder = lambda req: oa.text("welcome")
    config = gateway_config(tmp_path, fake_openai, fake_telegram,
                            access={"mode": "allowlist", "admins": ["telegram:5553399"]})
    await start_gateway(config, running)
    stranger, admin = 5553301, 5553399
    fake_telegram.inject(dm_update("hi, can you help?", 8301, user_id=stranger))
    await wait_until(lambda: len(sends_to(fake_telegram, stranger)) == 1, what="pairing code")
    code = re.search(r"/approve_user ([A-Z0-9]{6})", tg_texts(fake_telegram, stranger)[0]).group(1)
    assert fake_openai.requests == []

    fake_telegram.inject(tg_command(f"/approve_user {code}", 8302, stranger))  # not an admin
    await wait_until(lambda: len(sends_to(fake_telegram, stranger)) == 2, what="still pairing")
    assert code in tg_texts(fake_telegram, stranger)[1] and fake_openai.requests == []

    fake_telegram.inject(tg_command(f"/approve_user {code}", 8303, admin))
    await wait_until(lambda: len(sends_to(fake_telegram, admin)) == 1, what="approved")
    assert tg_texts(fake_telegram, admin)[0].startswith("Approved")
    fake_telegram.inject(dm_update("now?", 8304, user_id=stranger))
    await wait_until(lambda: len(sends_to(fake_telegram, stranger)) == 3, what="answered")
    assert tg_texts(fake_telegram, stranger)[2] == "welcome"
    await asyncio.sleep(0.1)
    assert len(fake_openai.requests) == 1


async def test_a_conversation_whose_first_turn_calls_a_tool_is_titled_by_its_first_message(
        tmp_path, fake_telegram, fake_openai, running):
    """The user message is written with the turn's first tool call, not at its end: /sessions
    still lists the conversation by what the user first said."""
    fake_openai.reset()

    def responder(request: dict) -> oa.Reply:
        if request["messages"][-1]["role"] == "tool":
            return oa.text("it is late")
        return oa.tool_calls(oa.call("no_such_tool", {}))  # any call: its result is written first

    fake_openai.responder = responder
    await start_gateway(gateway_config(tmp_path, fake_openai, fake_telegram), running)
    fake_telegram.inject(dm_update("what time is it in Lisbon?", 8401, user_id=5553401))
    await wait_until(lambda: len(sends_to(fake_telegram, 5553401)) == 1, what="the answer")
    fake_telegram.inject(tg_command("/sessions", 8402, 5553401))
    await wait_until(lambda: len(sends_to(fake_telegram, 5553401)) == 2, what="the listing")
    assert re.search(r"^[0-9a-f]{8} - what time is it in Lisbon\?", tg_texts(fake_telegram, 5553401)[1], re.M)


async def test_a_resumed_conversation_is_not_reset_as_idle_by_the_next_message(tmp_path, fake_telegram, fake_openai,
                                                                               running):
    """With an idle reset, ``/resume`` of a conversation idle past it continues that conversation (the
    resume is a use): it was replaced by a new one at the very next message, with the reset notice."""
    fake_openai.reset()
    fake_openai.responder = lambda req: oa.text("noted")
    config = gateway_config(tmp_path, fake_openai, fake_telegram, sessions={"idle_reset_minutes": 0.02})  # 1.2 s
    await start_gateway(config, running)
    carol = 5553501
    fake_telegram.inject(dm_update("the codeword is PEAR", 8501, user_id=carol))
    fake_telegram.inject(tg_command("/sessions", 8502, carol))
    await wait_until(lambda: len(sends_to(fake_telegram, carol)) == 2, what="carol's sessions")
    listing = tg_texts(fake_telegram, carol)
    found = re.search(r"^([0-9a-f]{8}) - the codeword", listing[1], re.M)
    assert found, listing
    first = found.group(1)
    fake_telegram.inject(tg_command("/new", 8503, carol))
    await wait_until(lambda: len(sends_to(fake_telegram, carol)) == 3, what="new conversation")
    await asyncio.sleep(1.5)  # the first conversation is idle past the reset now

    fake_telegram.inject(tg_command(f"/resume {first}", 8504, carol))
    fake_telegram.inject(dm_update("what is the codeword?", 8505, user_id=carol))
    await wait_until(lambda: len(sends_to(fake_telegram, carol)) == 5, what="resumed")
    assert tg_texts(fake_telegram, carol)[3] == f"Resumed conversation {first}."
    assert tg_texts(fake_telegram, carol)[4] == "noted"  # no reset notice
    assert [u.splitlines()[-1] for u in user_contents(fake_openai.requests[-1])] == [
        "the codeword is PEAR", "what is the codeword?"]
