"""A Chinese-speaking Telegram user gets the gateway's own texts in Chinese (help, a model error, the
pairing reply), ``/language`` switches and persists across gateway instances, the command menus are
set per scope and language and accepted by the fake (which checks setMyCommands as Telegram does),
and a reaction stands in for "typing" where Telegram refuses the chat action. End to end through
python-telegram-bot and the openai client against the loopback fakes."""

from __future__ import annotations

import copy
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import TEST_TOKEN, gateway_config, start_gateway
from tests.fakes import openai as oa
from tests.fakes.telegram import FakeTelegram
from tests.helpers import wait_until
from tests.test_telegram_e2e import dm_update, sends_to

ADMIN, USER, GROUP = 5559101, 5559102, -4000000101


@pytest.fixture
def fake_telegram() -> Iterator[FakeTelegram]:
    """A fresh Bot API fake per test (menus and calls of one test only)."""
    with FakeTelegram(token=TEST_TOKEN) as fake:
        yield fake


def in_language(update: dict[str, Any], language_code: str | None) -> dict[str, Any]:
    """``update`` from a client in ``language_code`` (``None``: the field left out); a leading
    ``/name`` is marked as a bot command, as Telegram clients do."""
    update = copy.deepcopy(update)
    text = update["message"]["text"]
    if text.startswith("/"):
        update["message"]["entities"] = [{"type": "bot_command", "offset": 0, "length": len(text.split()[0])}]
    if language_code is None:
        update["message"]["from"].pop("language_code", None)
    else:
        update["message"]["from"]["language_code"] = language_code
    return update


def texts(fake: FakeTelegram, chat_id: int) -> list[str]:
    return [c.params["text"] for c in sends_to(fake, chat_id)]


async def answered(fake: FakeTelegram, chat_id: int, count: int) -> list[str]:
    await wait_until(lambda: len(sends_to(fake, chat_id)) >= count, what=f"{count} answers to {chat_id}")
    return texts(fake, chat_id)


async def test_a_chinese_user_gets_help_and_a_model_error_in_chinese(tmp_path, fake_telegram, fake_openai, running):
    fake_openai.reset()
    fake_openai.responder = lambda req: oa.error(500, "The server had an error", "server_error")
    await start_gateway(gateway_config(tmp_path, fake_openai, fake_telegram), running)
    chat = 5559201
    fake_telegram.inject(in_language(dm_update("/help", 9301, user_id=chat), "zh-hans"))
    help_text = (await answered(fake_telegram, chat, 1))[0]
    assert "命令：" in help_text and "/language" in help_text and "Commands:" not in help_text

    fake_telegram.inject(in_language(dm_update("你好", 9302, user_id=chat), "zh-hans"))
    assert (await answered(fake_telegram, chat, 2))[1] == "⚠️ 模型返回了错误（500）。"

    english = 5559202  # the same gateway, an English client: English texts
    fake_telegram.inject(in_language(dm_update("/help", 9303, user_id=english), "en"))
    assert (await answered(fake_telegram, english, 1))[0].splitlines()[1] == "Commands:"


async def test_the_pairing_reply_is_in_the_users_language(tmp_path, fake_telegram, fake_openai, running):
    """Access control's reply to a stranger (allowlist with pairing), the limit every DM meets first."""
    config = gateway_config(tmp_path, fake_openai, fake_telegram,
                            access={"mode": "allowlist", "admins": [f"telegram:{ADMIN}"]})
    await start_gateway(config, running)
    fake_telegram.inject(in_language(dm_update("hello", 9311, user_id=USER), "zh-hans"))
    reply = (await answered(fake_telegram, USER, 1))[0]
    assert reply.startswith("你好！我还不认识你。请让管理员用这个代码批准你：")
    assert "/approve_user " in reply


async def test_a_chinese_user_over_the_daily_limit_is_told_in_chinese_and_the_model_is_not_asked(
        tmp_path, fake_telegram, fake_openai, running):
    """The spending limit's reply (``limits.user_daily_usd``) in the sender's language, its figures
    and reset time filled in; no model request for the refused message."""
    from datetime import UTC, datetime, timedelta

    fake_openai.reset()
    fake_openai.responder = lambda request: oa.text("巴黎。", usage=oa.usage(1500, 20, cached_tokens=1000))
    price = {"input": 10.0, "cached_input": 1.0, "output": 100.0}  # $0.0080 for that call
    config = gateway_config(tmp_path, fake_openai, fake_telegram, agent={"prices": {"gpt-4o-mini": price}},
                            limits={"user_daily_usd": 0.005})
    await start_gateway(config, running)
    chat = 5559231
    fake_telegram.inject(in_language(dm_update("法国的首都？", 9331, user_id=chat), "zh-hans"))
    assert (await answered(fake_telegram, chat, 1)) == ["巴黎。"]
    fake_telegram.inject(in_language(dm_update("西班牙呢？", 9332, user_id=chat), "zh-hans"))
    reply = (await answered(fake_telegram, chat, 2))[1]
    tomorrow = f"{(datetime.now(UTC) + timedelta(days=1)).date().isoformat()} 00:00 UTC"
    assert reply == f"💸 你今天的预算已用完（$0.0050 中已用 $0.0080），所以我没有回答。额度将于 {tomorrow} 重置。"
    assert len(fake_openai.requests) == 1


async def test_the_language_command_persists_across_instances(tmp_path, fake_telegram, fake_openai, running):
    """``/language en`` by a Chinese client is stored with the user (``users.language``): a second
    gateway on the same database answers in English; ``/language auto`` goes back to the app's language.
    Feishu-less and hint-less users get ``i18n.default``."""
    config = gateway_config(tmp_path, fake_openai, fake_telegram, i18n={"default": "zh_CN"})
    first = await start_gateway(config, running)
    chat = 5559211
    fake_telegram.inject(in_language(dm_update("/language", 9321, user_id=chat), "zh-hans"))
    assert (await answered(fake_telegram, chat, 1))[0].startswith("语言：简体中文。")
    fake_telegram.inject(in_language(dm_update("/language en", 9322, user_id=chat), "zh-hans"))
    assert (await answered(fake_telegram, chat, 2))[1] == "Language set: English. I will answer in it from now on."
    await first.stop()
    running.remove(first)

    await start_gateway(config, running)  # another instance: the choice is in the database
    fake_telegram.inject(in_language(dm_update("/stop", 9323, user_id=chat), "zh-hans"))
    assert (await answered(fake_telegram, chat, 3))[2] == "Nothing is running; nothing to stop."
    fake_telegram.inject(in_language(dm_update("/language auto", 9324, user_id=chat), "zh-hans"))
    assert (await answered(fake_telegram, chat, 4))[3] == "语言：自动，跟随你的应用语言（当前为 简体中文）。"
    fake_telegram.inject(in_language(dm_update("/language klingon", 9325, user_id=chat), "zh-hans"))
    assert "我没有 klingon 的文本" in (await answered(fake_telegram, chat, 5))[4]

    silent = 5559212  # no language_code at all: i18n.default (zh_CN here)
    fake_telegram.inject(in_language(dm_update("/stop", 9326, user_id=silent), None))
    assert (await answered(fake_telegram, silent, 1))[0] == "没有正在进行的回答，无需停止。"


async def test_menus_are_set_per_scope_and_language(tmp_path, fake_telegram, fake_openai, running):
    fake_telegram.add_chat({"id": ADMIN, "type": "private", "first_name": "Ada"})
    fake_telegram.add_chat({"id": USER, "type": "private", "first_name": "Bo"})
    fake_telegram.add_chat({"id": GROUP, "type": "group", "title": "Team"})
    config = gateway_config(tmp_path, fake_openai, fake_telegram,
                            access={"mode": "allowlist", "admins": [f"telegram:{ADMIN}"]})
    await start_gateway(config, running)

    calls = fake_telegram.calls("setMyCommands")
    sent = sorted((c.params.get("scope", {}).get("type"), c.params.get("language_code") or "") for c in calls)
    assert sent == sorted((scope, language) for scope in ("all_private_chats", "all_group_chats", "chat")
                          for language in ("", "en", "zh"))
    # The fake refuses what Telegram refuses (names, lengths, count, language codes, scopes): all accepted.
    assert sorted(fake_telegram.commands) == sorted(
        f"{scope}{suffix}" for scope in ("all_private_chats", "all_group_chats", f"chat:{ADMIN}")
        for suffix in ("", "/en", "/zh"))

    def descriptions(chat_id: int, language: str = "") -> dict[str, str]:
        return {c["command"]: c["description"] for c in fake_telegram.menu_entries(chat_id, language=language)}

    assert descriptions(USER, "zh")["help"] == "这个机器人能做什么"
    assert descriptions(USER, "zh")["language"] == "我的消息所用的语言：/language zh|en|auto"
    assert descriptions(USER, "en")["help"] == descriptions(USER)["help"] == "What this bot can do"
    assert descriptions(USER, "de") == descriptions(USER)  # no German menu: the one without a language
    assert descriptions(GROUP, "zh")["stop"] == "停止正在生成的回答"
    assert set(descriptions(GROUP, "zh")) == set(descriptions(GROUP))
    assert "approve_user" in descriptions(ADMIN, "zh") and "approve_user" not in descriptions(USER, "zh")


async def test_the_fake_refuses_menus_telegram_refuses(fake_telegram):
    from telegram import Bot, BotCommand, BotCommandScopeAllPrivateChats
    from telegram.error import BadRequest

    fake_telegram.add_chat({"id": USER, "type": "private", "first_name": "Bo"})
    async with Bot(TEST_TOKEN, base_url=f"{fake_telegram.url}/bot") as bot:
        scope = BotCommandScopeAllPrivateChats()
        for language in ("xx", "zho", "ZH", "zh-hans"):  # two-letter ISO 639-1 codes only
            with pytest.raises(BadRequest, match=r"(?i)invalid language code"):
                await bot.set_my_commands([BotCommand("help", "Help")], scope=scope, language_code=language)
        assert await bot.set_my_commands([BotCommand("help", "帮助")], scope=scope, language_code="zh")
        with pytest.raises(BadRequest, match=r"(?i)bot_command_invalid"):
            await bot.set_my_commands([BotCommand("帮助", "Help")], scope=scope, language_code="zh")
        with pytest.raises(BadRequest, match=r"(?i)reaction_invalid"):
            await bot.set_message_reaction(USER, 1, reaction="🦜")  # not on Telegram's list


async def test_a_reaction_shows_work_where_typing_is_refused(tmp_path, fake_telegram, fake_openai, running):
    fake_openai.reset()
    gate = threading.Event()
    fake_openai.script(oa.hold(gate, oa.text("done")))  # the turn runs until the reaction is seen
    await start_gateway(gateway_config(tmp_path, fake_openai, fake_telegram), running)
    chat = 5559231
    fake_telegram.fail_next("sendChatAction", 400, "Bad Request: not enough rights to send text messages to the chat")
    fake_telegram.inject(in_language(dm_update("work on this", 9331, user_id=chat), "zh-hans"))
    try:
        await wait_until(lambda: fake_telegram.reactions.get((chat, 9331)) == ["👀"], what="the working reaction")
        assert not sends_to(fake_telegram, chat)
    finally:
        gate.set()
    assert await answered(fake_telegram, chat, 1) == ["done"]
    await wait_until(lambda: fake_telegram.reactions.get((chat, 9331)) == [], what="the reaction taken away")
    marks = [c.params.get("reaction") for c in fake_telegram.calls("setMessageReaction")
             if int(c.params["chat_id"]) == chat]
    assert marks[0] == [{"type": "emoji", "emoji": "👀"}] and marks[-1] in ([], None)
