"""Pure Telegram translation: fixtures -> normalized messages; Markdown -> chunks."""

from __future__ import annotations

import json

import pytest
from telegram import Update

from adapters.telegram.format import chunk_text, format_reply, render_markdown, utf16_len
from adapters.telegram.inbound import BotIdentity, Ignored, to_inbound
from tests.conftest import FIXTURES

EXPECTED = json.loads((FIXTURES / "telegram" / "expected.json").read_text())
BOT = BotIdentity(EXPECTED["_bot"]["id"], EXPECTED["_bot"]["username"])
CASES = sorted(name for name in EXPECTED if not name.startswith("_"))


@pytest.mark.parametrize("name", CASES)
def test_fixture_normalizes_as_expected(name):
    expected = EXPECTED[name]
    update = Update.de_json(json.loads((FIXTURES / "telegram" / name).read_text()), None)
    result = to_inbound(update, BOT)
    if name == "callback_query.json":
        assert isinstance(result, Ignored)  # answered by the adapter, not a turn
        return
    if expected["ignore_reason"] in ("edited_message", "not_addressed"):
        assert isinstance(result, Ignored) and result.reason == expected["ignore_reason"]
        return
    assert not isinstance(result, Ignored)
    if expected["ignore_reason"] and expected["ignore_reason"].startswith("duplicate"):
        # Normalizes exactly like the original; the inbox drops it (see the e2e duplicate test).
        original = Update.de_json(json.loads((FIXTURES / "telegram" / "dm_text.json").read_text()), None)
        assert to_inbound(original, BOT) == result
        return
    assert result.address.tenant == expected["tenant"]
    assert result.address.chat_id == expected["chat_id"]
    assert result.address.thread_id == expected["thread_id"]
    assert result.sender.user_id == expected["user_id"]
    assert result.chat_type == expected["chat_type"]
    assert result.message_id == expected["platform_message_id"]
    assert result.text == expected["text"]
    assert [a.file_id for a in result.attachments] == [a["file_id"] for a in expected["attachments"]]
    quote = expected["reply"].get("reply_parameters", {}).get("message_id")
    assert result.reply_to_id == (str(quote) if quote else None)
    assert result.command == expected.get("command")


def test_message_from_a_bot_and_command_for_another_bot_are_ignored():
    raw = json.loads((FIXTURES / "telegram" / "group_command.json").read_text())
    raw["message"]["text"] = raw["message"]["text"].replace("gateway_test_bot", "other_bot")
    assert to_inbound(Update.de_json(raw, None), BOT) == Ignored("not_addressed")
    own = json.loads((FIXTURES / "telegram" / "dm_text.json").read_text())
    own["message"]["from"].update(id=BOT.id, is_bot=True)
    assert to_inbound(Update.de_json(own, None), BOT) == Ignored("from_bot")


def test_a_message_with_nothing_to_answer_is_ignored_like_on_slack():
    """Whitespace only, or only the bot's mention in a group: no turn, no model call."""
    blank = json.loads((FIXTURES / "telegram" / "dm_text.json").read_text())
    blank["message"]["text"] = "   "
    assert to_inbound(Update.de_json(blank, None), BOT) == Ignored("empty")
    mention = json.loads((FIXTURES / "telegram" / "group_mention.json").read_text())
    mention["message"]["text"] = "@gateway_test_bot"
    mention["message"]["entities"] = [{"type": "mention", "offset": 0, "length": 17}]
    assert to_inbound(Update.de_json(mention, None), BOT) == Ignored("empty")
    voice = json.loads((FIXTURES / "telegram" / "dm_voice.json").read_text())
    assert not isinstance(to_inbound(Update.de_json(voice, None), BOT), Ignored)  # an attachment is content


def test_markdown_becomes_text_and_utf16_entities():
    text, entities = render_markdown("😀 **bold** and `x_y`")
    assert text == "😀 bold and x_y"
    bold = next(e for e in entities if e.type == "bold")
    assert (bold.offset, bold.length) == (3, 4)  # the emoji is 2 UTF-16 units


@pytest.mark.parametrize("limit", [50, 200, 4096])
def test_chunks_fit_join_exactly_and_clip_entities(limit):
    markdown = "Intro line\n\n```python\n" + "\n".join(f"print({i})  # 😀" for i in range(300)) + "\n```\nThe end."
    text, entities = render_markdown(markdown)
    chunks = chunk_text(text, entities, limit)
    assert "".join(c.text for c in chunks) == text
    for chunk in chunks:
        assert utf16_len(chunk.text) <= limit
        for entity in chunk.entities:
            assert entity.offset + entity.length <= utf16_len(chunk.text)
    pre_chunks = [c for c in chunks if any(e.type == "pre" for e in c.entities)]
    assert all(e.language == "python" for c in pre_chunks for e in c.entities if e.type == "pre")
    if limit < 4096:
        assert len(pre_chunks) > 1  # the code block is closed and reopened across chunks


def test_hard_split_never_breaks_a_surrogate_pair():
    text = "😀" * 5000  # no separators at all
    chunks = chunk_text(text, [], 4096)
    assert "".join(c.text for c in chunks) == text
    assert all(utf16_len(c.text) <= 4096 for c in chunks)
    assert all(c.text.encode("utf-16-le").decode("utf-16-le") == c.text for c in chunks)


def test_a_text_of_exactly_the_limit_in_utf16_units_is_one_chunk():
    """Astral characters count two units, a lone surrogate one (what Telegram counts)."""
    assert [c.text for c in chunk_text("😀" * 2048, [], 4096)] == ["😀" * 2048]
    assert [len(c.text) for c in chunk_text("😀" * 2049, [], 4096)] == [2048, 1]
    assert [c.text for c in chunk_text("\ud83d" + "x" * 4095, [], 4096)] == ["\ud83d" + "x" * 4095]
    assert len(chunk_text("\ud83d" + "x" * 4096, [], 4096)) == 2


def test_whitespace_only_reply_sends_nothing():
    assert format_reply("   \n\n ") == []


def _update(name: str) -> dict:
    return json.loads((FIXTURES / "telegram" / name).read_text())


def test_a_reply_carries_what_it_replies_to_but_a_forum_topics_root_is_not_a_reply():
    reply = to_inbound(Update.de_json(_update("supergroup_reply_to_bot.json"), None), BOT)
    assert reply.quoted is not None and reply.quoted.from_bot and not reply.quoted.partial
    original = _update("supergroup_reply_to_bot.json")["message"]["reply_to_message"]
    assert reply.quoted.message_id == f"{original['chat']['id']}:{original['message_id']}"
    assert reply.quoted.text == original["text"]
    topic = to_inbound(Update.de_json(_update("forum_topic_mention.json"), None), BOT)
    assert topic.quoted is None  # every topic message "replies" to the topic's creation message

    quoted = _update("group_mention.json")
    quoted["message"]["reply_to_message"] = {
        "message_id": 2100, "from": {"id": 5550003, "is_bot": False, "first_name": "Carol"},
        "chat": quoted["message"]["chat"], "date": 1735689600, "caption": "the Q3 chart",
        "document": {"file_id": "BQAC-doc", "file_unique_id": "d1", "file_name": "q3.pdf",
                     "mime_type": "application/pdf", "file_size": 5000}}
    quoted["message"]["quote"] = {"text": "Q3", "position": 4, "is_manual": True}
    result = to_inbound(Update.de_json(quoted, None), BOT)
    assert (result.quoted.text, result.quoted.author, result.quoted.partial) == ("Q3", "Carol", True)
    assert [a.file_id for a in result.quoted.attachments] == ["BQAC-doc"]


def test_unaddressed_group_messages_become_context_only_when_group_context_is_on():
    plain = Update.de_json(_update("group_no_mention.json"), None)
    assert to_inbound(plain, BOT) == Ignored("not_addressed")
    kept = to_inbound(plain, BOT, ambient=True)
    assert kept.context_only and not kept.addressed and kept.text
    mention = to_inbound(Update.de_json(_update("group_mention.json"), None), BOT, ambient=True)
    assert mention.addressed and not mention.context_only


def test_a_quote_of_another_chats_message_is_a_partial_reply():
    update = _update("group_mention.json")
    update["message"]["external_reply"] = {
        "origin": {"type": "user", "date": 1735680000, "sender_user": {"id": 5550009, "is_bot": False,
                                                                         "first_name": "Erin"}},
        "chat": {"id": -1009999, "title": "Other chat", "type": "supergroup"}, "message_id": 12}
    update["message"]["quote"] = {"text": "ship it friday", "position": 0}
    quoted = to_inbound(Update.de_json(update, None), BOT).quoted
    assert (quoted.message_id, quoted.text, quoted.author, quoted.partial) == (
        "-1009999:12", "ship it friday", "Erin", True)
