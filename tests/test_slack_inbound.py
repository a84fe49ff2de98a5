"""``adapters.slack.inbound``: the shared Slack fixtures against their ``expected.json``, plus the
rules the fixtures do not cover (threads without a mention, other bots, subtypes, markup)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from adapters.slack.inbound import BotIdentity, Ignored, plain_text, to_inbound, users_to_resolve
from gateway.core.types import InboundMessage
from tests.conftest import fixture

EXPECTED = fixture("slack", "expected.json")
BOT = BotIdentity(EXPECTED["_app"]["bot_user_id"], EXPECTED["_app"]["bot_id"], EXPECTED["_app"]["team_id"])
EVENT_FIXTURES = sorted(name for name in EXPECTED if name.endswith(".json") and name != "url_verification.json")
# Fixtures that normalize to a turn although expected.json says no reply: the inbox drops them as
# duplicates of an earlier delivery (same channel:ts), which the e2e tests check.
DUPLICATES = {"channel_message_with_mention.json": "channel_app_mention.json",
              "channel_app_mention_retry.json": "channel_app_mention.json"}


def envelope(name: str) -> dict[str, Any]:
    body = fixture("slack", name)
    return body["payload"] if body.get("type") == "events_api" else body  # Socket Mode frame


@pytest.mark.parametrize("name", EVENT_FIXTURES)
def test_fixture_normalizes_as_expected(name: str) -> None:
    result = to_inbound(envelope(name), BOT, {"U0ALICE001": "Alice"})
    if not EXPECTED[name]["should_reply"] and name not in DUPLICATES:
        assert isinstance(result, Ignored), result
        return
    expected = EXPECTED[DUPLICATES.get(name, name)]  # a duplicate normalizes like its original
    assert isinstance(result, InboundMessage), result
    assert result.platform == "slack"
    assert result.address.tenant == expected["tenant"]
    assert result.address.chat_id == expected["chat_id"]
    assert result.chat_type == expected["chat_type"]
    assert result.address.thread_id == expected.get("session_thread", expected["thread_id"])
    assert result.sender.user_id == expected["user_id"]
    assert result.message_id == expected["platform_message_id"]
    assert result.text == expected["text"]
    assert result.addressed
    got = [(a.kind, a.file_id, a.name, a.mime_type, a.size) for a in result.attachments]
    assert got == [(a["kind"], a["id"], a["name"], a["mime_type"], a["size"]) for a in expected["attachments"]]
    reply = expected["reply"]
    assert (result.address.chat_id, result.address.thread_id) == (reply["channel"], reply["thread_ts"])
    if name in DUPLICATES:
        original = to_inbound(envelope(DUPLICATES[name]), BOT, {"U0ALICE001": "Alice"})
        assert isinstance(original, InboundMessage)
        assert (result.message_id, result.address, result.text) == (
            original.message_id, original.address, original.text)


def test_ignore_reasons() -> None:
    assert to_inbound(envelope("bot_own_message.json"), BOT) == Ignored("own_message")
    assert to_inbound(envelope("message_changed.json"), BOT) == Ignored("subtype:message_changed")
    assert to_inbound(envelope("channel_message_no_mention.json"), BOT) == Ignored("not_addressed")
    assert to_inbound(fixture("slack", "url_verification.json"), BOT) == Ignored("not_an_event")
    edit = {"user": "U0ALICE001", "ts": "1735689900.000000"}  # app_mention re-sent for an edited message
    assert to_inbound(edited("channel_app_mention.json", edited=edit), BOT) == Ignored("edited")


def edited(name: str, **event: Any) -> dict[str, Any]:
    body = copy.deepcopy(envelope(name))
    for key, value in event.items():
        if value is None:
            body["event"].pop(key, None)
        else:
            body["event"][key] = value
    return body


def test_own_messages_are_ignored_in_every_channel_type() -> None:
    for channel, channel_type in (("D0ALICE001", "im"), ("C0GENERAL1", "channel"), ("G0PRIVATE1", "group"),
                                  ("G0MPIM0001", "mpim")):
        by_user = edited("dm_message.json", user="U0BOT00001", channel=channel, channel_type=channel_type)
        by_bot_id = edited("dm_message.json", user=None, bot_id="B0BOT00001", subtype="bot_message",
                           channel=channel, channel_type=channel_type)
        assert to_inbound(by_user, BOT) == Ignored("own_message")
        assert to_inbound(by_bot_id, BOT) == Ignored("own_message")
        assert to_inbound(by_bot_id, BOT, allow_bots=True) == Ignored("own_message")


def test_other_bots_are_ignored_unless_allowed() -> None:
    other = edited("dm_message.json", bot_id="B0OTHER001")
    assert to_inbound(other, BOT) == Ignored("from_bot")
    allowed = to_inbound(other, BOT, allow_bots=True)
    assert isinstance(allowed, InboundMessage) and allowed.sender.is_bot


@pytest.mark.parametrize("subtype", ["message_deleted", "channel_join", "message_replied", "bot_message"])
def test_subtypes_without_new_user_text_are_ignored(subtype: str) -> None:
    assert to_inbound(edited("dm_message.json", subtype=subtype), BOT) == Ignored(f"subtype:{subtype}")


def test_thread_message_without_mention_is_unaddressed_in_that_thread() -> None:
    reply = edited("channel_message_no_mention.json", thread_ts="1735689660.000200", text="and the cause?")
    result = to_inbound(reply, BOT)
    assert isinstance(result, InboundMessage)
    assert not result.addressed
    assert result.address.thread_id == "1735689660.000200"
    assert result.message_id == "C0GENERAL1:1735689960.000700"
    mentioned = to_inbound(edited("channel_message_no_mention.json", thread_ts="1735689660.000200",
                                  text="<@U0BOT00001> and the cause?"), BOT)
    assert isinstance(mentioned, InboundMessage) and mentioned.addressed and mentioned.text == "and the cause?"


def test_thread_broadcast_is_new_text_and_dm_thread_stays_a_dm() -> None:
    broadcast = to_inbound(edited("channel_message_no_mention.json", subtype="thread_broadcast",
                                  thread_ts="1735689660.000200"), BOT)
    assert isinstance(broadcast, InboundMessage) and broadcast.address.thread_id == "1735689660.000200"
    dm_thread = to_inbound(edited("dm_message.json", thread_ts="1735689000.000001"), BOT)
    assert isinstance(dm_thread, InboundMessage)
    assert dm_thread.chat_type == "dm" and dm_thread.address.thread_id == "1735689000.000001"


def test_other_event_types_and_empty_messages_are_ignored() -> None:
    assert to_inbound(edited("dm_message.json", type="reaction_added"), BOT) == Ignored("event:reaction_added")
    assert to_inbound(edited("dm_message.json", text="<@U0BOT00001>  "), BOT) == Ignored("empty")


def test_mentions_are_resolved_and_the_bot_mention_stripped() -> None:
    body = edited("channel_app_mention.json",
                  text="<@U0BOT00001> ask <@U0BOB00001> and <@U0CAROL01|carol> about <#C0OPS0001|ops>")
    assert users_to_resolve(body, BOT) == {"U0ALICE001", "U0BOB00001", "U0CAROL01"}
    result = to_inbound(body, BOT, {"U0BOB00001": "Bob Builder", "U0ALICE001": "Alice"})
    assert isinstance(result, InboundMessage)
    assert result.text == "ask @Bob Builder and @carol about #ops"
    assert result.sender.display_name == "Alice"


@pytest.mark.parametrize(("markup", "plain"), [
    ("see <https://example.com/a?b=1&amp;c=2|the docs>", "see the docs (https://example.com/a?b=1&c=2)"),
    ("<https://example.com>", "https://example.com"),
    ("mail <mailto:a@b.c|a@b.c>", "mail a@b.c"),
    ("<!here> deploy &lt;now&gt; &amp; then", "@here deploy <now> & then"),
    ("<!subteam^S0TEAM|@oncall> ping", "@oncall ping"),
    ("hi  <@U0BOT00001>  there", "hi there"),
])
def test_plain_text(markup: str, plain: str) -> None:
    assert plain_text(markup, "U0BOT00001", {}) == plain


def test_slash_command_text_sets_the_command() -> None:
    result = to_inbound(edited("dm_message.json", text="/help me"), BOT)
    assert isinstance(result, InboundMessage) and result.command == "help"


def test_thread_replies_name_their_parent_and_channel_chatter_is_context_only_on_request() -> None:
    reply = to_inbound(envelope("thread_app_mention.json"), BOT)
    event = envelope("thread_app_mention.json")["event"]
    assert reply.quoted is not None and reply.quoted.message_id == f"{event['channel']}:{event['thread_ts']}"
    assert reply.quoted.text is None and not reply.opens_thread  # read from Slack when the turn needs it
    top = to_inbound(envelope("channel_app_mention.json"), BOT)
    assert top.quoted is None and top.opens_thread and top.address.thread_id == envelope(
        "channel_app_mention.json")["event"]["ts"]
    chatter = envelope("channel_message_no_mention.json")
    assert to_inbound(chatter, BOT) == Ignored("not_addressed")
    kept = to_inbound(chatter, BOT, ambient=True)
    assert kept.context_only and not kept.addressed and kept.address.thread_id is None
