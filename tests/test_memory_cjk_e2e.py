"""Long-term memory in Japanese and Chinese end to end (issue 22): the real gateway and
python-telegram-bot against the loopback fakes, one gateway for the module. What the model is sent
is read from the fake OpenAI's recorded requests."""

from __future__ import annotations

import json
import time

import pytest

from tests.conftest import TEST_TOKEN, gateway_config
from tests.fakes import openai as oa
from tests.helpers import wait_until
from tests.test_memory_e2e import is_proposal, memory_lines, newest_user, owner_of_dm_for, proposal_ids, turn_requests
from tests.test_sessions_e2e import tg_command, tg_texts
from tests.test_telegram_e2e import dm_update, sends_to

TOLD_ZH = "我女儿名字是小米，今年5岁。对了，我的生日是3月14日，我现在住杭州。"
PROPOSED_ZH = [  # (what the model proposes, whether the user's words state it), checked in this order
    ("用户的女儿叫小米，今年5岁", True),
    ("用户的生日是5月20日", False),  # a changed number
    ("用户的女儿叫小红", False),  # a changed name sharing a character
    ("用户的生日是3月14日", True),
    ("用户住在北京", False),  # a place nobody said
    ("用户住在杭州", True),  # last: once it is stored, every candidate was judged
]


def respond(request):
    if not is_proposal(request):
        return oa.text("好的")
    if TOLD_ZH not in request["messages"][1]["content"]:
        return oa.text('{"memories": []}')
    (user_id,) = proposal_ids(request, "user")
    return oa.text(json.dumps({"memories": [{"text": text, "type": "fact", "evidence": [user_id], "confidence": 0.9}
                                            for text, _ in PROPOSED_ZH]}, ensure_ascii=False))


SEEDED_USER = 5563003
SEEDED = "我喜欢喝乌龙茶"
"""An entry stored before this release (no ``search_text``): the gateway's start analyses it."""


def seed_an_entry_from_an_older_release(config) -> None:
    from sqlalchemy import text

    from gateway.core.types import ChatAddress, InboundMessage, Sender
    from gateway.sessions.directory import Directory
    from gateway.store.db import create_db_engine, upgrade

    engine = create_db_engine(config.database.url)
    upgrade(engine)
    bot = TEST_TOKEN.partition(":")[0]  # Telegram's tenant is the bot id
    user = str(SEEDED_USER)
    user_id = Directory(engine).identify(InboundMessage(ChatAddress("telegram", bot, user), "seed", "dm",
                                                        Sender(user, "Li"), "hi")).user_id
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO memories (owner, text, type, source, confidence, created_at, hits, weight, "
                          "evidence) VALUES (:owner, :text, 'preference', 'user_explicit', 1, :now, 0, 2, '[]')"),
                     {"owner": f"user:{user_id}", "text": SEEDED, "now": time.time()})
    engine.dispose()


@pytest.fixture(scope="module")
async def gateway(tmp_path_factory, fake_telegram, fake_openai):
    from gateway.app.gateway import Gateway
    from gateway.app.wiring import build_adapters

    fake_openai.reset()
    fake_openai.responder = respond
    config = gateway_config(tmp_path_factory.mktemp("cjk"), fake_openai, fake_telegram, memory={"promote": True})
    seed_an_entry_from_an_older_release(config)
    gateway = Gateway(config, build_adapters(config))
    await gateway.start()
    yield gateway
    await gateway.stop()


async def test_an_entry_stored_before_the_upgrade_is_found_by_part_of_a_word(gateway, fake_telegram, fake_openai):
    fake_telegram.inject(dm_update("我平时爱喝什么茶？", 30301, SEEDED_USER))
    await wait_until(lambda: len(sends_to(fake_telegram, SEEDED_USER)) == 1, what="the answer")
    (request,) = [r for r in turn_requests(fake_openai) if newest_user(r).endswith("我平时爱喝什么茶？")]
    (line,) = memory_lines(newest_user(request))
    assert line.startswith("- (preference, ") and SEEDED in line


async def test_a_japanese_user_is_remembered_in_their_own_words(gateway, fake_telegram, fake_openai):
    user, ids = 5563001, iter(range(30001, 30100))
    lines = ["覚えておいて：私の誕生日は3月14日です", "犬の名前はポチって覚えといてね", "覚えてる？",
             "/new", "私の誕生日はいつ？", "/new", "犬の名前は？", "/memory"]
    for line in lines:
        update = tg_command if line.startswith("/") else dm_update
        fake_telegram.inject(update(line, next(ids), user))
    await wait_until(lambda: len(sends_to(fake_telegram, user)) == len(lines), what="replies")
    owner = owner_of_dm_for(gateway, "telegram", user)
    assert [m.text for m in gateway.memory.memories.entries(owner)] == ["私の誕生日は3月14日です", "犬の名前はポチ"]
    asked = {said: memory_lines(newest_user(r)) for r in turn_requests(fake_openai)
             if (said := newest_user(r).splitlines()[-1]) in ("私の誕生日はいつ？", "犬の名前は？")}
    assert len(asked["私の誕生日はいつ？"]) == 1 and "私の誕生日は3月14日です" in asked["私の誕生日はいつ？"][0]
    assert len(asked["犬の名前は？"]) == 1 and "犬の名前はポチ" in asked["犬の名前は？"][0]
    assert "2 in use" in tg_texts(fake_telegram, user)[-1]


async def test_only_proposals_the_chinese_users_words_state_are_stored(gateway, fake_telegram, fake_openai):
    user = 5563002
    fake_telegram.inject(dm_update(TOLD_ZH, 30201, user))
    await wait_until(lambda: any(is_proposal(r["json"]) and TOLD_ZH in r["json"]["messages"][1]["content"]
                                 for r in fake_openai.requests), what="the proposal call")
    owner = owner_of_dm_for(gateway, "telegram", user)
    grounded = [text for text, stated in PROPOSED_ZH if stated]
    await wait_until(lambda: grounded[-1] in [m.text for m in gateway.memory.memories.entries(owner)],
                     what="the last candidate judged")
    stored = gateway.memory.memories.entries(owner)
    assert [(m.text, m.source) for m in stored] == [(text, "task") for text in grounded]
