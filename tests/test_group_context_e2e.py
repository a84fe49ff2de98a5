"""Group context end to end (python-telegram-bot, slack-bolt and openai against the fakes): with
``sessions.group_context_messages`` on, the group messages the bot received but that were not for
it are kept (cleaned, redacted, per chat, trimmed) and shown with the next mention in that chat, once;
off, nothing is kept or shown; another group's messages never appear; the request prefix (system
prompt + tools) is byte-identical in every turn."""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy import func, select

from gateway.store.models import GroupMessageRow
from tests.conftest import gateway_config, start_gateway
from tests.fakes import openai as oa
from tests.helpers import wait_until

GROUP_A, GROUP_B = -1001000000401, -1001000000402
MENTION = "@gateway_test_bot"
PEOPLE = {"Bob": 5550002, "Carol": 5550003, "Dan": 5550004}


def plain(chat_id: int, message_id: int, author: str, text: str) -> dict[str, Any]:
    return {"message": {"message_id": message_id, "from": {"id": PEOPLE[author], "is_bot": False, "first_name": author},
                        "chat": {"id": chat_id, "title": f"Team {chat_id}", "type": "supergroup"},
                        "date": 1735689000 + message_id, "text": text}}


def mention(chat_id: int, message_id: int, text: str) -> dict[str, Any]:
    update = plain(chat_id, message_id, "Bob", f"{MENTION} {text}")
    update["message"]["entities"] = [{"type": "mention", "offset": 0, "length": len(MENTION)}]
    return update


def answered(fake, chat_id: int, message_id: int) -> bool:
    return any(int(c.params["chat_id"]) == chat_id and c.params.get("reply_parameters", {}).get("message_id")
               == message_id for c in fake.calls("sendMessage"))


def context_lines(turn: str) -> list[str]:
    return [line.split("UTC] ", 1)[1] for line in turn.splitlines() if "UTC] " in line]


def kept(gateway, chat_id: int | str | None = None) -> int:
    query = select(func.count()).select_from(GroupMessageRow)
    if chat_id is not None:
        query = query.where(GroupMessageRow.chat_id == str(chat_id))
    with gateway.engine.connect() as conn:
        return conn.execute(query).scalar_one()


async def test_group_context_on_shows_the_unaddressed_messages_of_that_group_only(tmp_path, fake_telegram,
                                                                                 fake_openai, running):
    fake_openai.reset()
    fake_openai.responder = lambda req: oa.text(f"answer {len(fake_openai.requests)}")
    fake_telegram.can_read_all_group_messages = True  # privacy mode off: Telegram delivers every message
    try:
        config = gateway_config(tmp_path, fake_openai, fake_telegram, sessions={"group_context_messages": 4})
        gateway = await start_gateway(config, running)
        fake_telegram.inject(plain(GROUP_A, 101, "Carol", "the staging deploy is red again"))
        fake_telegram.inject(plain(GROUP_B, 102, "Dan", "group B: lunch at noon?"))
        fake_telegram.inject(plain(GROUP_A, 103, "Dan", "it's the flaky auth test"))
        fake_telegram.inject(plain(GROUP_B, 104, "Dan", "group B: budget is approved"))
        fake_telegram.inject(plain(GROUP_A, 105, "Carol", f"token for the runner: {fake_telegram.token}"))
        fake_telegram.inject(mention(GROUP_A, 106, "what is going on with staging?"))
        await wait_until(lambda: answered(fake_telegram, GROUP_A, 106), what="the mention's answer")

        first = fake_openai.requests[0]["json"]
        turn = first["messages"][-1]["content"]
        assert context_lines(turn) == ["Carol: the staging deploy is red again", "Dan: it's the flaky auth test",
                                       "Carol: token for the runner: ***"]
        assert "not addressed to you" in turn and '<chat_context trust="untrusted">' in turn
        assert "group B" not in turn and fake_telegram.token not in turn
        assert turn.endswith("what is going on with staging?")
        assert kept(gateway, GROUP_A) == 3 and kept(gateway, GROUP_B) == 2
        with gateway.engine.connect() as conn:  # stored redacted, like the inbox
            texts = conn.execute(select(GroupMessageRow.text)).scalars().all()
        assert not any(fake_telegram.token in text for text in texts)

        # The next mention shows only what was said since; the first turn is replayed as it was.
        fake_telegram.inject(plain(GROUP_A, 107, "Dan", "fixed by pinning the mock server"))
        fake_telegram.inject(mention(GROUP_A, 108, "and now?"))
        await wait_until(lambda: answered(fake_telegram, GROUP_A, 108), what="the second answer")
        second = fake_openai.requests[1]["json"]
        assert context_lines(second["messages"][-1]["content"]) == ["Dan: fixed by pinning the mock server"]
        assert second["messages"][1]["content"] == turn

        # Group B's mention sees group B's messages, none of group A's.
        fake_telegram.inject(mention(GROUP_B, 109, "summary please"))
        await wait_until(lambda: answered(fake_telegram, GROUP_B, 109), what="group B's answer")
        third = fake_openai.requests[2]["json"]
        assert context_lines(third["messages"][-1]["content"]) == ["Dan: group B: lunch at noon?",
                                                                   "Dan: group B: budget is approved"]

        # Retention by count: at most group_context_messages per chat are kept.
        for i in range(6):
            fake_telegram.inject(plain(GROUP_B, 110 + i, "Dan", f"chatter {i}"))
        fake_telegram.inject(mention(GROUP_B, 120, "last one"))
        await wait_until(lambda: answered(fake_telegram, GROUP_B, 120), what="the last answer")
        assert kept(gateway, GROUP_B) == 4
        assert context_lines(fake_openai.requests[3]["json"]["messages"][-1]["content"]) == [
            f"Dan: chatter {i}" for i in range(2, 6)]

        # The prefix never moved: the same system prompt and tools bytes in every request.
        prefixes = {(repr(r["json"]["messages"][0]), repr(r["json"]["tools"])) for r in fake_openai.requests}
        assert len(prefixes) == 1 and len(fake_openai.requests) == 4
    finally:
        fake_telegram.can_read_all_group_messages = False


async def test_group_context_off_keeps_and_shows_nothing(tmp_path, fake_telegram, fake_openai, running):
    fake_openai.reset()
    fake_openai.script(oa.text("no context"))
    fake_telegram.can_read_all_group_messages = True
    try:
        gateway = await start_gateway(gateway_config(tmp_path, fake_openai, fake_telegram), running)
        for i, text in enumerate(["one", "two", "three"]):
            fake_telegram.inject(plain(GROUP_A, 201 + i, "Carol", f"unaddressed {text}"))
        fake_telegram.inject(mention(GROUP_A, 204, "anything new?"))
        await wait_until(lambda: answered(fake_telegram, GROUP_A, 204), what="the answer")
    finally:
        fake_telegram.can_read_all_group_messages = False
    turn = fake_openai.requests[0]["json"]["messages"][-1]["content"]
    assert "<chat_context" not in turn and "unaddressed" not in turn
    assert kept(gateway) == 0 and gateway.received == 1


async def test_privacy_mode_on_warns_that_group_context_stays_empty(tmp_path, fake_telegram, fake_openai, running,
                                                                    caplog):
    caplog.set_level(logging.WARNING, logger="adapters.telegram")
    config = gateway_config(tmp_path, fake_openai, fake_telegram, sessions={"group_context_messages": 10})
    await start_gateway(config, running)
    assert "group context (sessions.group_context_messages) stays empty" in caplog.text
    assert "/setprivacy" in caplog.text


SLACK_CHANNEL = "C0GENERAL1"


def slack_message(text: str, ts: str, user: str = "U0ALICE001", **extra: Any) -> dict[str, Any]:
    return {"type": "message", "user": user, "text": text, "ts": ts, "channel": SLACK_CHANNEL,
            "channel_type": "channel", "event_ts": ts, "team": "T0FAKE0001", **extra}


async def test_slack_channel_chatter_is_context_for_a_top_level_mention(tmp_path, fake_slack, fake_openai, running):
    fake_openai.reset()
    fake_openai.script(oa.text("seen it"))
    config = gateway_config(tmp_path, fake_openai, fake_slack=fake_slack,
                            sessions={"group_context_chats": {f"slack:{SLACK_CHANNEL}": 5}})
    gateway = await start_gateway(config, running)
    url = f"http://127.0.0.1:{gateway.http_port}/slack/events"
    since = len(fake_slack.calls("chat.postMessage"))
    for ts, user, text in [("1735693000.000100", "U0ALICE001", "the invoice run failed"),
                           ("1735693100.000200", "U0BOB00001", "only for EU customers <@U0ALICE001>")]:
        assert (await fake_slack.post_event(url, slack_message(text, ts, user))).status == 200
    # A reply in a thread the bot is not part of is kept for that thread, not for the channel.
    side = slack_message("side thread talk", "1735693150.000250", thread_ts="1735693000.000100")
    assert (await fake_slack.post_event(url, side)).status == 200
    mention = dict(slack_message("<@U0BOT00001> can you look?", "1735693200.000300", "U0BOB00001"),
                   type="app_mention")
    assert (await fake_slack.post_event(url, mention)).status == 200
    await wait_until(lambda: len([c for c in fake_slack.calls("chat.postMessage")[since:]
                                  if c.params.get("thread_ts") == "1735693200.000300"]) == 1, what="the reply")
    turn = fake_openai.requests[0]["json"]["messages"][-1]["content"]
    assert context_lines(turn) == ["Alice: the invoice run failed", "Bob: only for EU customers @Alice"]
    assert "side thread" not in turn
    assert kept(gateway, SLACK_CHANNEL) == 3


FEISHU_GROUP = "oc_fakegroup0000000000000000000401"
FEISHU_BOB = "ou_fakebob000000000000000000000001"


async def test_feishu_group_chatter_is_context_for_a_mention(tmp_path, fake_feishu, fake_openai, running):
    fake_feishu.reset()
    fake_openai.reset()
    fake_openai.script(oa.text("noted"))
    config = gateway_config(tmp_path, fake_openai, fake_feishu=fake_feishu,
                            sessions={"group_context_messages": 3})
    gateway = await start_gateway(config, running)
    url = f"http://127.0.0.1:{gateway.http_port}/feishu/events"
    for text in ("the vendor call moved to Thursday", "and the contract is still unsigned"):
        body = fake_feishu.text_event(text, chat_id=FEISHU_GROUP, chat_type="group", sender=FEISHU_BOB)
        assert (await fake_feishu.post_event(url, body))[0] == 200
    other = fake_feishu.text_event("another group's news", chat_id="oc_fakeothergroup000000000000001",
                                   chat_type="group", sender=FEISHU_BOB)
    assert (await fake_feishu.post_event(url, other))[0] == 200
    ask = fake_feishu.text_event("what changed?", chat_id=FEISHU_GROUP, chat_type="group", mention_bot=True)
    assert (await fake_feishu.post_event(url, ask))[0] == 200
    await fake_feishu.wait_for_call("reply", lambda c: ask["event"]["message"]["message_id"] in c.path)
    turn = fake_openai.requests[0]["json"]["messages"][-1]["content"]
    assert context_lines(turn) == ["Bob: the vendor call moved to Thursday", "Bob: and the contract is still unsigned"]
    assert "another group" not in turn and kept(gateway) == 3


def removed(chat_id: int, bot: dict[str, Any]) -> dict[str, Any]:
    """Telegram's ``my_chat_member`` update for the bot being removed from a group."""
    chat = {"id": chat_id, "title": f"Team {chat_id}", "type": "supergroup"}
    admin = {"id": PEOPLE["Carol"], "is_bot": False, "first_name": "Carol"}
    return {"my_chat_member": {"chat": chat, "from": admin, "date": 1735690000,
                               "old_chat_member": {"status": "member", "user": bot},
                               "new_chat_member": {"status": "kicked", "user": bot, "until_date": 0}}}


async def test_leaving_a_chat_deletes_what_was_kept_of_it(tmp_path, fake_telegram, fake_slack, fake_feishu,
                                                          fake_openai, running):
    fake_feishu.reset()
    fake_openai.reset()
    config = gateway_config(tmp_path, fake_openai, fake_telegram, fake_slack=fake_slack, fake_feishu=fake_feishu,
                            sessions={"group_context_messages": 5})
    gateway = await start_gateway(config, running)
    fake_telegram.inject(plain(GROUP_A, 301, "Carol", "kept for a while"))
    fake_telegram.inject(plain(GROUP_B, 302, "Dan", "kept in the other group"))
    await wait_until(lambda: kept(gateway) == 2, what="both kept")
    polls = fake_telegram.calls("getUpdates")
    assert "my_chat_member" in polls[-1].params["allowed_updates"]  # Telegram sends only what is asked for
    fake_telegram.inject(removed(GROUP_A, fake_telegram.bot_user()))
    await wait_until(lambda: kept(gateway, GROUP_A) == 0, what="group A forgotten")
    assert kept(gateway, GROUP_B) == 1

    slack_url = f"http://127.0.0.1:{gateway.http_port}/slack/events"
    assert (await fake_slack.post_event(slack_url, slack_message("channel news", "1735694000.000100"))).status == 200
    await wait_until(lambda: kept(gateway, SLACK_CHANNEL) == 1, what="the Slack message kept")
    left = {"type": "channel_left", "channel": SLACK_CHANNEL, "actor_id": "U0ALICE001", "event_ts": "1735694100.1"}
    assert (await fake_slack.post_event(slack_url, left)).status == 200
    await wait_until(lambda: kept(gateway, SLACK_CHANNEL) == 0, what="the Slack channel forgotten")

    feishu_url = f"http://127.0.0.1:{gateway.http_port}/feishu/events"
    chatter = fake_feishu.text_event("feishu news", chat_id=FEISHU_GROUP, chat_type="group", sender=FEISHU_BOB)
    assert (await fake_feishu.post_event(feishu_url, chatter))[0] == 200
    await wait_until(lambda: kept(gateway, FEISHU_GROUP) == 1, what="the Feishu message kept")
    bot_removed = {"schema": "2.0", "header": {**chatter["header"], "event_id": "ev-bot-removed-1",
                                               "event_type": "im.chat.member.bot.deleted_v1"},
                   "event": {"chat_id": FEISHU_GROUP, "external": False,
                             "operator_id": {"open_id": FEISHU_BOB, "union_id": "", "user_id": ""}}}
    assert (await fake_feishu.post_event(feishu_url, bot_removed))[0] == 200
    await wait_until(lambda: kept(gateway, FEISHU_GROUP) == 0, what="the Feishu chat forgotten")
    assert kept(gateway, GROUP_B) == 1
