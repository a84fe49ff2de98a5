"""Table-driven tests of ``adapters.feishu.inbound.to_inbound`` over the shared Feishu fixtures."""

from __future__ import annotations

import json

import pytest

from adapters.feishu.inbound import Ignored, to_inbound
from tests.conftest import FIXTURES, fixture

EXPECTED = fixture("feishu", "expected.json")
APP = EXPECTED["_app"]
BOT = APP["bot_open_id"]
MESSAGE_CASES = sorted(
    name for name, case in EXPECTED.items()
    if not name.startswith("_") and name not in ("url_verification.json", "p2p_text_encrypted.json")
)


def _body(name: str) -> dict:
    return json.loads((FIXTURES / "feishu" / name).read_text())


@pytest.mark.parametrize("name", MESSAGE_CASES)
def test_fixture_normalizes_as_expected(name: str) -> None:
    case = EXPECTED[name]
    result = to_inbound(_body(name), BOT)
    # p2p_text_retry is a duplicate: normalization is identical, the inbox drops it.
    replies = case["should_reply"] or name == "p2p_text_retry.json"
    if not replies:
        assert isinstance(result, Ignored), result
        return
    assert not isinstance(result, Ignored), result
    assert result.address.platform == "feishu"
    assert result.address.tenant == case["tenant"]
    assert result.address.chat_id == case["chat_id"]
    assert result.address.thread_id == case["thread_id"]
    assert result.chat_type == case["chat_type"]
    assert result.sender.user_id == case["user_id"]
    assert result.message_id == case["platform_message_id"]
    assert result.text == case["text"]
    assert [(a.kind, a.file_id) for a in result.attachments] == [(a["kind"], a["key"]) for a in case["attachments"]]
    for got, want in zip(result.attachments, case["attachments"], strict=True):
        assert got.name == want.get("file_name")
    reply = case["reply"] or EXPECTED["p2p_text.json"]["reply"]
    if "/reply" in reply["method"]:
        assert result.reply_to_id == case["platform_message_id"]
    else:
        assert result.reply_to_id is None  # DMs: a new message in the chat
    assert result.addressed
    assert result.event_id == _body(name)["header"]["event_id"]


@pytest.mark.parametrize(("name", "reason"), [
    ("group_no_mention.json", "not_addressed"),
    ("bot_own_message.json", "from_bot"),
    ("message_recalled.json", "recalled"),
])
def test_ignore_reasons(name: str, reason: str) -> None:
    assert to_inbound(_body(name), BOT) == Ignored(reason)


def _text_event(text: str, *, chat_type: str = "group", thread_id: str | None = None,
                mentions: list[dict] | None = None, message_type: str = "text", content: dict | None = None) -> dict:
    body = _body("group_mention_text.json")
    message = body["event"]["message"]
    message["chat_type"] = chat_type
    message["message_type"] = message_type
    message["content"] = json.dumps(content if content is not None else {"text": text})
    message["mentions"] = mentions if mentions is not None else []
    if thread_id:
        message["thread_id"] = thread_id
    return body


def _mention(key: str, open_id: str, name: str) -> dict:
    return {"key": key, "id": {"open_id": open_id, "union_id": "", "user_id": ""}, "name": name, "tenant_key": "t"}


BOT_MENTION = _mention("@_user_1", BOT, "Gateway")


@pytest.mark.parametrize(("text", "mentions", "expected"), [
    ("@_user_1 hi", [BOT_MENTION], "hi"),
    ("hi @_user_1  there", [BOT_MENTION], "hi there"),
    ("@_user_1 ping @_user_2 and @_user_10", [BOT_MENTION, _mention("@_user_2", "ou_b", "Bob"),
                                             _mention("@_user_10", "ou_c", "Carol")], "ping @Bob and @Carol"),
    ("@_user_1 tell @_all", [BOT_MENTION], "tell @all"),
    ("@_user_1 who is @_user_3", [BOT_MENTION], "who is @_user_3"),  # unknown placeholder kept
])
def test_text_mentions(text: str, mentions: list[dict], expected: str) -> None:
    result = to_inbound(_text_event(text, mentions=mentions), BOT)
    assert not isinstance(result, Ignored)
    assert result.text == expected


def test_thread_message_without_mention_is_unaddressed() -> None:
    result = to_inbound(_text_event("follow-up", thread_id="omt_1"), BOT)
    assert not isinstance(result, Ignored)
    assert result.addressed is False and result.address.thread_id == "omt_1"
    assert result.reply_to_id == result.message_id


def test_mention_of_another_user_only_is_not_addressed() -> None:
    result = to_inbound(_text_event("@_user_2 hi", mentions=[_mention("@_user_2", "ou_b", "Bob")]), BOT)
    assert result == Ignored("not_addressed")


def test_command_after_mention() -> None:
    result = to_inbound(_text_event("@_user_1 /Help me", mentions=[BOT_MENTION]), BOT)
    assert not isinstance(result, Ignored) and result.command == "help"


@pytest.mark.parametrize(("message_type", "content", "kind", "name"), [
    ("audio", {"file_key": "file_a", "duration": 3000}, "voice", None),
    ("media", {"file_key": "file_v", "image_key": "img_v", "file_name": "clip.mp4"}, "video", "clip.mp4"),
    ("sticker", {"file_key": "file_s"}, "sticker", None),
])
def test_media_types_become_attachments(message_type: str, content: dict, kind: str, name: str | None) -> None:
    result = to_inbound(_text_event("", chat_type="p2p", message_type=message_type, content=content), BOT)
    assert not isinstance(result, Ignored)
    assert result.text == "" and [(a.kind, a.file_id, a.name) for a in result.attachments] == [
        (kind, content["file_key"], name)]


def test_post_code_block_italic_strike_and_other_user() -> None:
    content = {"title": "", "content": [
        [{"tag": "at", "user_id": "@_user_1"}, {"tag": "text", "text": " look"}],
        [{"tag": "text", "text": "a", "style": ["italic"]}, {"tag": "text", "text": " b", "style": []},
         {"tag": "text", "text": "c", "style": ["lineThrough"]}],
        [{"tag": "at", "user_id": "@_user_2", "user_name": "Bob"}, {"tag": "emotion", "emoji_type": "SMILE"}],
        [{"tag": "code_block", "language": "PYTHON", "text": "print(1)\n"}],
        [{"tag": "hr"}],
    ]}
    mentions = [BOT_MENTION, _mention("@_user_2", "ou_b", "Bob")]
    result = to_inbound(_text_event("", message_type="post", content=content, mentions=mentions), BOT)
    assert not isinstance(result, Ignored)
    assert result.text == "look\n*a* b~~c~~\n@Bob:SMILE:\n```python\nprint(1)\n```\n---"


@pytest.mark.parametrize(("mutate", "reason"), [
    (lambda b: b["event"]["message"].update(content="not json"), "malformed_content"),
    (lambda b: b["event"]["message"].update(content='["list"]'), "malformed_content"),
    (lambda b: b["event"]["message"].update(message_type="share_chat", content='{"chat_id": "oc_1"}'),
     "unsupported_message_type:share_chat"),
    (lambda b: b["event"]["message"].pop("message_id"), "malformed"),
    (lambda b: b["event"]["sender"].update(sender_type="app"), "from_bot"),
    (lambda b: b["header"].update(event_type="im.chat.member.bot.added_v1"),
     "unsupported_event:im.chat.member.bot.added_v1"),
    (lambda b: b["event"]["message"].update(content='{"text": "@_user_1 "}'), "empty"),
])
def test_malformed_and_unsupported(mutate, reason: str) -> None:
    body = _body("group_mention_text.json")
    mutate(body)
    assert to_inbound(body, BOT) == Ignored(reason)


def test_dm_in_a_thread_replies_in_the_thread() -> None:
    result = to_inbound(_text_event("hi", chat_type="p2p", thread_id="omt_dm1"), BOT)
    assert not isinstance(result, Ignored)
    assert result.chat_type == "dm" and result.address.thread_id == "omt_dm1"
    assert result.reply_to_id == result.message_id and result.addressed


def test_a_reply_names_its_parent_and_group_chatter_is_context_only_on_request() -> None:
    topic = to_inbound(_body("topic_thread_reply.json"), BOT)
    assert topic.quoted is not None and topic.quoted.message_id == "om_fake0000000000000000000000top01"
    assert topic.quoted.text is None and not topic.context_only
    chatter = _body("group_no_mention.json")
    assert to_inbound(chatter, BOT) == Ignored("not_addressed")
    kept = to_inbound(chatter, BOT, ambient=True)
    assert kept.context_only and not kept.addressed
