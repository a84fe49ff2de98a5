"""The Telegram group gate end to end (python-telegram-bot against the fake Bot API): in a group the
bot answers a mention (also in a photo caption), a reply to one of its own messages and
``/cmd@thisbot``; it ignores plain messages, replies to other bots or people, and ``/cmd@otherbot``.

Updates are handled in order, so once the last (addressed) message of a test is answered every
earlier update has been handled and the counts are final."""

from __future__ import annotations

import copy
from typing import Any

from tests.conftest import fixture, gateway_config, start_gateway
from tests.fakes import openai as oa
from tests.helpers import wait_until

GROUP, SUPERGROUP, FORUM = -4000000101, -1001000000101, -1001000000102
OTHER_BOT = {"id": 7000000099, "is_bot": True, "first_name": "Other Bot", "username": "other_helper_bot"}
BOB = {"id": 5550002, "is_bot": False, "first_name": "Bob"}


def group_message(text: str, message_id: int, chat_id: int = GROUP, **extra: Any) -> dict[str, Any]:
    kind = "supergroup" if str(chat_id).startswith("-100") else "group"
    return {"message": {"message_id": message_id, "from": copy.deepcopy(BOB),
                        "chat": {"id": chat_id, "title": "Team", "type": kind}, "date": 1735689000,
                        "text": text, **extra}}


def command(text: str, message_id: int, chat_id: int = GROUP) -> dict[str, Any]:
    length = len(text.split()[0])
    return group_message(text, message_id, chat_id, entities=[{"type": "bot_command", "offset": 0, "length": length}])


def replying_to(author: dict[str, Any], chat_id: int, text: str = "an earlier message") -> dict[str, Any]:
    kind = "supergroup" if str(chat_id).startswith("-100") else "group"
    return {"message_id": 1, "from": copy.deepcopy(author), "chat": {"id": chat_id, "title": "Team", "type": kind},
            "date": 1735688000, "text": text}


def sends(fake, chat_id: int) -> list:
    return [c for c in fake.calls("sendMessage") if int(c.params["chat_id"]) == chat_id]


def answered(fake, chat_id: int, message_id: int) -> bool:
    return any(c.params.get("reply_parameters", {}).get("message_id") == message_id for c in sends(fake, chat_id))


def with_chat(update: dict[str, Any], chat_id: int) -> dict[str, Any]:
    update = copy.deepcopy(update)
    update.pop("update_id", None)
    update["message"]["chat"]["id"] = chat_id
    if "reply_to_message" in update["message"]:
        update["message"]["reply_to_message"]["chat"]["id"] = chat_id
    return update


async def test_what_addresses_the_bot_in_a_group(tmp_path, fake_telegram, fake_openai, running):
    fake_openai.reset()
    fake_openai.responder = lambda req: oa.text(f"answer {len(fake_openai.requests)}")
    await start_gateway(gateway_config(tmp_path, fake_openai, fake_telegram), running)
    bot_user = fake_telegram.bot_user()

    ignored = [
        group_message("just chatting", 101),
        group_message("which warnings?", 102, reply_to_message=replying_to(OTHER_BOT, GROUP)),
        group_message("agreed", 103, reply_to_message=replying_to({**BOB, "id": 5550003}, GROUP)),
        command("/help@other_helper_bot", 104),
        command("/status@other_helper_bot now", 105),
        group_message("@other_helper_bot hi", 106, entities=[{"type": "mention", "offset": 0, "length": 17}]),
    ]
    for update in ignored:
        fake_telegram.inject(update)
    fake_telegram.inject(command("/help@gateway_test_bot", 107))
    await wait_until(lambda: answered(fake_telegram, GROUP, 107), what="the /help answer")
    assert len(sends(fake_telegram, GROUP)) == 1  # nothing else in the group was answered
    help_call = sends(fake_telegram, GROUP)[0]
    assert help_call.params["text"].startswith("I am an AI assistant")
    assert help_call.params["reply_parameters"]["message_id"] == 107
    assert fake_openai.requests == []  # nothing before it reached the model

    # A reply to one of the bot's own messages, without a mention (supergroup fixture).
    fake_telegram.inject(with_chat(fixture("telegram", "supergroup_reply_to_bot.json"), SUPERGROUP))
    await wait_until(lambda: answered(fake_telegram, SUPERGROUP, 4411), what="answer to the reply")
    assert len(sends(fake_telegram, SUPERGROUP)) == 1
    assert fake_openai.requests[-1]["json"]["messages"][-1]["content"].endswith("Which warnings exactly?")

    # A mention in a photo caption (caption_entities).
    fake_telegram.inject(with_chat(fixture("telegram", "group_photo_caption_mention.json"), GROUP))
    await wait_until(lambda: answered(fake_telegram, GROUP, 2202), what="answer to the captioned photo")
    assert len(sends(fake_telegram, GROUP)) == 2
    assert "what is in this screenshot?" in fake_openai.requests[-1]["json"]["messages"][-1]["content"]
    assert "@gateway_test_bot" not in fake_openai.requests[-1]["json"]["messages"][-1]["content"]

    # In a forum topic every message "replies" to the topic's creation message: not to the bot.
    topic = fixture("telegram", "forum_topic_mention.json")
    topic.pop("update_id")
    topic["message"]["chat"]["id"] = topic["message"]["reply_to_message"]["chat"]["id"] = FORUM
    unaddressed = copy.deepcopy(topic)
    unaddressed["message"].update(message_id=3306, text="thanks all")
    unaddressed["message"].pop("entities")
    fake_telegram.forum_chats.add(FORUM)
    try:
        fake_telegram.inject(unaddressed)
        fake_telegram.inject(group_message("ok", 108, SUPERGROUP,
                                           reply_to_message=replying_to(bot_user, SUPERGROUP, "Build #512 done")))
        await wait_until(lambda: answered(fake_telegram, SUPERGROUP, 108), what="second reply to the bot")
    finally:
        fake_telegram.forum_chats.discard(FORUM)
    assert sends(fake_telegram, FORUM) == []
    assert len(fake_openai.requests) == 3 and len(sends(fake_telegram, GROUP)) == 2
