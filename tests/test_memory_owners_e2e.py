"""Long-term memory never crosses owners, end to end: the real gateway, python-telegram-bot and
slack-sdk against the loopback fakes. A user's DM entry must never reach a group turn or another
user's turn (before and after ``/link``, and after ``/unlink``), neither in the recall block of the
user message nor in a ``recall_memory`` tool result; it follows its user to every linked account.

Every question asks the fake model, which answers it with a ``recall_memory`` call, so each
question is two model requests: the first carries the recall block, the second the tool result.
What the model received is read from the fake OpenAI's recorded requests (every message, the
system prompt included)."""

from __future__ import annotations

import json
import re

import pytest

from tests.conftest import gateway_config, start_gateway
from tests.fakes import openai as oa
from tests.helpers import wait_until
from tests.test_memory_e2e import memory_lines
from tests.test_sessions_e2e import slack_texts, tg_command, tg_texts
from tests.test_slack_e2e import events_url, message
from tests.test_telegram_e2e import dm_update

SECRET = "QZ8264"
"""The entry's secret: not hex, so no random id sent to the model (``call_<hex>``) can contain it."""
BOT_MENTION = "<@U0BOT00001>"  # the fake Slack's bot user


def respond(request: dict) -> oa.Reply:
    """A question ("... locker code? [tag]") gets a ``recall_memory`` call, its result an "ok"."""
    last = request["messages"][-1]
    if last["role"] == "user" and "locker code?" in last["content"]:
        return oa.tool_calls(oa.call("recall_memory", {"query": "locker code"}))
    return oa.text("ok")


def requests_of(fake, tag: str) -> list[dict]:
    """The model requests of the turn asking question ``tag`` (its newest user message has it)."""
    found = []
    for record in fake.requests:
        users = [m["content"] for m in record["json"]["messages"] if m["role"] == "user"]
        if users and f"[{tag}]" in users[-1]:
            found.append(record["json"])
    return found


def recalled(fake, tag: str) -> tuple[list[str], str, str]:
    """``(recall block lines, recall_memory result, everything the model was sent)`` of question
    ``tag``. The block lines are those of every user message sent (an entry shown earlier in the
    conversation is not repeated: the earlier block is part of the history)."""
    first, second = requests_of(fake, tag)
    users = [m["content"] for m in first["messages"] if m["role"] == "user"]
    (result,) = [m["content"] for m in second["messages"][len(first["messages"]):] if m["role"] == "tool"]
    return [line for user in users for line in memory_lines(user)], result, json.dumps(first) + json.dumps(second)


def assert_sees_secret(fake, tag: str) -> None:
    block, result, _ = recalled(fake, tag)
    assert any(SECRET in line for line in block), f"{tag}: the owner's entry was not in any recall block: {block}"
    assert SECRET in result, f"{tag}: recall_memory did not find the owner's entry: {result}"


def assert_never_sees_secret(fake, tag: str) -> None:
    block, result, everything = recalled(fake, tag)
    assert block == [] and '<tool_output tool="recall_memory" trust="untrusted">\nNo memory entries match.\n' \
        in result, (tag, block, result)
    assert SECRET not in everything, f"{tag}: another owner's memory reached this turn"


def tg_group_mention(text: str, message_id: int, user_id: int, name: str, group: int) -> dict:
    update = dm_update(f"@gateway_test_bot {text}", message_id, user_id=user_id)
    update["message"]["from"]["first_name"] = name
    update["message"]["chat"] = {"id": group, "title": "Lockers", "type": "group"}
    update["message"]["entities"] = [{"type": "mention", "offset": 0, "length": 17}]
    return update


def question(tag: str) -> str:
    return f"what is my locker code? [{tag}]"


async def asked(fake_openai, tag: str) -> None:
    await wait_until(lambda: len(requests_of(fake_openai, tag)) == 2, timeout=15, what=f"both requests of {tag}")


@pytest.mark.parametrize("group_scope", ["chat", "user"])
async def test_a_dm_entry_never_reaches_a_group_turn_or_another_user(tmp_path, fake_telegram, fake_openai, running,
                                                                     group_scope):
    fake_openai.reset()
    fake_openai.responder = respond
    await start_gateway(gateway_config(tmp_path, fake_openai, fake_telegram,
                                       sessions={"group_scope": group_scope}), running)
    base = 1000 if group_scope == "chat" else 2000
    alice, bob, group = 5563000 + base, 5563500 + base, -4000000000 - base  # fresh chats per test
    fake_telegram.inject(dm_update(f"remember my locker code is {SECRET}", base + 1, user_id=alice))
    await wait_until(lambda: len(tg_texts(fake_telegram, alice)) == 1, what="the entry saved")

    # Alice herself, in a group: the group's memory (or hers in that group), never her DM's.
    fake_telegram.inject(tg_group_mention(question(f"alice-group-{group_scope}"), base + 2, alice, "Alice", group))
    await asked(fake_openai, f"alice-group-{group_scope}")
    assert_never_sees_secret(fake_openai, f"alice-group-{group_scope}")
    # Bob, in the same group and in his DM.
    fake_telegram.inject(tg_group_mention(question(f"bob-group-{group_scope}"), base + 3, bob, "Bob", group))
    await asked(fake_openai, f"bob-group-{group_scope}")
    assert_never_sees_secret(fake_openai, f"bob-group-{group_scope}")
    fake_telegram.inject(dm_update(question(f"bob-dm-{group_scope}"), base + 4, user_id=bob))
    await asked(fake_openai, f"bob-dm-{group_scope}")
    assert_never_sees_secret(fake_openai, f"bob-dm-{group_scope}")
    # The control: in her DM, Alice gets her entry both ways.
    fake_telegram.inject(dm_update(question(f"alice-dm-{group_scope}"), base + 5, user_id=alice))
    await asked(fake_openai, f"alice-dm-{group_scope}")
    assert_sees_secret(fake_openai, f"alice-dm-{group_scope}")


def link_code(reply: str) -> str:
    match = re.search(r"/link ([A-Z0-9]{5}-[A-Z0-9]{5})", reply)
    assert match, reply
    return match.group(1)


async def test_after_link_the_entry_follows_its_user_to_slack_but_never_to_a_group_or_another_user(
        tmp_path, fake_telegram, fake_slack, fake_openai, running):
    """Alice saves on Telegram, links Slack to it (``/link`` on Telegram, ``/link CODE`` on Slack),
    then ``/unlink``s Slack again."""
    fake_openai.reset()
    fake_openai.responder = respond
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai, fake_telegram, fake_slack=fake_slack),
                                  running)
    alice, bob, group = 5566001, 5566002, -4000006000  # fresh chats per test (the fakes live for the module)
    slack = SlackUser(fake_slack, events_url(gateway), "U0ALICE101", "D0OWNALIC1")
    slack_bob = SlackUser(fake_slack, events_url(gateway), "U0BOB00101", "D0OWNBOB01")
    fake_telegram.inject(dm_update(f"remember my locker code is {SECRET}", 3001, user_id=alice))
    fake_telegram.inject(tg_command("/link", 3002, alice))
    await wait_until(lambda: len(tg_texts(fake_telegram, alice)) == 2, what="the link code")
    assert (await slack.command(f"/link {link_code(tg_texts(fake_telegram, alice)[-1])}")).startswith("Linked.")

    await slack.say(question("slack-dm"))
    await asked(fake_openai, "slack-dm")
    assert_sees_secret(fake_openai, "slack-dm")  # it follows Alice
    await slack.say(f"{BOT_MENTION} {question('slack-channel')}", channel="C0OWNERS01")
    await asked(fake_openai, "slack-channel")
    assert_never_sees_secret(fake_openai, "slack-channel")  # not into a channel, even on her own mention
    fake_telegram.inject(tg_group_mention(question("telegram-group"), 3003, alice, "Alice", group))
    await asked(fake_openai, "telegram-group")
    assert_never_sees_secret(fake_openai, "telegram-group")
    await slack_bob.say(question("slack-bob"))
    await asked(fake_openai, "slack-bob")
    assert_never_sees_secret(fake_openai, "slack-bob")
    fake_telegram.inject(dm_update(question("telegram-bob"), 3004, user_id=bob))
    await asked(fake_openai, "telegram-bob")
    assert_never_sees_secret(fake_openai, "telegram-bob")

    assert (await slack.command("/unlink")).startswith("This account is unlinked")
    await slack.say(question("slack-unlinked"))
    await asked(fake_openai, "slack-unlinked")
    assert_never_sees_secret(fake_openai, "slack-unlinked")  # neither recalled nor in the history sent
    fake_telegram.inject(dm_update(question("telegram-after-unlink"), 3005, user_id=alice))
    await asked(fake_openai, "telegram-after-unlink")
    assert_sees_secret(fake_openai, "telegram-after-unlink")  # the account the entries were saved on keeps them


async def test_linking_from_the_account_that_holds_the_memory_brings_it_along(
        tmp_path, fake_telegram, fake_slack, fake_openai, running):
    """The code comes from Slack and Telegram (where the entry was saved) sends ``/link CODE``:
    Telegram's account joins the Slack one, and its entries come along, seen on both platforms
    together with the Slack account's own, still never by Bob or in a group."""
    fake_openai.reset()
    fake_openai.responder = respond
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai, fake_telegram, fake_slack=fake_slack),
                                  running)
    alice, bob, group = 5567001, 5567002, -4000007000
    slack = SlackUser(fake_slack, events_url(gateway), "U0ALICE102", "D0OWNALIC2")
    fake_telegram.inject(dm_update(f"remember my locker code is {SECRET}", 4001, user_id=alice))
    await wait_until(lambda: len(tg_texts(fake_telegram, alice)) == 1, what="the entry saved")
    await slack.command("remember my bike is green")
    fake_telegram.inject(tg_command(f"/link {link_code(await slack.command('/link'))}", 4002, alice))
    await wait_until(lambda: len(tg_texts(fake_telegram, alice)) == 2, what="linked")
    assert tg_texts(fake_telegram, alice)[1].startswith("Linked.")

    await slack.say(question("joined-slack"))
    await asked(fake_openai, "joined-slack")
    assert_sees_secret(fake_openai, "joined-slack")
    fake_telegram.inject(dm_update(question("joined-telegram"), 4003, user_id=alice))
    await asked(fake_openai, "joined-telegram")
    assert_sees_secret(fake_openai, "joined-telegram")
    listing = await slack.command("/memory")
    assert f"locker code is {SECRET}" in listing and "bike is green" in listing and "2 in use" in listing

    fake_telegram.inject(tg_group_mention(question("joined-group"), 4005, alice, "Alice", group))
    await asked(fake_openai, "joined-group")
    assert_never_sees_secret(fake_openai, "joined-group")
    fake_telegram.inject(dm_update(question("joined-bob"), 4006, user_id=bob))
    await asked(fake_openai, "joined-bob")
    assert_never_sees_secret(fake_openai, "joined-bob")


class SlackUser:
    """One Slack account writing signed events to the gateway (DM by default)."""

    def __init__(self, fake, url: str, user: str, dm: str) -> None:
        self.fake, self.url, self.user, self.dm = fake, url, user, dm
        self.sent = 0

    async def say(self, text: str, channel: str | None = None) -> None:
        self.sent += 1
        ts = f"18000{abs(hash(self.user)) % 10000:04d}.{self.sent:06d}"
        assert (await self.fake.post_event(self.url, message(text, ts, channel=channel or self.dm,
                                                             user=self.user))).status == 200

    async def command(self, text: str) -> str:
        """Says ``text`` in the DM and returns the bot's next post there."""
        before = len(slack_texts(self.fake, self.dm))
        await self.say(text)
        await wait_until(lambda: len(slack_texts(self.fake, self.dm)) > before, what=f"the answer to {text}")
        return slack_texts(self.fake, self.dm)[before]
