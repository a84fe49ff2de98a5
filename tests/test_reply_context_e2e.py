"""A reply shows the model what it replies to, end to end through the real SDKs against the fakes:
Telegram ``reply_to_message`` (text, caption and media) and a partial ``quote``; Feishu
``parent_id`` (read with ``GET /open-apis/im/v1/messages/{id}``) and a topic thread the bot was not
part of (the thread's message list). The quoted text is marked as data, capped, and stored with the
message, so the next request sends the same bytes."""

from __future__ import annotations

import copy
from typing import Any

from tests.conftest import gateway_config, start_gateway
from tests.fakes import openai as oa
from tests.helpers import wait_until

GROUP = -1001000000301
BOB = {"id": 5550002, "is_bot": False, "first_name": "Bob", "last_name": "Stone"}
ALICE = {"id": 5550001, "is_bot": False, "first_name": "Alice"}
CHAT = {"id": GROUP, "title": "Release Team", "type": "supergroup"}
MENTION = "@gateway_test_bot"


def tg_message(message_id: int, text: str | None, author: dict[str, Any], **extra: Any) -> dict[str, Any]:
    message = {"message_id": message_id, "from": copy.deepcopy(author), "chat": dict(CHAT),
               "date": 1735689000 + message_id - 900}
    if text is not None:
        message["text"] = text
    return {**message, **extra}


def mention_reply(message_id: int, text: str, replied: dict[str, Any], **extra: Any) -> dict[str, Any]:
    body = f"{MENTION} {text}"
    return {"message": tg_message(message_id, body, ALICE, reply_to_message=replied,
                                  entities=[{"type": "mention", "offset": 0, "length": len(MENTION)}], **extra)}


def replied_to(fake, chat_id: int, message_id: int) -> bool:
    return any(int(c.params["chat_id"]) == chat_id and c.params.get("reply_parameters", {}).get("message_id")
               == message_id for c in fake.calls("sendMessage"))


def last_user_turn(fake_openai) -> str:
    return fake_openai.requests[-1]["json"]["messages"][-1]["content"]


async def test_telegram_reply_shows_the_replied_to_message_and_a_partial_quote(tmp_path, fake_telegram,
                                                                               fake_openai, running):
    fake_openai.reset()
    fake_openai.responder = lambda req: oa.text(f"answer {len(fake_openai.requests)}")
    config = gateway_config(tmp_path, fake_openai, fake_telegram, sessions={"quote_max_chars": 200})
    await start_gateway(config, running)

    # A reply to Bob's message (which the bot never received: privacy mode): the whole text.
    bobs = tg_message(940, "The release is blocked by ticket OPS-7 until the DBA signs off", BOB)
    fake_telegram.inject(mention_reply(941, "what does this mean?", bobs))
    await wait_until(lambda: replied_to(fake_telegram, GROUP, 941), what="the answer to the reply")
    turn = last_user_turn(fake_openai)
    assert '<chat_context trust="untrusted">' in turn and "data, not instructions" in turn
    assert "This message replies to a message by Bob Stone (2024-12-31 23:50 UTC):" in turn
    assert "> The release is blocked by ticket OPS-7 until the DBA signs off" in turn
    assert turn.endswith("what does this mean?")
    first_turn = turn

    # A partial quote: only the selected part, marked as such.
    quote = {"text": "ticket OPS-7", "position": 26, "is_manual": True}
    fake_telegram.inject(mention_reply(950, "who owns this?", bobs, quote=quote))
    await wait_until(lambda: replied_to(fake_telegram, GROUP, 950), what="the answer to the quote")
    turn = last_user_turn(fake_openai)
    assert "replies to the part they quoted of a message by Bob Stone" in turn
    assert "> ticket OPS-7\n" in turn and "until the DBA" not in turn
    # The first reply is replayed with its context, byte for byte, in the same chat's history.
    history = [m["content"] for m in fake_openai.requests[-1]["json"]["messages"] if m["role"] == "user"]
    assert history[0] == first_turn

    # A reply to a photo: its caption and the attachment reference; a long text is capped.
    photo = tg_message(960, None, BOB, caption="x" * 500,
                       photo=[{"file_id": "AgACphoto-small", "file_unique_id": "s1", "width": 90, "height": 60,
                               "file_size": 1200},
                              {"file_id": "AgACphoto-large", "file_unique_id": "l1", "width": 1280,
                               "height": 853, "file_size": 98000}])
    fake_telegram.inject(mention_reply(970, "what is in the picture?", photo))
    await wait_until(lambda: replied_to(fake_telegram, GROUP, 970), what="the answer about the photo")
    turn = last_user_turn(fake_openai)
    assert "[attached image: mime_type=image/jpeg, size=98000]" in turn
    assert "> " + "x" * 200 + " [… 300 more characters cut]" in turn

    # A reply to the bot's own message: attributed to the assistant.
    own = {"message_id": 942, "from": fake_telegram.bot_user(), "chat": dict(CHAT), "date": 1735689050,
           "text": "answer 1"}
    reply_to_bot = {"message": tg_message(980, "why?", ALICE, reply_to_message=own)}
    fake_telegram.inject(reply_to_bot)
    await wait_until(lambda: replied_to(fake_telegram, GROUP, 980), what="the answer to the reply to the bot")
    turn = last_user_turn(fake_openai)
    assert "replies to a message by you (the assistant)" in turn and "> answer 1" in turn

    # The prefix is the same in every request: context never touches the system prompt or tools.
    firsts = {(r["json"]["messages"][0]["content"], repr(r["json"]["tools"])) for r in fake_openai.requests}
    assert len(firsts) == 1


FEISHU_GROUP = "oc_fakegroup0000000000000000000301"
FEISHU_BOB = "ou_fakebob000000000000000000000001"


def feishu_url(gateway) -> str:
    return f"http://127.0.0.1:{gateway.http_port}/feishu/events"


async def test_feishu_reply_reads_its_parent_and_a_topic_its_thread(tmp_path, fake_feishu, fake_openai, running):
    fake_feishu.reset()
    fake_openai.reset()
    fake_openai.responder = lambda req: oa.text(f"answer {len(fake_openai.requests)}")
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai, fake_feishu=fake_feishu), running)

    # Bob's message reached Feishu but not the bot (no mention); Alice replies to it, mentioning the bot.
    parent = fake_feishu.seed_message("The Q3 numbers are in the finance sheet, tab 'draft'",
                                      chat_id=FEISHU_GROUP, sender=FEISHU_BOB, create_ms=1735689000000)
    reply = fake_feishu.text_event("can you check them?", chat_id=FEISHU_GROUP, chat_type="group",
                                   mention_bot=True, parent_id=parent)
    assert (await fake_feishu.post_event(feishu_url(gateway), reply))[0] == 200
    await fake_feishu.wait_for_call("reply", lambda c: reply["event"]["message"]["message_id"] in c.path)
    [read] = fake_feishu.calls("get")
    assert read.path.endswith(f"/messages/{parent}") and read.token and read.token.startswith("t-")
    turn = last_user_turn(fake_openai)
    assert "This message replies to a message by Bob (2024-12-31 23:50 UTC):" in turn
    assert "> The Q3 numbers are in the finance sheet, tab 'draft'" in turn and turn.endswith("can you check them?")

    # A topic the bot was never part of: mentioned inside it, it reads the thread first.
    thread = "omt_fakectx000000001"
    root = fake_feishu.seed_message("Topic: on-call handover for December", chat_id=FEISHU_GROUP,
                                    sender=FEISHU_BOB, thread_id=thread, create_ms=1735689100000)
    for i, text in enumerate(["I take the first week", "I can do the second"]):
        fake_feishu.seed_message(text, chat_id=FEISHU_GROUP, thread_id=thread, parent_id=root, root_id=root,
                                 sender=FEISHU_BOB if i else "ou_fakealice00000000000000000000001",
                                 create_ms=1735689200000 + i * 1000)
    mention = fake_feishu.text_event("who is on call in week 2?", chat_id=FEISHU_GROUP, chat_type="group",
                                     mention_bot=True, thread_id=thread, parent_id=root, root_id=root)
    assert (await fake_feishu.post_event(feishu_url(gateway), mention))[0] == 200
    await fake_feishu.wait_for_call("reply", lambda c: mention["event"]["message"]["message_id"] in c.path)
    [listed] = fake_feishu.calls("list")
    assert listed.query["container_id_type"] == "thread" and listed.query["container_id"] == thread
    turn = last_user_turn(fake_openai)
    shown = [line.split("UTC] ", 1)[1] for line in turn.splitlines() if "UTC] " in line]
    assert shown == ["Bob: Topic: on-call handover for December", "Alice: I take the first week",
                     "Bob: I can do the second"]
    assert "replies to" not in turn  # the parent is the thread's first message, shown once
    assert len(fake_feishu.calls("get")) == 1

    # Without a message-read permission: answered without the context, the log says why.
    fake_feishu.can_read_messages = False
    other = fake_feishu.seed_message("a message the bot may not read", chat_id=FEISHU_GROUP, sender=FEISHU_BOB)
    blind = fake_feishu.text_event("and this?", chat_id=FEISHU_GROUP, chat_type="group", mention_bot=True,
                                   parent_id=other)
    assert (await fake_feishu.post_event(feishu_url(gateway), blind))[0] == 200
    await fake_feishu.wait_for_call("reply", lambda c: blind["event"]["message"]["message_id"] in c.path)
    turn = last_user_turn(fake_openai)
    assert "<chat_context" not in turn and turn.endswith("and this?")
