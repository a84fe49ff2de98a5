"""Self-test of ``tests.fakes.telegram.FakeTelegram`` driven by the real python-telegram-bot ``Bot``."""

from __future__ import annotations

import asyncio
import json
import re
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from aiohttp import web
from telegram import Bot, MessageEntity, Update
from telegram.error import BadRequest, Conflict, InvalidToken, RetryAfter

from tests.fakes.telegram import FakeTelegram

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "platforms" / "telegram"
BOT = json.loads((FIXTURES / "expected.json").read_text())["_bot"]
DM_CHAT = 5550001


def load(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeTelegram]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NO_PROXY", "127.0.0.1,localhost")
        mp.setenv("no_proxy", "127.0.0.1,localhost")
        server = FakeTelegram()
        server.start()
        yield server
        server.stop()


def make_bot(fake: FakeTelegram, token: str = BOT["token"]) -> Bot:
    return Bot(token, base_url=f"{fake.url}/bot", base_file_url=f"{fake.url}/file/bot")


@pytest.fixture(scope="module")
async def bot(fake: FakeTelegram) -> AsyncIterator[Bot]:
    async with make_bot(fake) as b:
        yield b


async def test_get_me_returns_fixture_bot(bot: Bot) -> None:
    me = await bot.get_me()
    assert (me.id, me.username, me.is_bot) == (BOT["id"], BOT["username"], True)
    assert me.can_read_all_group_messages is False


async def test_wrong_token_is_rejected(fake: FakeTelegram) -> None:
    with pytest.raises(InvalidToken):
        async with make_bot(fake, "123:wrong"):
            pass


async def test_send_message_with_entities_round_trips(fake: FakeTelegram, bot: Bot) -> None:
    entity = MessageEntity(MessageEntity.BOLD, offset=3, length=5)
    msg = await bot.send_message(DM_CHAT, "👋 Hello world", entities=[entity])
    assert msg.text == "👋 Hello world" and msg.parse_entity(msg.entities[0]) == "Hello"
    assert msg.from_user.id == BOT["id"] and msg.chat.type == "private"
    call = fake.calls("sendMessage")[-1]
    assert call.params["chat_id"] == DM_CHAT
    assert call.params["entities"] == [{"type": "bold", "offset": 3, "length": 5}]
    assert fake.sent_messages(DM_CHAT)[-1]["message_id"] == msg.message_id

    topic = await bot.send_message(-1001000000001, "in a topic", message_thread_id=77)
    assert topic.message_thread_id == 77
    assert topic.message_id > 0


async def test_text_limits_in_utf16_units(bot: Bot) -> None:
    with pytest.raises(BadRequest, match=r"(?i)too long"):
        await bot.send_message(DM_CHAT, "x" * 5000)
    await bot.send_message(DM_CHAT, "😀" * 2048)  # 4096 UTF-16 units: allowed
    with pytest.raises(BadRequest, match=r"(?i)too long"):
        await bot.send_message(DM_CHAT, "😀" * 2049)
    with pytest.raises(BadRequest, match=r"(?i)text is empty"):
        await bot.send_message(DM_CHAT, "   ")


@pytest.mark.parametrize(("url", "reason"), [
    ("#installation", "URL host is empty"),
    ("/Users/me/notes.md", "URL host is empty"),
    ("./README.md", "Host is invalid"),
    ("javascript:alert(1)", "Wrong port number specified in the URL"),
    ("localhost", "Wrong HTTP URL"),
    ("ftp://example.com/a", "Unsupported URL protocol"),
    ("https://exa mple.com/", "Wrong URL host"),
])
async def test_text_link_urls_are_checked_like_tdlib(fake: FakeTelegram, bot: Bot, url: str, reason: str) -> None:
    """The Bot API refuses the whole message when a ``text_link`` URL fails TDLib's
    ``LinkManager::check_link`` (observed: "Bad Request: entity URL '/Users/...' is invalid: URL
    host is empty"); nothing is sent."""
    sent_before = len(fake.sent_messages(DM_CHAT))
    link = MessageEntity(MessageEntity.TEXT_LINK, offset=0, length=4, url=url)
    with pytest.raises(BadRequest, match=rf"(?i)^entity url '{re.escape(url)}' is invalid: {re.escape(reason)}$"):
        await bot.send_message(DM_CHAT, "docs here", entities=[link])
    assert len(fake.sent_messages(DM_CHAT)) == sent_before


@pytest.mark.parametrize("url", ["https://en.wikipedia.org/wiki/Foo_(bar)", "http://192.168.0.1:8080/x",
                                 "example.com/path", "tg://user?id=5550001", "mailto:bob@example.com",
                                 "https://[2001:db8::1]/"])
async def test_text_link_urls_tdlib_accepts(fake: FakeTelegram, bot: Bot, url: str) -> None:
    msg = await bot.send_message(DM_CHAT, "docs here", entities=[MessageEntity(MessageEntity.TEXT_LINK, 0, 4, url=url)])
    assert fake.sent_messages(DM_CHAT)[-1]["message_id"] == msg.message_id


async def test_parse_modes(bot: Bot) -> None:
    with pytest.raises(BadRequest, match=r"(?i)can't parse entities: character '.' is reserved"):
        await bot.send_message(DM_CHAT, "Hello.", parse_mode="MarkdownV2")
    msg = await bot.send_message(DM_CHAT, "*bold* ok\\.", parse_mode="MarkdownV2")
    assert msg.text == "bold ok." and msg.entities[0].type == MessageEntity.BOLD
    msg = await bot.send_message(DM_CHAT, "<b>hi</b> &lt;3", parse_mode="HTML")
    assert msg.text == "hi <3" and msg.entities[0].length == 2
    for bad in ("<foo>x</foo>", "a < b", "<b>unclosed"):
        with pytest.raises(BadRequest, match=r"(?i)can't parse entities"):
            await bot.send_message(DM_CHAT, bad, parse_mode="HTML")


async def test_injected_update_polled_then_confirmed(fake: FakeTelegram, bot: Bot) -> None:
    raw = load("dm_text.json")
    assert fake.inject(raw) == raw["update_id"]
    updates = await bot.get_updates(offset=0, timeout=1)
    assert [u.update_id for u in updates] == [raw["update_id"]]
    parsed = Update.de_json(raw, bot)
    assert updates[0].message.text == parsed.message.text == "Hello! Can you summarise today's notes?"
    last = updates[-1].update_id
    assert await bot.get_updates(offset=last + 1, timeout=0) == ()
    assert fake.confirmed_offset == last + 1

    # A replayed duplicate keeps its id and is delivered once more despite the confirmed offset.
    assert fake.inject(load("dm_text_duplicate.json")) == last
    again = await bot.get_updates(offset=last + 1, timeout=0)
    assert [u.update_id for u in again] == [last]
    assert await bot.get_updates(offset=last + 1, timeout=0) == ()
    assert fake.inject({"message": raw["message"]}) == last + 1  # assigned id
    assert [u.update_id for u in await bot.get_updates(offset=last + 1, timeout=0)] == [last + 1]
    assert await bot.get_updates(offset=last + 2, timeout=0) == ()


async def test_long_poll_wakes_on_inject_and_overlap_conflicts(fake: FakeTelegram, bot: Bot) -> None:
    offset = fake.confirmed_offset
    poll = asyncio.create_task(bot.get_updates(offset=offset, timeout=5))
    await fake.wait_for_call("getUpdates", lambda c: c.params.get("timeout") == 5)
    threading.Timer(0.05, fake.inject, args=({"message": load("dm_text.json")["message"]},)).start()
    got = await asyncio.wait_for(poll, 2)
    assert len(got) == 1
    offset = got[0].update_id + 1

    # PTB keeps one connection for getUpdates per Bot, so the overlap needs a second bot instance.
    older = asyncio.create_task(bot.get_updates(offset=offset, timeout=3))
    await fake.wait_for_call("getUpdates", lambda c: c.params.get("timeout") == 3)
    async with make_bot(fake) as other:
        assert await other.get_updates(offset=offset, timeout=0) == ()
    with pytest.raises(Conflict, match="terminated by other getUpdates"):
        await asyncio.wait_for(older, 2)


@pytest.mark.filterwarnings("ignore::telegram.warnings.PTBDeprecationWarning")
async def test_fail_next_retry_after(fake: FakeTelegram, bot: Bot) -> None:
    fake.fail_next("sendMessage", 429, "Too Many Requests: retry after 1", {"retry_after": 1})
    with pytest.raises(RetryAfter) as info:
        await bot.send_message(DM_CHAT, "hi")
    assert info.value.retry_after == 1
    assert (await bot.send_message(DM_CHAT, "hi")).text == "hi"


async def test_edit_message_text(fake: FakeTelegram, bot: Bot) -> None:
    msg = await bot.send_message(DM_CHAT, "draft")
    with pytest.raises(BadRequest, match=r"(?i)message is not modified"):
        await bot.edit_message_text("draft", chat_id=DM_CHAT, message_id=msg.message_id)
    edited = await bot.edit_message_text("final", chat_id=DM_CHAT, message_id=msg.message_id)
    assert edited.text == "final" and edited.message_id == msg.message_id
    assert fake.sent_messages(DM_CHAT)[-1]["text"] == "final"
    with pytest.raises(BadRequest, match=r"(?i)message to edit not found"):
        await bot.edit_message_text("x", chat_id=DM_CHAT, message_id=999999)
    assert await bot.delete_message(DM_CHAT, msg.message_id)
    assert all(m["message_id"] != msg.message_id for m in fake.sent_messages(DM_CHAT))


async def test_upload_get_file_and_download(fake: FakeTelegram, bot: Bot) -> None:
    msg = await bot.send_document(DM_CHAT, document=b"hello bytes", filename="a.txt", caption="<i>doc</i>",
                                  parse_mode="HTML")
    assert msg.caption == "doc" and msg.document.file_name == "a.txt"
    assert fake.calls("sendDocument")[-1].files[0]["size"] == len(b"hello bytes")
    file = await bot.get_file(msg.document.file_id)
    assert await file.download_as_bytearray() == bytearray(b"hello bytes")
    assert await bot.send_chat_action(DM_CHAT, "typing")
    call = await fake.wait_for_call("sendChatAction", lambda c: c.params["action"] == "typing")
    assert call.params["chat_id"] == DM_CHAT


async def test_webhook_mode(fake: FakeTelegram, bot: Bot) -> None:
    received: list[tuple[str | None, dict]] = []

    async def handler(request: web.Request) -> web.Response:
        received.append((request.headers.get("X-Telegram-Bot-Api-Secret-Token"), await request.json()))
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/telegram/webhook", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/telegram/webhook"  # type: ignore[union-attr]
    try:
        assert await bot.set_webhook(url, secret_token="s3cret")
        assert (await bot.get_webhook_info()).url == url
        with pytest.raises(Conflict, match="webhook is active"):
            await bot.get_updates(timeout=0)
        assert await fake.post_webhook(None, load("callback_query.json")) == 200
        assert received[0][0] == "s3cret" and received[0][1]["callback_query"]["data"] == "regen:101"
    finally:
        await bot.delete_webhook()
        await runner.cleanup()
    assert await bot.get_updates(timeout=0) is not None


@pytest.mark.parametrize(("commands", "description"), [
    ([("help", "Help"), ("help", "Help again")], "Bot_command_invalid"),  # a duplicate
    ([("Help", "Help")], "Bot_command_invalid"),  # upper case
    ([("do-it", "Dash")], "Bot_command_invalid"),
    ([("x" * 33, "Too long")], "Command length must not exceed 32"),
    ([("help", "   ")], "Command description must be non-empty"),
    ([("help", "d" * 257)], "Command description length must not exceed 256"),
    ([(f"c{i}", "Command") for i in range(101)], "Bot_commands_too_much"),
])
async def test_set_my_commands_rules(fake: FakeTelegram, bot: Bot, commands, description) -> None:
    """Telegram Bot API setMyCommands: unique commands of 1-32 a-z/0-9/_, at most 100,
    descriptions 1-256 characters; PTB shows the description without "Bad Request: ", capitalized."""
    from telegram import BotCommand, BotCommandScopeAllPrivateChats

    fake.commands.clear()
    with pytest.raises(BadRequest) as raised:
        await bot.set_my_commands([BotCommand(n, d) for n, d in commands], scope=BotCommandScopeAllPrivateChats())
    assert raised.value.message == description
    assert fake.commands == {}  # the menu stays as it was


async def test_menus_per_scope_and_chat_scope_needs_a_known_chat(fake: FakeTelegram, bot: Bot) -> None:
    from telegram import BotCommand, BotCommandScopeAllGroupChats, BotCommandScopeAllPrivateChats, BotCommandScopeChat

    fake.commands.clear()
    assert await bot.set_my_commands([BotCommand(f"c{i}", "Command") for i in range(100)],
                                     scope=BotCommandScopeAllPrivateChats())
    assert await bot.set_my_commands([BotCommand("help", "Help")], scope=BotCommandScopeAllGroupChats())
    with pytest.raises(BadRequest, match="Chat not found"):
        await bot.set_my_commands([BotCommand("admin", "Admin")], scope=BotCommandScopeChat(5559999))
    fake.add_chat({"id": 5559999, "type": "private", "first_name": "Ada"})
    assert await bot.set_my_commands([BotCommand("admin", "Admin")], scope=BotCommandScopeChat(5559999))
    assert len(fake.menu(5550001)) == 100 and fake.menu(-4000000001) == ["help"]
    assert fake.menu(5559999) == ["admin"]  # the chat scope wins over all private chats
    assert [c.command for c in await bot.get_my_commands(scope=BotCommandScopeAllGroupChats())] == ["help"]
    assert await bot.delete_my_commands(scope=BotCommandScopeChat(5559999))
    assert len(fake.menu(5559999)) == 100
