"""End to end through the real python-telegram-bot and openai clients against loopback fakes:
a Telegram message reaches the agent, the agent uses ``web_fetch``, and the reply comes back."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from sqlalchemy import select

from gateway.store.models import InboxRow, MessageRow
from tests.conftest import fixture, gateway_config, start_gateway
from tests.fakes import openai as oa
from tests.fakes.telegram import FakeTelegram
from tests.helpers import wait_until

ROOT = Path(__file__).resolve().parents[1]


def dm_update(text: str, message_id: int, user_id: int = 5550001) -> dict[str, Any]:
    update = fixture("telegram", "dm_text.json")
    update.pop("update_id")
    update["message"]["message_id"] = message_id
    update["message"]["text"] = text
    update["message"]["from"]["id"] = update["message"]["chat"]["id"] = user_id
    return update


def sends_to(fake, chat_id: int) -> list:
    return [c for c in fake.calls("sendMessage") if int(c.params["chat_id"]) == chat_id]


def echo_tool_result(request: dict[str, Any]) -> oa.TextReply:
    """Answers from the last tool result, so the reply proves the tool really ran."""
    last = request["messages"][-1]
    if last["role"] == "tool":
        codename = "amber-falcon-42" if "amber-falcon-42" in last["content"] else "nothing found"
        return oa.text(f"The page says the codename is **{codename}**.")
    return oa.text(f"echo: {last['content'][-40:]}")


async def test_dm_uses_web_fetch_and_replies(tmp_path, fake_telegram, fake_openai, page_server, running):
    fake_openai.reset()
    url = f"{page_server.url}/page"
    fetch = oa.call("web_fetch", {"url": url})
    fake_openai.script(oa.tool_calls(fetch))
    fake_openai.responder = echo_tool_result
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai, fake_telegram), running)

    fake_telegram.inject(dm_update(f"summarize {url}", 9001, user_id=5551001))
    call = await fake_telegram.wait_for_call("sendMessage", lambda c: int(c.params["chat_id"]) == 5551001, timeout=10)

    assert call.params["text"] == "The page says the codename is amber-falcon-42."
    assert {"type": "bold", "offset": 30, "length": 15} in call.params["entities"]
    assert "reply_parameters" not in call.params  # DMs are answered without quoting
    assert len(sends_to(fake_telegram, 5551001)) == 1

    # The model saw the tool result under the same tool_call_id; the page's script was not text.
    second = fake_openai.requests[1]["json"]["messages"]
    tool_msg = second[-1]
    assert tool_msg["role"] == "tool" and tool_msg["tool_call_id"] == fetch.id
    assert "Release 2.0" in tool_msg["content"] and "not text" not in tool_msg["content"]
    assert [m["role"] for m in second] == ["system", "user", "assistant", "tool"]
    # The current time is in the newest user message, not in the system prompt.
    assert second[1]["content"].startswith("[20") and url in second[1]["content"]
    assert "UTC" not in second[0]["content"]

    with gateway.engine.connect() as conn:
        rows = conn.execute(select(MessageRow.role, MessageRow.tool_call_id, MessageRow.content)
                            .order_by(MessageRow.id)).all()
        inbox = conn.execute(select(InboxRow.status)).scalars().all()
    assert [r.role for r in rows] == ["user", "assistant", "tool", "assistant"]
    assert rows[2].tool_call_id == fetch.id and "amber-falcon-42" in rows[2].content
    assert rows[3].content == "The page says the codename is **amber-falcon-42**."
    assert inbox == ["done"]


async def test_slow_turn_shows_typing_until_the_reply(tmp_path, fake_telegram, fake_openai, running):
    fake_openai.reset()
    fake_openai.script(oa.delay(1.5, oa.text("done thinking")))
    await start_gateway(gateway_config(tmp_path, fake_openai, fake_telegram), running)
    fake_telegram.inject(dm_update("think", 9701, user_id=5551007))
    reply = await fake_telegram.wait_for_call("sendMessage", lambda c: int(c.params["chat_id"]) == 5551007)
    typing = [c for c in fake_telegram.calls("sendChatAction") if int(c.params["chat_id"]) == 5551007]
    assert typing and typing[0].params["action"] == "typing" and typing[0].time < reply.time
    await asyncio.sleep(0.3)
    assert len([c for c in fake_telegram.calls("sendChatAction") if int(c.params["chat_id"]) == 5551007]) == 1


async def test_restart_keeps_history_and_identical_system_prompt(tmp_path, fake_telegram, fake_openai, running):
    fake_openai.reset()
    fake_openai.responder = lambda req: oa.text(f"answer {len(req['messages'])}")
    config = gateway_config(tmp_path, fake_openai, fake_telegram)
    first = await start_gateway(config, running)
    fake_telegram.inject(dm_update("remember the word kiwi", 9101, user_id=5551002))
    await fake_telegram.wait_for_call("sendMessage", lambda c: int(c.params["chat_id"]) == 5551002)
    await first.stop()
    running.remove(first)

    await start_gateway(config, running)
    fake_telegram.inject(dm_update("what word?", 9102, user_id=5551002))
    await wait_until(lambda: len(sends_to(fake_telegram, 5551002)) == 2, what="second reply")

    before, after = (r["json"] for r in fake_openai.requests[-2:])
    assert json.dumps(after["messages"][0]) == json.dumps(before["messages"][0])  # byte-identical system prompt
    assert json.dumps(after["tools"]) == json.dumps(before["tools"])
    assert [m["role"] for m in after["messages"]] == ["system", "user", "assistant", "user"]
    assert "remember the word kiwi" in after["messages"][1]["content"]
    assert after["messages"][2]["content"] == "answer 2"
    assert after["messages"][1] == before["messages"][1]  # history renders the same bytes every turn


async def test_an_empty_model_reply_does_not_break_the_conversation(tmp_path, fake_telegram, fake_openai, running):
    # A model may answer with neither text nor tool calls (a reasoning model that spent its output
    # tokens, a content filter). That answer was stored as {"role": "assistant", "content": null}
    # and sent again with every later turn, which OpenAI refuses: the chat got "The model returned
    # an error (400)." for every message until /new.
    fake_openai.reset()
    fake_openai.script(oa.text("", finish_reason="length"), oa.text("here it is"))
    config = gateway_config(tmp_path, fake_openai, fake_telegram)
    await start_gateway(config, running)
    chat = 5551077
    fake_telegram.inject(dm_update("think hard", 9201, user_id=chat))
    await wait_until(lambda: len(sends_to(fake_telegram, chat)) == 1, what="first reply")
    fake_telegram.inject(dm_update("and now?", 9202, user_id=chat))
    await wait_until(lambda: len(sends_to(fake_telegram, chat)) == 2, what="second reply")

    assert sends_to(fake_telegram, chat)[1].params["text"] == "here it is"
    assert [r["status"] for r in fake_openai.requests] == [200, 200]
    sent = fake_openai.requests[1]["json"]["messages"]
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "user"]
    assert sent[2] == {"role": "assistant", "content": ""}


async def test_groups_answer_only_when_addressed(tmp_path, fake_telegram, fake_openai, running):
    fake_openai.reset()
    fake_openai.responder = lambda req: oa.text("group answer")
    await start_gateway(gateway_config(tmp_path, fake_openai, fake_telegram), running)

    # Same chat: the unaddressed message comes first, so a reply to it would be seen first.
    fake_telegram.inject(fixture("telegram", "group_no_mention.json"))
    fake_telegram.inject(fixture("telegram", "group_mention.json"))
    call = await fake_telegram.wait_for_call("sendMessage", lambda c: int(c.params["chat_id"]) == -4000000001)
    assert call.params["reply_parameters"]["message_id"] == 2201
    user_texts = [r["json"]["messages"][-1]["content"] for r in fake_openai.requests]
    assert len(user_texts) == 1 and user_texts[0].endswith("what is the status of the release?")
    assert "from Bob" in user_texts[0]

    # Forum topic: an emoji before the mention (UTF-16 offsets); the reply goes into topic 77.
    fake_telegram.inject(fixture("telegram", "forum_topic_mention.json"))
    topic = await fake_telegram.wait_for_call("sendMessage",
                                              lambda c: int(c.params["chat_id"]) == -1001000000001)
    assert int(topic.params["message_thread_id"]) == 77
    assert topic.params["reply_parameters"]["message_id"] == 3305
    assert fake_openai.requests[-1]["json"]["messages"][-1]["content"].endswith("👋 draft the changelog, please")
    await asyncio.sleep(0.3)
    assert len(sends_to(fake_telegram, -4000000001)) == 1


async def test_a_reply_to_a_group_that_became_a_supergroup_goes_to_the_supergroup(tmp_path, fake_telegram,
                                                                                   fake_openai, running, caplog):
    """A group upgraded to a supergroup while its turn ran (an admin turned on a supergroup feature):
    sendMessage to the old id answers 400 with ``migrate_to_chat_id``; the reply failed for good
    ("chat migrated to ...") and the user never got it (found by a review). It is sent there."""
    fake_openai.reset()
    fake_openai.responder = lambda req: oa.text("release is green")
    await start_gateway(gateway_config(tmp_path, fake_openai, fake_telegram), running)
    update = fixture("telegram", "group_mention.json")
    update["message"]["chat"]["id"] = old = -4000000079
    new = -1001000000079
    fake_telegram.migrated[str(old)] = new
    try:
        fake_telegram.inject(update)
        call = await fake_telegram.wait_for_call("sendMessage", lambda c: int(c.params["chat_id"]) == new)
        assert call.params["text"] == "release is green"
        assert "reply_parameters" not in call.params  # the quoted message's id belongs to the old chat
        service = {"message_id": 2300, "date": update["message"]["date"], "chat": update["message"]["chat"],
                   "from": update["message"]["from"], "migrate_to_chat_id": new}
        fake_telegram.inject({"message": service})  # the service message Telegram sends the old chat
        await wait_until(lambda: any(str(old) in r.getMessage() and str(new) in r.getMessage()
                                     and r.levelname == "WARNING" and "became supergroup" in r.getMessage()
                                     for r in caplog.records), what="the operator's warning")
    finally:
        del fake_telegram.migrated[str(old)]


async def test_a_command_after_the_bots_mention_in_a_group_is_that_command(tmp_path, fake_telegram, fake_openai,
                                                                            running):
    """``@bot /stop`` (the mention form every other platform uses for commands; Telegram marks the
    ``/stop`` as a ``bot_command`` entity after the ``mention``) is ``/stop``, answered at once,
    not a text for the model."""
    fake_openai.reset()
    fake_openai.responder = lambda req: oa.text("model answer")
    await start_gateway(gateway_config(tmp_path, fake_openai, fake_telegram), running)
    update = fixture("telegram", "group_mention.json")
    update["message"]["chat"]["id"] = chat = -4000000077
    update["message"].update(text="@gateway_test_bot  /stop", entities=[
        {"offset": 0, "length": 17, "type": "mention"}, {"offset": 19, "length": 5, "type": "bot_command"}])
    fake_telegram.inject(update)
    call = await fake_telegram.wait_for_call("sendMessage", lambda c: int(c.params["chat_id"]) == chat)
    assert call.params["text"] == "Nothing is running; nothing to stop."
    assert call.params["reply_parameters"]["message_id"] == 2201
    await asyncio.sleep(0.3)
    assert fake_openai.requests == [] and len(sends_to(fake_telegram, chat)) == 1


async def test_a_command_for_another_bot_in_a_reply_to_ours_is_not_answered(tmp_path, fake_telegram, fake_openai,
                                                                             running):
    """A reply to one of our messages reaches the bot (Telegram delivers replies to it even in
    privacy mode), but ``/ask@other_bot ...`` is that bot's command: the other bot answers it."""
    fake_openai.reset()
    fake_openai.responder = lambda req: oa.text("our answer")
    await start_gateway(gateway_config(tmp_path, fake_openai, fake_telegram), running)
    chat = -1001000000078
    other = fixture("telegram", "supergroup_reply_to_bot.json")
    other.pop("update_id")
    for message in (other["message"], other["message"]["reply_to_message"]):
        message["chat"]["id"] = chat
    other["message"].update(text="/ask@other_bot which warnings?",
                            entities=[{"offset": 0, "length": 14, "type": "bot_command"}])
    ours = json.loads(json.dumps(other))
    ours["message"].update(message_id=4412, text="Which warnings exactly?")
    del ours["message"]["entities"]
    fake_telegram.inject(other)
    fake_telegram.inject(ours)  # after it in the same chat: its answer shows the first was read
    call = await fake_telegram.wait_for_call("sendMessage", lambda c: int(c.params["chat_id"]) == chat)
    assert call.params["reply_parameters"]["message_id"] == 4412
    await asyncio.sleep(0.3)
    assert len(sends_to(fake_telegram, chat)) == 1 and len(fake_openai.requests) == 1
    assert fake_openai.requests[0]["json"]["messages"][-1]["content"].endswith("Which warnings exactly?")


async def test_duplicate_update_is_answered_once(tmp_path, fake_telegram, fake_openai, running):
    fake_openai.reset()
    fake_openai.responder = lambda req: oa.text("hello Alice")
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai, fake_telegram), running)
    fake_telegram.inject(fixture("telegram", "dm_text.json"))
    await fake_telegram.wait_for_call("sendMessage", lambda c: int(c.params["chat_id"]) == 5550001)
    fake_telegram.inject(fixture("telegram", "dm_text_duplicate.json"))
    await wait_until(lambda: gateway.duplicates == 1, what="duplicate seen")
    await asyncio.sleep(0.3)
    assert len(sends_to(fake_telegram, 5550001)) == 1
    assert len(fake_openai.requests) == 1


async def test_long_markdown_reply_is_split_and_accepted(tmp_path, fake_telegram, fake_openai, running):
    fake_openai.reset()
    entries = [f"file_name_{i} 2 * {i} = {2 * i};" for i in range(700)]
    body = "\n".join(" ".join(entries[j:j + 40]) for j in range(0, len(entries), 40))
    model_text = "**Report** for `snake_case_var` and *emphasis*\n\n" + body
    assert len(model_text) > 10_000
    fake_openai.script(oa.text(model_text))
    await start_gateway(gateway_config(tmp_path, fake_openai, fake_telegram), running)

    fake_telegram.inject(dm_update("give me the long report", 9301, user_id=5551003))
    displayed = "Report for snake_case_var and emphasis\n\n" + body
    await wait_until(lambda: sum(len(c.params["text"]) for c in sends_to(fake_telegram, 5551003)) >= len(displayed),
                     what="all parts")
    await asyncio.sleep(0.2)
    calls = sends_to(fake_telegram, 5551003)
    assert len(calls) >= 3
    for call in calls:
        assert len(call.params["text"].encode("utf-16-le")) // 2 <= 4096
    stored = [m["text"] for m in fake_telegram.sent_messages(5551003)]
    assert len(stored) == len(calls)  # every part was accepted by the Bot API fake
    assert "".join(stored) == displayed
    first_entities = calls[0].params["entities"]
    assert {"type": "bold", "offset": 0, "length": 6} in first_entities
    assert {"type": "code", "offset": 11, "length": 14} in first_entities


async def test_entities_rejected_are_resent_as_plain_text(tmp_path, fake_telegram, fake_openai, running):
    fake_openai.reset()
    fake_openai.script(oa.text("Use **bold** here"))
    await start_gateway(gateway_config(tmp_path, fake_openai, fake_telegram), running)
    fake_telegram.fail_next("sendMessage", 400, "Bad Request: can't parse entities: unsupported entity")
    fake_telegram.inject(dm_update("format please", 9401, user_id=5551004))
    await wait_until(lambda: len(fake_telegram.sent_messages(5551004)) == 1, what="plain resend")
    calls = sends_to(fake_telegram, 5551004)
    assert len(calls) == 2 and calls[0].params.get("entities") and not calls[1].params.get("entities")
    assert fake_telegram.sent_messages(5551004)[0]["text"] == "Use bold here"


async def test_links_telegram_refuses_do_not_lose_the_reply(tmp_path, fake_telegram, fake_openai, running):
    """Models link to files and anchors (``[README](./README.md)``, ``[setup](#setup)``, a local
    path); the Bot API refuses a ``text_link`` whose URL fails TDLib's link check with 400 "entity URL
    '...' is invalid: ..." (not "can't parse entities"), which used to fail the whole reply for
    good. Such links are sent as their label; real links keep their entity; one message."""
    fake_openai.reset()
    fake_openai.script(oa.text("See [README](./README.md), [setup](#setup), [notes](/home/me/notes.md), "
                               "[mail](mailto:ops@example.com) and [the docs](https://example.com/docs_(v2))."))
    await start_gateway(gateway_config(tmp_path, fake_openai, fake_telegram), running)
    fake_telegram.inject(dm_update("where is it?", 9451, user_id=5551014))
    await wait_until(lambda: len(fake_telegram.sent_messages(5551014)) == 1, what="the reply")
    await asyncio.sleep(0.3)
    [message] = fake_telegram.sent_messages(5551014)
    assert message["text"] == "See README, setup, notes, mail and the docs."
    links = [e for e in message["entities"] or [] if e["type"] == "text_link"]
    assert links == [{"type": "text_link", "offset": 35, "length": 8, "url": "https://example.com/docs_(v2)"}]
    assert len(sends_to(fake_telegram, 5551014)) == 1  # accepted the first time: no refused attempt


async def test_any_entity_refusal_is_resent_as_plain_text_once(tmp_path, fake_telegram, fake_openai, running):
    """Whatever entity Telegram refuses (its wording varies: "can't parse entities", "entity URL ...
    is invalid"), the part goes again once without entities; the reply arrives exactly once."""
    fake_openai.reset()
    fake_openai.script(oa.text("Read [this](https://example.com/a) **now**"))
    await start_gateway(gateway_config(tmp_path, fake_openai, fake_telegram), running)
    fake_telegram.fail_next("sendMessage", 400, "Bad Request: entity URL 'https://example.com/a' is invalid: "
                            "Wrong HTTP URL")
    fake_telegram.inject(dm_update("link please", 9452, user_id=5551015))
    await wait_until(lambda: len(fake_telegram.sent_messages(5551015)) == 1, what="plain resend")
    await asyncio.sleep(0.3)
    calls = sends_to(fake_telegram, 5551015)
    assert len(calls) == 2 and calls[0].params.get("entities") and not calls[1].params.get("entities")
    assert [m["text"] for m in fake_telegram.sent_messages(5551015)] == ["Read this now"]


async def test_flood_control_is_retried_after_retry_after(tmp_path, fake_telegram, fake_openai, running):
    fake_openai.reset()
    fake_openai.script(oa.text("after the flood"))
    await start_gateway(gateway_config(tmp_path, fake_openai, fake_telegram), running)
    fake_telegram.fail_next("sendMessage", 429, "Too Many Requests: retry after 1", {"retry_after": 1})
    fake_telegram.inject(dm_update("hi", 9501, user_id=5551005))
    await wait_until(lambda: len(fake_telegram.sent_messages(5551005)) == 1, timeout=10, what="retry")
    calls = sends_to(fake_telegram, 5551005)
    assert len(calls) == 2 and calls[1].time - calls[0].time >= 0.9
    assert len(fake_telegram.sent_messages(5551005)) == 1


@pytest.mark.parametrize("mode", ["webhook"])
async def test_webhook_checks_secret_and_stores_nothing_on_401(tmp_path, fake_telegram, fake_openai, running, mode,
                                                              caplog):
    fake_openai.reset()
    fake_openai.responder = lambda req: oa.text("via webhook")
    config = gateway_config(tmp_path, fake_openai, fake_telegram, telegram={"mode": mode})
    gateway = await start_gateway(config, running)
    url = f"http://127.0.0.1:{gateway.http_port}/telegram/webhook"

    status = await fake_telegram.post_webhook(url, dm_update("sneaky", 9601, user_id=5551006), "wrong-secret")
    assert status == 401
    status = await fake_telegram.post_webhook(url, dm_update("sneaky", 9602, user_id=5551006), "")
    assert status == 401
    assert gateway.store.count_inbox("pending") + gateway.store.count_inbox("done") == 0
    rejected = [r.getMessage() for r in caplog.records if "rejected with 401" in r.getMessage()]
    assert rejected == ["telegram webhook rejected with 401: wrong secret token",
                        "telegram webhook rejected with 401: no secret token header"]
    assert not any("wrong-secret" in r.getMessage() for r in caplog.records)  # never the token sent

    secret = "webhook-secret-0123456789"
    assert await fake_telegram.post_webhook(url, dm_update("hello hook", 9603, user_id=5551006), secret) == 200
    call = await fake_telegram.wait_for_call("sendMessage", lambda c: int(c.params["chat_id"]) == 5551006)
    assert call.params["text"] == "via webhook"
    async with __import__("aiohttp").ClientSession() as http:
        async with http.post(url, data=b"{not json", headers={"X-Telegram-Bot-Api-Secret-Token": secret}) as resp:
            assert resp.status == 200  # malformed: acknowledged, logged, nothing stored
            assert (resp.content_type, resp.charset, await resp.read()) == ("application/json", "utf-8",
                                                                            b'{"ok": true}')
    assert gateway.store.count_inbox("done") == 1


async def test_reply_ids_are_the_messages_telegram_created_and_previews_are_edited_in_place():
    """The adapter reads each sent message's id from the Bot API's answer: the ids it reports are
    those of the messages Telegram created; a streamed preview is edited in place ("message is not
    modified" counts as success) and a preview that is gone is replaced by a new message."""
    from adapters.telegram.adapter import TelegramAdapter
    from gateway.core.types import ChatAddress, OutboundMessage

    chat = 5551101
    with FakeTelegram() as fake:
        adapter = TelegramAdapter(token=fake.token, base_url=fake.url)
        await adapter.bot.initialize()
        try:
            address = ChatAddress("telegram", str(fake.bot_id), str(chat))
            sent = await adapter.send(OutboundMessage(address, "**Part** one. " + "word " * 1000, "t1:0",
                                                      buttons=(("Stop", "/stop"),)))
            created = [str(m["message_id"]) for m in fake.sent_messages(chat)]
            assert sent.ok and len(created) == 2 and list(sent.platform_message_ids) == created
            assert "reply_markup" in fake.sent_messages(chat)[-1]  # the buttons, under the last part

            preview = created[0]
            for _ in range(2):  # the second edit changes nothing: Telegram says "not modified"
                edited = await adapter.send(OutboundMessage(address, "The **answer**.", "t2:0", edit_id=preview))
                assert edited.ok and edited.platform_message_ids == (preview,)
            assert fake.sent_messages(chat)[0]["text"] == "The answer."
            assert len(fake.calls("editMessageText")) == 2

            replaced = await adapter.send(OutboundMessage(address, "Final", "t3:0", edit_id="9999"))
            newest = fake.sent_messages(chat)[-1]
            assert replaced.ok and replaced.platform_message_ids == (str(newest["message_id"]),)
            assert newest["text"] == "Final"
        finally:
            await adapter.bot.shutdown()


async def test_a_token_revoked_while_running_fails_sends_and_edits_as_unauthorized():
    """Telegram answers 401 Unauthorized once the token is revoked; the failed delivery says so."""
    from adapters.telegram.adapter import TelegramAdapter
    from gateway.core.types import ChatAddress, OutboundMessage

    with FakeTelegram() as fake:
        adapter = TelegramAdapter(token=fake.token, base_url=fake.url)
        await adapter.bot.initialize()
        try:
            address = ChatAddress("telegram", str(fake.bot_id), "5551102")
            preview = await adapter.send(OutboundMessage(address, "draft", "t1:0", format="plain"))
            fake.token = "7000000001:AAAnotherTokenIssuedByBotFather000"  # @BotFather /revoke
            sent = await adapter.send(OutboundMessage(address, "hi", "t2:0"))
            assert (sent.ok, sent.retryable, sent.error) == (False, True, "network: Unauthorized")
            edited = await adapter.edit(address, preview.platform_message_ids[0], "more")
            assert (edited.ok, edited.retryable, edited.error) == (False, True, "network: Unauthorized")
        finally:
            await adapter.bot.shutdown()


def test_sending_and_editing_print_no_warning():
    """The adapter calls Bot.do_api_request for sendMessage on purpose; PTB's warning about that is
    silenced for the adapter, so even a process that makes warnings errors sends and edits."""
    script = """
import asyncio
from adapters.telegram.adapter import TelegramAdapter
from gateway.core.types import ChatAddress, OutboundMessage
from tests.fakes.telegram import FakeTelegram

async def main():
    with FakeTelegram() as fake:
        adapter = TelegramAdapter(token=fake.token, base_url=fake.url)
        await adapter.bot.initialize()
        address = ChatAddress("telegram", str(fake.bot_id), "5551103")
        sent = await adapter.send(OutboundMessage(address, "Hello **there**", "t1:0"))
        edited = await adapter.edit(address, sent.platform_message_ids[0], "Hello again")
        await adapter.bot.shutdown()
        print(sent.ok, edited.ok)

asyncio.run(main())
"""
    done = subprocess.run([sys.executable, "-W", "error::UserWarning", "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert (done.returncode, done.stdout.strip(), done.stderr) == (0, "True True", "")


class _BodyRecordingTelegram(FakeTelegram):
    """The fake Bot API, also keeping each request's content type and raw body."""

    def __init__(self) -> None:
        super().__init__()
        self.bodies: list[tuple[str, bytes]] = []

    async def _read_params(self, request: web.Request) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        params = await super()._read_params(request)
        self.bodies.append((request.content_type, await request.read()))  # aiohttp keeps the read body
        return params


async def test_bot_api_parameters_go_as_one_utf8_json_object():
    """Without files, a call's parameters are one JSON object (the Bot API accepts application/json
    for every call but uploads): nested objects as objects, numbers as numbers, text as UTF-8."""
    from adapters.telegram.adapter import TelegramAdapter
    from gateway.core.types import ChatAddress, OutboundMessage

    with _BodyRecordingTelegram() as fake:
        adapter = TelegramAdapter(token=fake.token, base_url=fake.url)
        await adapter.bot.initialize()
        try:
            address = ChatAddress("telegram", str(fake.bot_id), "5551104")
            sent = await adapter.send(OutboundMessage(address, "你好 **世界**", "t1:0", reply_to_id="7",
                                                      buttons=(("Stop", "/stop"),)))
        finally:
            await adapter.bot.shutdown()
    assert sent.ok
    content_type, body = fake.bodies[-1]
    assert content_type == "application/json" and "你好 世界".encode() in body
    assert json.loads(body) == {
        "chat_id": 5551104, "text": "你好 世界", "entities": [{"type": "bold", "offset": 3, "length": 2}],
        "reply_markup": {"inline_keyboard": [[{"text": "Stop", "callback_data": "/stop"}]]},
        "reply_parameters": {"message_id": 7, "allow_sending_without_reply": True},
    }
    assert fake.sent_messages(5551104)[0]["text"] == "你好 世界"
