"""Pure Telegram translation: fixtures -> normalized messages; Markdown -> chunks."""

from __future__ import annotations

import json

import pytest

from adapters.telegram.format import chunk_text, format_reply, link_accepted, render_markdown, utf16_len
from adapters.telegram.inbound import BotIdentity, Ignored, callback_to_inbound, to_inbound
from adapters.telegram.wire import update_problem
from gateway.core.types import Attachment, ChatAddress, Sender
from tests.conftest import FIXTURES
from tests.fakes.telegram import link_problem

EXPECTED = json.loads((FIXTURES / "telegram" / "expected.json").read_text())
BOT = BotIdentity(EXPECTED["_bot"]["id"], EXPECTED["_bot"]["username"])
CASES = sorted(name for name in EXPECTED if not name.startswith("_"))


@pytest.mark.parametrize("name", CASES)
def test_fixture_normalizes_as_expected(name):
    expected = EXPECTED[name]
    update = json.loads((FIXTURES / "telegram" / name).read_text())
    assert update_problem(update) is None
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
        original = json.loads((FIXTURES / "telegram" / "dm_text.json").read_text())
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
    assert to_inbound(raw, BOT) == Ignored("not_addressed")
    own = json.loads((FIXTURES / "telegram" / "dm_text.json").read_text())
    own["message"]["from"].update(id=BOT.id, is_bot=True)
    assert to_inbound(own, BOT) == Ignored("from_bot")


def test_a_message_with_nothing_to_answer_is_ignored_like_on_slack():
    """Whitespace only, or only the bot's mention in a group: no turn, no model call."""
    blank = json.loads((FIXTURES / "telegram" / "dm_text.json").read_text())
    blank["message"]["text"] = "   "
    assert to_inbound(blank, BOT) == Ignored("empty")
    mention = json.loads((FIXTURES / "telegram" / "group_mention.json").read_text())
    mention["message"]["text"] = "@gateway_test_bot"
    mention["message"]["entities"] = [{"type": "mention", "offset": 0, "length": 17}]
    assert to_inbound(mention, BOT) == Ignored("empty")
    voice = json.loads((FIXTURES / "telegram" / "dm_voice.json").read_text())
    assert not isinstance(to_inbound(voice, BOT), Ignored)  # an attachment is content


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


@pytest.mark.parametrize("url", [
    "https://en.wikipedia.org/wiki/Foo_(bar)", "http://192.168.0.1:8080/x", "https://[2001:db8::1]/", "tg://user?id=5",
    "HTTPS://EXAMPLE.COM/A", "https://例子.测试/", "https://a_b.example.com/x?q=(1)", "#setup", "./README.md",
    "/home/me/notes.md", "README.md", "mailto:ops@example.com", "javascript:alert(1)", "https://localhost/",
    "https://example.com:0/", "https://example.com:99999/", "https://exa mple.com/", "ftp://example.com/", "",
])
def test_links_kept_are_links_the_bot_api_accepts(url):
    """``link_accepted`` is a subset of TDLib's ``check_link`` (the fake's ``link_problem``): a link
    kept as an entity never makes Telegram refuse the message."""
    if link_accepted(url):
        assert link_problem(url) is None


def test_a_link_telegram_would_refuse_keeps_only_its_text():
    text, entities = render_markdown("[README](./README.md), [top](#top) and [site](https://example.com/a_(b))")
    assert text == "README, top and site"
    assert [(e.type, e.offset, e.length, e.url) for e in entities] == [
        ("text_link", 16, 4, "https://example.com/a_(b)")]


@pytest.mark.parametrize(("markdown", "shown"), [
    ("Use List<String> here", "Use List<String> here"),
    ("Set the header to <your-token> first", "Set the header to <your-token> first"),
    ("<T>", "<T>"),
    ("a <br> b and x <script>alert(1)</script> y", "a <br> b and x <script>alert(1)</script> y"),
    ("<!-- a note --> shown", "<!-- a note --> shown"),
    ("<div>\nblock html\n</div>", "<div>\nblock html\n</div>"),
    ("> quoted <b>bold</b>", "quoted <b>bold</b>"),
    ("Email <bob@example.com> or see <https://example.com/a_b>", "Email bob@example.com or see https://example.com/a_b"),
    ("`<b>` stays code and **<i>x</i>** stays bold", "<b> stays code and <i>x</i> stays bold"),
    # a fence inside an HTML block: its `<` stays as written (a review found `sort \< in.txt`)
    ("<details>\n```sh\nsort < in.txt > out.txt\n```\n</details>", "<details>\nsort < in.txt > out.txt\n</details>"),
    ("<div>\nx <span>y</span> if a < b\n</div>", "<div>\nx <span>y</span> if a < b\n</div>"),
])
def test_html_the_model_writes_is_shown_as_text(markdown, shown):
    """Telegram shows plain text with entities, so there is no HTML to render: a tag-like run the
    model writes (a generic type, a placeholder, an HTML snippet) must reach the user as written.
    The Markdown converter drops raw HTML, and an HTML block (a comment, ``<div>``) took the text
    of its whole line or block with it."""
    assert render_markdown(markdown)[0] == shown
    assert [c.text for c in format_reply(markdown)] == [shown]


def test_whitespace_only_reply_sends_nothing():
    assert format_reply("   \n\n ") == []


def _update(name: str) -> dict:
    return json.loads((FIXTURES / "telegram" / name).read_text())


def test_a_reply_carries_what_it_replies_to_but_a_forum_topics_root_is_not_a_reply():
    reply = to_inbound(_update("supergroup_reply_to_bot.json"), BOT)
    assert reply.quoted is not None and reply.quoted.from_bot and not reply.quoted.partial
    original = _update("supergroup_reply_to_bot.json")["message"]["reply_to_message"]
    assert reply.quoted.message_id == f"{original['chat']['id']}:{original['message_id']}"
    assert reply.quoted.text == original["text"]
    topic = to_inbound(_update("forum_topic_mention.json"), BOT)
    assert topic.quoted is None  # every topic message "replies" to the topic's creation message

    quoted = _update("group_mention.json")
    quoted["message"]["reply_to_message"] = {
        "message_id": 2100, "from": {"id": 5550003, "is_bot": False, "first_name": "Carol"},
        "chat": quoted["message"]["chat"], "date": 1735689600, "caption": "the Q3 chart",
        "document": {"file_id": "BQAC-doc", "file_unique_id": "d1", "file_name": "q3.pdf",
                     "mime_type": "application/pdf", "file_size": 5000}}
    quoted["message"]["quote"] = {"text": "Q3", "position": 4, "is_manual": True}
    result = to_inbound(quoted, BOT)
    assert (result.quoted.text, result.quoted.author, result.quoted.partial) == ("Q3", "Carol", True)
    assert [a.file_id for a in result.quoted.attachments] == ["BQAC-doc"]


def test_unaddressed_group_messages_become_context_only_when_group_context_is_on():
    plain = _update("group_no_mention.json")
    assert to_inbound(plain, BOT) == Ignored("not_addressed")
    kept = to_inbound(plain, BOT, ambient=True)
    assert kept.context_only and not kept.addressed and kept.text
    mention = to_inbound(_update("group_mention.json"), BOT, ambient=True)
    assert mention.addressed and not mention.context_only


def test_a_quote_of_another_chats_message_is_a_partial_reply():
    update = _update("group_mention.json")
    update["message"]["external_reply"] = {
        "origin": {"type": "user", "date": 1735680000, "sender_user": {"id": 5550009, "is_bot": False,
                                                                         "first_name": "Erin"}},
        "chat": {"id": -1009999, "title": "Other chat", "type": "supergroup"}, "message_id": 12}
    update["message"]["quote"] = {"text": "ship it friday", "position": 0}
    quoted = to_inbound(update, BOT).quoted
    assert (quoted.message_id, quoted.text, quoted.author, quoted.partial) == (
        "-1009999:12", "ship it friday", "Erin", True)


def _checked(update: dict) -> dict:
    """``update`` after the check every update passes before translation (``update_problem``)."""
    assert update_problem(update) is None, update_problem(update)
    return update


def _dm(**message) -> dict:
    """``dm_text.json`` with ``message`` fields replaced (``None`` removes one)."""
    update = _update("dm_text.json")
    update["message"].update(message)
    update["message"] = {k: v for k, v in update["message"].items() if v is not None}
    return _checked(update)


def test_every_media_type_becomes_one_attachment_with_its_sizes_and_thumbnail():
    """Bot API Message media: sizes in bytes, pixels, durations in seconds; an animation also comes
    as ``document`` and is taken once."""
    thumb = {"file_id": "th-1", "file_unique_id": "th", "width": 90, "height": 90, "file_size": 900}
    animation = {"file_id": "an-1", "file_unique_id": "an", "width": 320, "height": 240, "duration": 3,
                 "thumbnail": thumb, "file_name": "fun.mp4", "mime_type": "video/mp4", "file_size": 5000}
    cases = {
        "animation": ({"animation": animation, "document": {"file_id": "an-1", "file_unique_id": "an",
                                                            "file_name": "fun.mp4", "mime_type": "video/mp4"}},
                      Attachment("animation", "an-1", "fun.mp4", "video/mp4", 5000, width=320, height=240,
                                 duration_s=3.0, thumbnail_id="th-1")),
        "picture as a file": ({"document": {"file_id": "d-1", "file_unique_id": "d", "file_name": "x.PNG",
                                                  "mime_type": "IMAGE/PNG"}},
                              Attachment("image", "d-1", "x.PNG", "IMAGE/PNG", None)),
        "document": ({"document": {"file_id": "d-2", "file_unique_id": "d", "file_size": 10}},
                     Attachment("document", "d-2", None, None, 10)),
        "voice": ({"voice": {"file_id": "v-1", "file_unique_id": "v", "duration": 4, "file_size": 9120}},
                  Attachment("voice", "v-1", None, "audio/ogg", 9120, duration_s=4.0)),
        "audio": ({"audio": {"file_id": "a-1", "file_unique_id": "a", "duration": 180, "file_name": "song.mp3",
                             "mime_type": "audio/mpeg", "file_size": 3_000_000}},
                  Attachment("audio", "a-1", "song.mp3", "audio/mpeg", 3_000_000, duration_s=180.0)),
        "video": ({"video": {"file_id": "vi-1", "file_unique_id": "vi", "width": 1280, "height": 720, "duration": 7,
                             "file_name": "clip.mov", "mime_type": "video/quicktime", "thumbnail": thumb}},
                  Attachment("video", "vi-1", "clip.mov", "video/quicktime", None, duration_s=7.0,
                             thumbnail_id="th-1")),
        "video without a type": ({"video": {"file_id": "vi-2", "file_unique_id": "v", "width": 1, "height": 1,
                                             "duration": 0}},
                                 Attachment("video", "vi-2", None, "video/mp4", None, duration_s=0.0)),
        "video note": ({"video_note": {"file_id": "vn-1", "file_unique_id": "vn", "length": 240, "duration": 5,
                                       "file_size": 700, "thumbnail": thumb}},
                       Attachment("video", "vn-1", None, "video/mp4", 700, duration_s=5.0, thumbnail_id="th-1")),
        "sticker": ({"sticker": {"file_id": "st-1", "file_unique_id": "st", "type": "regular", "width": 512,
                                 "height": 512, "is_animated": False, "is_video": False, "emoji": "😀"}},
                    Attachment("sticker", "st-1", "sticker 😀", "image/webp", None, width=512, height=512)),
        "animated sticker": ({"sticker": {"file_id": "st-2", "file_unique_id": "s", "type": "regular",
                                          "width": 512, "height": 512, "is_animated": True, "is_video": False,
                                          "thumbnail": thumb}},
                             Attachment("sticker", "st-2", None, "application/x-tgsticker", None, width=512,
                                        height=512, thumbnail_id="th-1")),
        "video sticker": ({"sticker": {"file_id": "st-3", "file_unique_id": "s", "type": "regular", "width": 512,
                                       "height": 512, "is_animated": False, "is_video": True, "file_size": 40}},
                          Attachment("sticker", "st-3", None, "video/webm", 40, width=512, height=512)),
    }
    for what, (media, attachment) in cases.items():
        result = to_inbound(_dm(text=None, **media), BOT)
        assert result.attachments == (attachment,), what
        assert result.text == "", what


def test_a_photo_is_the_smallest_size_reaching_the_models_side_that_telegram_serves():
    def sizes(*triples):
        return [{"file_id": f, "file_unique_id": f, "width": w, "height": h, "file_size": n} for f, w, h, n in triples]

    photo = sizes(("s", 90, 60, 1_000), ("m", 2560, 1440, 900_000), ("l", 5120, 2880, 3_000_000))
    result = to_inbound(_dm(text=None, caption="look", photo=photo), BOT)
    assert result.attachments == (Attachment("image", "m", None, "image/jpeg", 900_000, width=2560, height=1440),)
    assert result.text == "look"
    too_big = sizes(("s", 90, 60, 1_000), ("m", 640, 480, 20_000), ("huge", 9000, 9000, 30_000_000))
    assert [a.file_id for a in to_inbound(_dm(text=None, photo=too_big), BOT).attachments] == ["m"]


def test_mentions_count_utf16_units_and_text_mentions_and_replies_address_the_bot():
    update = _update("group_mention.json")
    # "😀" is 2 UTF-16 units: the mention starts at unit 3, string index 2
    update["message"].update(text="😀 @gateway_test_bot 😀 hi @other", entities=[
        {"type": "mention", "offset": 3, "length": 17}, {"type": "bold", "offset": 24, "length": 2},
        {"type": "mention", "offset": 27, "length": 6}])
    result = to_inbound(_checked(update), BOT)
    assert (result.text, result.addressed) == ("😀 😀 hi @other", True)

    # an entity past the end of the text (it is the sender's to get right) cuts at the end
    update["message"].update(text="hi @gateway_test_bot", entities=[{"type": "mention", "offset": 3, "length": 99}])
    result = to_inbound(_checked(update), BOT)
    assert (result.text, result.addressed) == ("hi", True)
    update["message"].update(text="hi 😀@gateway_test_bot", entities=[{"type": "mention", "offset": 5, "length": 99}])
    assert to_inbound(_checked(update), BOT).text == "hi 😀"

    update["message"].update(text="Gateway, hello", entities=[
        {"type": "text_mention", "offset": 0, "length": 7, "user": {"id": BOT.id, "is_bot": True, "first_name": "G"}}])
    result = to_inbound(_checked(update), BOT)
    assert (result.text, result.addressed) == ("Gateway, hello", True)  # a text mention's text stays
    update["message"]["entities"][0]["user"]["id"] = 5550009
    assert to_inbound(_checked(update), BOT) == Ignored("not_addressed")

    update["message"].update(entities=None, reply_to_message={
        "message_id": 9, "date": 1735689000, "chat": update["message"]["chat"],
        "from": {"id": BOT.id, "is_bot": True, "first_name": "Gateway"}, "text": "earlier answer"})
    del update["message"]["entities"]
    result = to_inbound(_checked(update), BOT)
    assert result.addressed and result.quoted.from_bot and result.quoted.text == "earlier answer"


def test_a_bare_command_and_a_command_with_arguments_in_a_caption():
    update = _update("group_command.json")
    update["message"].update(text="/Status", entities=[{"type": "bot_command", "offset": 0, "length": 7}])
    result = to_inbound(_checked(update), BOT)
    assert (result.command, result.text, result.addressed) == ("status", "", True)
    photo = [{"file_id": "p", "file_unique_id": "p", "width": 10, "height": 10}]
    update["message"] = {k: v for k, v in update["message"].items() if k not in ("text", "entities")}
    update["message"].update(photo=photo, caption="/describe@gateway_test_bot  this one",
                             caption_entities=[{"type": "bot_command", "offset": 0, "length": 26}])
    result = to_inbound(_checked(update), BOT)
    assert (result.command, result.text, [a.file_id for a in result.attachments]) == ("describe", "this one", ["p"])
    update["message"].update(caption="@gateway_test_bot 🙂 /describe this", caption_entities=[
        {"type": "mention", "offset": 0, "length": 17}, {"type": "bot_command", "offset": 21, "length": 9}])
    result = to_inbound(_checked(update), BOT)  # a command further into the text is text
    assert (result.command, result.text) == (None, "🙂 /describe this")
    update["message"].update(caption="@gateway_test_bot /Describe@gateway_test_bot this", caption_entities=[
        {"type": "mention", "offset": 0, "length": 17}, {"type": "bot_command", "offset": 18, "length": 26}])
    result = to_inbound(_checked(update), BOT)  # right after the bot's mention: the command
    assert (result.command, result.text, result.addressed) == ("describe", "this", True)


def test_topics_albums_languages_and_what_is_never_a_turn():
    topic = to_inbound(_checked(_update("forum_topic_mention.json")), BOT)
    assert (topic.address.thread_id, topic.reply_to_id, topic.language) == ("77", "3305", "en")
    not_a_topic = _update("forum_topic_mention.json")
    not_a_topic["message"]["is_topic_message"] = False  # a reply thread in a supergroup, not a forum topic
    assert to_inbound(_checked(not_a_topic), BOT).address.thread_id is None

    album = to_inbound(_dm(media_group_id="13566005", text=None, caption="two pictures",
                           photo=[{"file_id": "p", "file_unique_id": "p", "width": 10, "height": 10}]), BOT)
    assert (album.media_group_id, album.event_id, album.received_at) == ("13566005", "810000001", 1735689600.0)
    assert album.sender == Sender("5550001", "Alice", "alice_example", False)
    assert to_inbound(_dm(**{"from": {"id": 1, "is_bot": False, "first_name": "", "last_name": "Ng"}}),
                      BOT).sender == Sender("1", "Ng", None, False)

    channel = _update("dm_text.json")
    channel["message"]["chat"] = {"id": -1001234, "type": "channel", "title": "News"}
    assert to_inbound(_checked(channel), BOT) == Ignored("channel_post")
    post = {"update_id": 5, "channel_post": _update("dm_text.json")["message"]}
    assert to_inbound(_checked(post), BOT) == Ignored("unsupported_update")
    service = _dm(text=None, new_chat_title="Renamed")
    assert to_inbound(service, BOT) == Ignored("service_message")
    anonymous = _dm(**{"from": None}, sender_chat={"id": -100, "type": "supergroup", "title": "Admins"})
    assert to_inbound(anonymous, BOT) == Ignored("from_bot")


def test_a_reply_names_its_author_and_a_quote_of_another_chat_names_its_origin():
    update = _update("group_mention.json")
    update["message"]["reply_to_message"] = {  # an anonymous group admin's message: the group is its author
        "message_id": 2100, "chat": update["message"]["chat"], "date": 1735689000, "text": "from the admins",
        "sender_chat": {"id": -4000000001, "type": "group", "title": "Project Team"},
        "from": {"id": 1087968824, "is_bot": True, "first_name": "", "username": "GroupAnonymousBot"}}
    quoted = to_inbound(_checked(update), BOT).quoted
    assert (quoted.author, quoted.sent_at, quoted.from_bot) == ("Project Team", 1735689000.0, False)

    del update["message"]["reply_to_message"]
    update["message"]["quote"] = {"text": "the quoted part", "position": 0}
    origins = {
        "hidden_user": ({"sender_user_name": "Someone Hidden"}, "Someone Hidden"),
        "chat": ({"sender_chat": {"id": -200, "type": "supergroup", "title": "Other group"}}, "Other group"),
        "channel": ({"chat": {"id": -100300, "type": "channel", "title": "A channel"}, "message_id": 8}, "A channel"),
        "some_future_kind": ({"sender_user": {"id": 3, "is_bot": False, "first_name": "Not read"}}, ""),
    }
    for kind, (fields, author) in origins.items():
        update["message"]["external_reply"] = {"origin": {"type": kind, "date": 1735680000, **fields}}
        quoted = to_inbound(_checked(update), BOT).quoted
        assert (quoted.message_id, quoted.text, quoted.author, quoted.sent_at, quoted.partial) == (
            "external:0", "the quoted part", author, 1735680000.0, True), kind
    del update["message"]["quote"]
    assert to_inbound(_checked(update), BOT).quoted is None  # an external reply without a quote carries nothing


def test_a_button_press_is_its_command_from_the_presser_in_the_buttons_chat_and_topic():
    update = _update("callback_query.json")
    assert callback_to_inbound(_checked(update), BOT) == Ignored("unsupported_callback")  # "regen:101": no command
    update["callback_query"]["data"] = "/Approve  abc123 "
    update["callback_query"]["message"].update(chat={"id": -1001000000001, "type": "supergroup", "is_forum": True,
                                                     "title": "Forum"}, message_thread_id=77, is_topic_message=True)
    result = callback_to_inbound(_checked(update), BOT)
    assert (result.command, result.text, result.message_id, result.event_id, result.chat_type) == (
        "approve", "abc123", "cb:4382000000000000001", "810000009", "group")
    assert result.address == ChatAddress("telegram", str(BOT.id), "-1001000000001", "77")
    assert (result.sender, result.language) == (Sender("5550001", "Alice", "alice_example", False), "en")

    # a button on a message too old to read (Bot API InaccessibleMessage: chat, message_id, date 0)
    update["callback_query"]["message"] = {"chat": {"id": 5550001, "type": "private", "first_name": "Alice"},
                                           "message_id": 104, "date": 0}
    result = callback_to_inbound(_checked(update), BOT)
    assert (result.address.chat_id, result.address.thread_id, result.chat_type) == ("5550001", None, "dm")
    del update["callback_query"]["message"]  # a button of an inline message: no chat to answer in
    assert callback_to_inbound(_checked(update), BOT) == Ignored("unsupported_callback")
    update["callback_query"]["message"] = _update("callback_query.json")["callback_query"]["message"]
    update["callback_query"]["from"]["is_bot"] = True
    assert callback_to_inbound(_checked(update), BOT) == Ignored("unsupported_callback")


def test_the_check_refuses_what_the_translation_reads_when_it_is_not_the_bot_apis_type():
    """``update_problem`` is the translation's only guard: every field it reads has its Bot API
    type, and those the Bot API always sends are required; fields it does not read may be anything."""
    user = {"id": 5550001, "is_bot": False, "first_name": "Alice"}
    thumb_without_size = {"file_id": "th"}
    refused = {
        "a sticker without its size and kind": {"sticker": {"file_id": "CAAD", "file_unique_id": "u"}},
        "a voice message without its duration": {"voice": {"file_id": "v", "file_unique_id": "v"}},
        "an animation without its size": {"animation": {"file_id": "a", "duration": 1}},
        "a video whose thumbnail has no size": {"video": {"file_id": "v", "width": 1, "height": 1, "duration": 1,
                                                          "thumbnail": thumb_without_size}},
        "a video note with a text duration": {"video_note": {"file_id": "v", "duration": "5"}},
        "a photo size without its width": {"photo": [{"file_id": "p", "height": 5}]},
        "a language that is not a string": {"from": {**user, "language_code": 5}},
        "an album id that is a number": {"media_group_id": 13566005},
        "an anonymous admin's chat without a type": {"sender_chat": {"id": -100}},
        "an external reply without its origin": {"external_reply": {"message_id": 3}},
        "an origin without its date": {"external_reply": {"origin": {"type": "user", "sender_user": user}}},
        "a topic creation that is not an object": {"forum_topic_created": "Release 2.0"},
        "a text mention of a user without an id": {"entities": [{"type": "text_mention", "offset": 0, "length": 1,
                                                                 "user": {"is_bot": False, "first_name": "x"}}]},
    }
    for what, fields in refused.items():
        update = _update("dm_text.json")
        update["message"].update(fields)
        assert update_problem(update) is not None, what
    ignored = _update("dm_text.json")
    ignored["message"].update(reply_markup="not read", some_future_field={"x": [1]}, link_preview_options=5)
    ignored["message"]["from"]["is_premium"] = "not read either"
    assert update_problem(ignored) is None
    assert to_inbound(ignored, BOT).text == "Hello! Can you summarise today's notes?"
