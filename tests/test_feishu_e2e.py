"""End to end through the real lark-oapi and openai clients against loopback fakes: Feishu events
reach the agent through the gateway's ``/feishu/events`` (plain, encrypted, signed) or the long
connection, and replies come back through the open API with the tenant token handled by the adapter."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import re
from typing import Any

import aiohttp
import pytest
from PIL import Image
from sqlalchemy import func, select

from gateway.core.errors import ConfigError
from gateway.store.models import InboxRow, OutboxRow
from tests.conftest import FEISHU_APP, FIXTURES, fixture, gateway_config, start_gateway
from tests.fakes import openai as oa
from tests.fakes.feishu import post_text
from tests.helpers import wait_until

EXPECTED = fixture("feishu", "expected.json")
BOB = "ou_fakebob000000000000000000000001"
P2P = "oc_fakep2p000000000000000000000001"
GROUP = "oc_fakegroup0000000000000000000001"
ENCRYPTED = {"encrypt_key_env": "GATEWAY_TEST_FEISHU_ENCRYPT_KEY"}




def url(gateway) -> str:
    return f"http://127.0.0.1:{gateway.http_port}/feishu/events"


def inbox_count(gateway) -> int:
    with gateway.engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(InboxRow)).scalar_one()


def model_inputs(fake_openai) -> list[str]:
    return [r["json"]["messages"][-1]["content"] for r in fake_openai.requests]


def sent_to(fake_feishu, chat_id: str, since: int = 0) -> list[dict[str, Any]]:
    return fake_feishu.sent(chat_id)[since:]


async def start(tmp_path, fake_openai, fake_feishu, running, **feishu: Any):
    fake_feishu.reset()
    config = gateway_config(tmp_path, fake_openai, fake_feishu=fake_feishu, feishu=feishu)
    return await start_gateway(config, running)


async def test_p2p_text_is_answered_once(tmp_path, fake_feishu, fake_openai, running):
    fake_openai.reset()
    fake_openai.responder = lambda req: oa.text("Your calendar is **free** today.")
    gateway = await start(tmp_path, fake_openai, fake_feishu, running)
    before = len(fake_feishu.sent(P2P))

    assert "ou_fakebot000000000000000000000001" in await gateway.adapters["feishu"].check()  # for doctor
    status, body = await fake_feishu.post_event(url(gateway), fixture("feishu", "url_verification.json"))
    assert (status, body) == (200, EXPECTED["url_verification.json"]["http_response"]["json"])

    status, body = await fake_feishu.post_event(url(gateway), fixture("feishu", "p2p_text.json"))
    assert status == 200 and body == {"msg": "success"}
    assert fake_feishu.event_deliveries[-1][1] < 1.0  # acked before any model work
    call = await fake_feishu.wait_for_call("create", lambda c: c.body["receive_id"] == P2P)
    assert call.query == {"receive_id_type": "chat_id"}
    assert call.body["msg_type"] == "post" and call.token.startswith("t-")
    assert call.content["zh_cn"]["content"] == [[
        {"tag": "text", "text": "Your calendar is "}, {"tag": "text", "text": "free", "style": ["bold"]},
        {"tag": "text", "text": " today."}]]
    assert call.body["uuid"].endswith(":p0")
    assert model_inputs(fake_openai)[0].endswith("Hello, what's on my calendar today?")

    # Feishu re-pushes the identical body (same event_id): acknowledged, not answered again.
    status, _ = await fake_feishu.post_event(url(gateway), fixture("feishu", "p2p_text_retry.json"))
    assert status == 200
    await wait_until(lambda: gateway.duplicates == 1, what="duplicate seen")
    await asyncio.sleep(0.2)
    assert len(sent_to(fake_feishu, P2P, before)) == 1 and len(fake_openai.requests) == 1


async def test_same_message_id_with_new_event_id_is_not_answered_twice(tmp_path, fake_feishu, fake_openai, running):
    fake_openai.reset()
    fake_openai.responder = lambda req: oa.text("once")
    gateway = await start(tmp_path, fake_openai, fake_feishu, running)
    chat = "oc_dedupe000000000000000000000001"
    event = fake_feishu.text_event("hello", chat_id=chat, message_id="om_dedupe0001")
    assert (await fake_feishu.post_event(url(gateway), event))[0] == 200
    await fake_feishu.wait_for_call("create", lambda c: c.body["receive_id"] == chat)
    again = fake_feishu.text_event("hello", chat_id=chat, message_id="om_dedupe0001")  # reconnect backfill
    assert again["header"]["event_id"] != event["header"]["event_id"]
    assert (await fake_feishu.post_event(url(gateway), again))[0] == 200
    await wait_until(lambda: gateway.duplicates == 1, what="duplicate seen")
    await asyncio.sleep(0.2)
    assert len(fake_feishu.sent(chat)) == 1 and len(fake_openai.requests) == 1


async def test_group_needs_a_mention_and_gets_a_reply_to_the_message(tmp_path, fake_feishu, fake_openai, running):
    fake_openai.reset()
    fake_openai.responder = lambda req: oa.text("I will ask Bob.")
    gateway = await start(tmp_path, fake_openai, fake_feishu, running)
    before = len(fake_feishu.sent(GROUP))

    # Same chat: the unaddressed message first, so a reply to it would be seen first.
    assert (await fake_feishu.post_event(url(gateway), fixture("feishu", "group_no_mention.json")))[0] == 200
    assert (await fake_feishu.post_event(url(gateway), fixture("feishu", "group_mention_text.json")))[0] == 200
    target = EXPECTED["group_mention_text.json"]["platform_message_id"]
    call = await fake_feishu.wait_for_call("reply", lambda c: c.path.endswith(f"{target}/reply"))
    assert call.body["reply_in_thread"] is False and call.body["msg_type"] == "post"
    assert post_text(call.content) == "I will ask Bob."
    inputs = model_inputs(fake_openai)
    assert len(inputs) == 1 and inputs[0].endswith("please ask @Bob to review the PR")
    assert "from Alice" in inputs[0]  # the sender's name from contact/v3 users
    await asyncio.sleep(0.2)
    assert len(sent_to(fake_feishu, GROUP, before)) == 1 and inbox_count(gateway) == 1


async def test_sender_names_fall_back_to_open_ids_without_contact_scope(tmp_path, fake_feishu, fake_openai, running):
    fake_openai.reset()
    fake_openai.responder = lambda req: oa.text("ok")
    gateway = await start(tmp_path, fake_openai, fake_feishu, running)
    fake_feishu.fail_next("user", 400, 99991672, "Access denied. One of the following scopes is required")
    first = fake_feishu.text_event("hi", chat_id=GROUP, chat_type="group", sender=BOB, mention_bot=True)
    second = fake_feishu.text_event("me too", chat_id=GROUP, chat_type="group", mention_bot=True)
    for event in (first, second):
        assert (await fake_feishu.post_event(url(gateway), event))[0] == 200
    await wait_until(lambda: len(fake_openai.requests) == 2, what="two turns")
    inputs = model_inputs(fake_openai)
    assert f"from {BOB}" in inputs[0] and "from ou_fakealice00000000000000000000001" in inputs[1]
    assert len(fake_feishu.calls("user")) == 1  # the refusal stops further lookups


async def test_post_with_mentions_shows_display_names_to_the_model(tmp_path, fake_feishu, fake_openai, running):
    fake_openai.reset()
    fake_openai.responder = lambda req: oa.text("noted")
    gateway = await start(tmp_path, fake_openai, fake_feishu, running)
    content = {"title": "Review", "content": [
        [{"tag": "at", "user_id": "@_user_1", "user_name": "Gateway"}, {"tag": "text", "text": " ask "},
         {"tag": "at", "user_id": "@_user_2", "user_name": "Bob"}, {"tag": "text", "text": " about "},
         {"tag": "a", "text": "the PR", "href": "https://example.com/pr/1"}],
        [{"tag": "img", "image_key": "img_v3_post_1"}]]}
    event = fake_feishu.text_event("", chat_id=GROUP, chat_type="group", mention_bot=True, mentions=[(BOB, "Bob")],
                                   message_type="post", content=content)
    picture = io.BytesIO()
    Image.new("RGB", (64, 48), (9, 9, 9)).save(picture, "PNG")
    fake_feishu.add_resource(event["event"]["message"]["message_id"], "img_v3_post_1", picture.getvalue())
    assert (await fake_feishu.post_event(url(gateway), event))[0] == 200
    await fake_feishu.wait_for_call("reply", lambda c: event["event"]["message"]["message_id"] in c.path)
    text_part, image_part = fake_openai.requests[0]["json"]["messages"][-1]["content"]
    seen = text_part["text"]
    assert seen.endswith("Review\nask @Bob about [the PR](https://example.com/pr/1)")
    assert "[image unnamed (image/png" in seen and "Gateway" not in seen.split("]")[-1]
    assert image_part["type"] == "image_url"  # the post's embedded image, from the message's resources


async def test_topic_thread_reply_and_follow_up_without_mention(tmp_path, fake_feishu, fake_openai, running):
    fake_openai.reset()
    fake_openai.responder = lambda req: oa.text(f"answer {len(req['messages'])}")
    gateway = await start(tmp_path, fake_openai, fake_feishu, running)
    topic = EXPECTED["topic_thread_reply.json"]
    assert (await fake_feishu.post_event(url(gateway), fixture("feishu", "topic_thread_reply.json")))[0] == 200
    call = await fake_feishu.wait_for_call("reply", lambda c: topic["platform_message_id"] in c.path)
    assert call.body["reply_in_thread"] is True

    # In that thread the bot answers without a mention; in a thread it is not part of, it does not.
    follow = fake_feishu.text_event("and the second one?", chat_id=topic["chat_id"], chat_type="group",
                                    thread_id=topic["thread_id"], sender=BOB)
    other = fake_feishu.text_event("not for the bot", chat_id=topic["chat_id"], chat_type="group",
                                   thread_id="omt_unknown0000001", sender=BOB)
    assert (await fake_feishu.post_event(url(gateway), other))[0] == 200
    assert (await fake_feishu.post_event(url(gateway), follow))[0] == 200
    second = await fake_feishu.wait_for_call("reply", lambda c: follow["event"]["message"]["message_id"] in c.path)
    assert second.body["reply_in_thread"] is True
    await asyncio.sleep(0.2)
    assert inbox_count(gateway) == 2 and len(fake_openai.requests) == 2
    assert [m["thread_id"] for m in fake_feishu.sent(topic["chat_id"])][-2:] == [topic["thread_id"]] * 2


async def test_encrypted_and_signed_events(tmp_path, fake_feishu, fake_openai, running, caplog, monkeypatch):
    import adapters.feishu.adapter as feishu_adapter

    caplog.set_level(logging.DEBUG)
    fake_openai.reset()
    fake_openai.responder = lambda req: oa.text("decrypted and answered")
    gateway = await start(tmp_path, fake_openai, fake_feishu, running, **ENCRYPTED)
    before = len(fake_feishu.sent(P2P))

    # The fixture's bytes with its recorded signature headers.
    raw = (FIXTURES / "feishu" / "p2p_text_encrypted.json").read_bytes()
    headers = EXPECTED["p2p_text_encrypted.json"]["delivery"]["headers"]
    fake_feishu._learn(fixture("feishu", "p2p_text.json"))
    # Recorded on 2025-01-01: today it is a replay, past Feishu's 7-hour re-push window.
    assert (await fake_feishu.post_event(url(gateway), raw=raw, headers=headers))[0] == 401
    fresh = feishu_adapter._fresh
    recorded = float(headers["X-Lark-Request-Timestamp"])
    monkeypatch.setattr(feishu_adapter, "_fresh", lambda timestamp: fresh(timestamp, now=recorded + 20))
    status, _ = await fake_feishu.post_event(url(gateway), raw=raw, headers=headers)  # as on the day
    assert status == 200
    monkeypatch.setattr(feishu_adapter, "_fresh", fresh)
    call = await fake_feishu.wait_for_call("create", lambda c: post_text(c.content) == "decrypted and answered")
    assert call.body["receive_id"] == P2P
    assert model_inputs(fake_openai)[0].endswith("Hello, what's on my calendar today?")

    # An encrypted challenge, and a fresh encrypted + signed event.
    challenge = {"challenge": "enc-challenge-1", "token": FEISHU_APP["verification_token"], "type": "url_verification"}
    answer = await fake_feishu.post_event(url(gateway), challenge, encrypt=True)
    assert answer == (200, {"challenge": "enc-challenge-1"})
    event = fake_feishu.text_event("second, encrypted", chat_id=P2P)
    assert (await fake_feishu.post_event(url(gateway), event, encrypt=True))[0] == 200
    await wait_until(lambda: len(sent_to(fake_feishu, P2P, before)) == 2, what="second reply")

    # Bad signature, wrong verification token, undecryptable and malformed bodies: nothing stored.
    stored = inbox_count(gateway)
    forged = fake_feishu.text_event("forged", chat_id=P2P)
    assert (await fake_feishu.post_event(url(gateway), forged, encrypt=True, sign_key="wrong-key"))[0] == 401
    wrong_token = fake_feishu.text_event("wrong token", chat_id=P2P)
    wrong_token["header"]["token"] = "not-the-token"
    assert (await fake_feishu.post_event(url(gateway), wrong_token, encrypt=True))[0] == 401
    # Unsigned while an encrypt key is set (Feishu then signs every event): forged, even when
    # readable and carrying the token; an unsigned URL challenge is still answered (token checked).
    unsigned = fake_feishu.text_event("unsigned", chat_id=P2P)
    assert (await fake_feishu.post_event(url(gateway), unsigned))[0] == 401
    assert (await fake_feishu.post_event(url(gateway), unsigned, encrypt=True, sign=False))[0] == 401
    plain_challenge = {**challenge, "challenge": "plain-challenge-2"}
    assert await fake_feishu.post_event(url(gateway), plain_challenge, encrypt=True, sign=False) == \
        (200, {"challenge": "plain-challenge-2"})
    # Unsigned and unreadable: nothing vouches for them (no signature, no readable token).
    garbage = json.dumps({"encrypt": "AAECAwQFBgcICQoLDA0ODw==" + "Zm9v" * 8}).encode()
    assert (await fake_feishu.post_event(url(gateway), raw=garbage))[0] == 401
    assert (await fake_feishu.post_event(url(gateway), raw=b"{not json"))[0] == 401
    # Signed with the Encrypt Key but unreadable: authentic, so acknowledged (Feishu would push it again).
    assert (await fake_feishu.post_event(url(gateway), raw=garbage, sign=True))[0] == 200
    assert inbox_count(gateway) == stored
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "undecryptable" in logged and "bad signature" in logged
    for secret in (FEISHU_APP["encrypt_key"], FEISHU_APP["app_secret"], FEISHU_APP["verification_token"]):
        assert secret not in logged
    assert not re.search(r"\bt-\d+\b", logged)  # no tenant token either


async def test_plain_mode_rejects_a_wrong_verification_token(tmp_path, fake_feishu, fake_openai, running):
    fake_openai.reset()
    gateway = await start(tmp_path, fake_openai, fake_feishu, running)
    event = fake_feishu.text_event("sneaky", chat_id=P2P)
    event["header"]["token"] = "wrong"
    assert (await fake_feishu.post_event(url(gateway), event))[0] == 401
    challenge = {"challenge": "c", "token": "wrong", "type": "url_verification"}
    assert (await fake_feishu.post_event(url(gateway), challenge))[0] == 401
    # An encrypted body while no encrypt key is configured cannot be read, nor its token checked.
    assert (await fake_feishu.post_event(url(gateway), fake_feishu.text_event("x"), encrypt=True))[0] == 401
    assert inbox_count(gateway) == 0 and not fake_openai.requests


async def test_an_authentic_event_of_the_wrong_shape_is_acknowledged_and_dropped(tmp_path, fake_feishu, fake_openai,
                                                                                 running):
    """Feishu pushes again whatever is not answered 200: a malformed event is logged, answered 200
    (so it is not pushed forever) and stores nothing; the next good event is answered."""
    fake_openai.reset()
    fake_openai.responder = lambda req: oa.text("ok")
    gateway = await start(tmp_path, fake_openai, fake_feishu, running)
    broken = []
    for mutate in (lambda e: e.update(event="x"),
                   lambda e: e["event"].update(message="x"),
                   lambda e: e["event"]["message"].update(mentions="x"),
                   lambda e: (e["header"].update(event_type="card.action.trigger"), e.update(event="x"))):
        event = fake_feishu.text_event("shape", chat_id=P2P)
        mutate(event)
        broken.append(event)
    for event in broken:
        assert (await fake_feishu.post_event(url(gateway), raw=json.dumps(event).encode()))[0] == 200
    assert inbox_count(gateway) == 0 and not fake_openai.requests
    assert (await fake_feishu.post_event(url(gateway), fake_feishu.text_event("fine", chat_id=P2P)))[0] == 200
    await wait_until(lambda: len(sent_to(fake_feishu, P2P)) == 1, what="the good event answered")


@pytest.mark.parametrize("status", [400, 200])
async def test_token_expiry_mid_conversation_refetches_once(tmp_path, fake_feishu, fake_openai, running, status):
    fake_openai.reset()
    fake_openai.responder = lambda req: oa.text(f"reply {len(req['messages'])}")
    gateway = await start(tmp_path, fake_openai, fake_feishu, running)
    gateway.adapters["feishu"].typing_emoji = None  # so the reply is the first call to meet the revoked token
    chat = f"oc_expiry{status}00000000000000000001"
    assert (await fake_feishu.post_event(url(gateway), fake_feishu.text_event("one", chat_id=chat)))[0] == 200
    first = await fake_feishu.wait_for_call("create", lambda c: c.body["receive_id"] == chat)

    tokens = fake_feishu.tokens_issued
    fake_feishu.invalid_token_status = status
    fake_feishu.revoke_tokens()
    assert (await fake_feishu.post_event(url(gateway), fake_feishu.text_event("two", chat_id=chat)))[0] == 200
    await wait_until(lambda: len(fake_feishu.sent(chat)) == 2, what="reply after refetch")
    creates = [c for c in fake_feishu.calls("create") if c.body["receive_id"] == chat]
    assert [(c.status, c.code) for c in creates] == [(200, 0), (status, 99991663), (200, 0)]
    assert creates[1].token == first.token and creates[2].token != first.token
    assert fake_feishu.tokens_issued == tokens + 1
    assert post_text(fake_feishu.sent(chat)[1]["content"]) == "reply 4"
    with gateway.engine.connect() as conn:  # retried inside the same delivery attempt, not by backoff
        assert conn.execute(select(OutboxRow.attempts).order_by(OutboxRow.id)).scalars().all() == [1, 1]


async def test_other_error_codes_do_not_refetch_the_token(tmp_path, fake_feishu, fake_openai, running):
    fake_openai.reset()
    fake_openai.responder = lambda req: oa.text("not delivered")
    gateway = await start(tmp_path, fake_openai, fake_feishu, running)
    chat = "oc_notinchat0000000000000000000001"
    await gateway.adapters["feishu"].tokens.get()  # the start-up token
    tokens = fake_feishu.tokens_issued
    fake_feishu.fail_next("create", 400, 230002, "Bot/User can NOT be out of the chat.")
    assert (await fake_feishu.post_event(url(gateway), fake_feishu.text_event("hi", chat_id=chat)))[0] == 200
    await wait_until(lambda: any(c.code == 230002 for c in fake_feishu.calls("create")), what="refused create")
    await asyncio.sleep(0.3)
    assert fake_feishu.tokens_issued == tokens
    assert len([c for c in fake_feishu.calls("create") if c.body["receive_id"] == chat]) == 1  # permanent


async def test_rate_limit_is_retried_after_reset_with_the_same_uuid(tmp_path, fake_feishu, fake_openai, running):
    fake_openai.reset()
    fake_openai.responder = lambda req: oa.text("after the limit")
    gateway = await start(tmp_path, fake_openai, fake_feishu, running)
    chat = "oc_ratelimit000000000000000000001"
    fake_feishu.fail_next("create", 429, 99991400, headers={"x-ogw-ratelimit-reset": "1.5"})
    assert (await fake_feishu.post_event(url(gateway), fake_feishu.text_event("hi", chat_id=chat)))[0] == 200
    await wait_until(lambda: len(fake_feishu.sent(chat)) == 1, what="retried reply")
    creates = [c for c in fake_feishu.calls("create") if c.body["receive_id"] == chat]
    assert [c.code for c in creates] == [99991400, 0]
    assert creates[1].time - creates[0].time >= 1.4  # the header's value, not a default
    assert creates[0].body["uuid"] == creates[1].body["uuid"]
    await wait_until(lambda: gateway.delivery.sent >= 1, what="sent recorded")  # counted after the DB write


async def test_a_rate_limit_with_under_a_second_left_does_not_use_up_the_retries(tmp_path, fake_feishu, fake_openai,
                                                                                   running):
    """Feishu's ``x-ogw-ratelimit-reset`` counts whole seconds, so under a second left reads ``0``:
    the reply is tried again after a second, when the window has turned, and arrives once. Found by
    a review: 0 was taken as "retry now", every attempt (delivery.max_attempts) was made within
    the same window and refused, and the reply was failed: the user got nothing."""
    fake_openai.reset()
    fake_openai.responder = lambda req: oa.text("after the limit")
    gateway = await start(tmp_path, fake_openai, fake_feishu, running)
    chat = "oc_ratelimit000000000000000000002"
    fake_feishu.rate_limit("create", 0.9)
    assert (await fake_feishu.post_event(url(gateway), fake_feishu.text_event("hi", chat_id=chat)))[0] == 200
    await wait_until(lambda: gateway.store.outbox_rows() and gateway.store.outbox_rows()[-1]["status"] in
                     ("sent", "failed"), timeout=10, what="the reply settled")
    assert gateway.store.outbox_rows()[-1]["status"] == "sent"
    assert [post_text(m["content"]) for m in fake_feishu.sent(chat)] == ["after the limit"]


async def test_links_feishu_refuses_do_not_lose_the_reply(tmp_path, fake_feishu, fake_openai, running):
    """Feishu takes only http(s) links in a post (230001 "invalid href" otherwise), and models link
    to files and anchors: such a link is sent as its text; real links stay links; one post."""
    fake_openai.reset()
    fake_openai.responder = lambda req: oa.text(
        "See [README](./README.md), [setup](#setup), [notes](file:///home/me/notes.md), <ops@example.com> "
        "and [the docs](https://example.com/docs).")
    gateway = await start(tmp_path, fake_openai, fake_feishu, running)
    chat = "oc_links00000000000000000000000001"
    assert (await fake_feishu.post_event(url(gateway), fake_feishu.text_event("where?", chat_id=chat)))[0] == 200
    await wait_until(lambda: len(fake_feishu.sent(chat)) == 1, what="the reply")
    await asyncio.sleep(0.3)
    [message] = fake_feishu.sent(chat)
    assert post_text(message["content"]) == "See README, setup, notes, ops@example.com and the docs."
    links = [el for row in message["content"]["zh_cn"]["content"] for el in row if el["tag"] == "a"]
    assert links == [{"tag": "a", "text": "the docs", "href": "https://example.com/docs"}]
    assert [c.code for c in fake_feishu.calls("create") if c.body["receive_id"] == chat] == [0]


async def test_formatting_refused_is_resent_as_text_once(tmp_path, fake_feishu, fake_openai, running):
    """When Feishu refuses a post's content (230001: "invalid message content"), nothing was sent:
    the part goes again once as a plain ``text`` message (its own ``uuid``), and the reply arrives."""
    fake_openai.reset()
    fake_openai.responder = lambda req: oa.text("Use **bold** and `code`:\n\n```py\nx = 1\n```")
    gateway = await start(tmp_path, fake_openai, fake_feishu, running)
    chat = "oc_refused0000000000000000000001"
    fake_feishu.fail_next("create", 400, 230001, "Your request contains an invalid request parameter, "
                          "ext=invalid message content")
    assert (await fake_feishu.post_event(url(gateway), fake_feishu.text_event("fmt", chat_id=chat)))[0] == 200
    await wait_until(lambda: len(fake_feishu.sent(chat)) == 1, what="the plain resend")
    await asyncio.sleep(0.3)
    creates = [c for c in fake_feishu.calls("create") if c.body["receive_id"] == chat]
    assert [(c.body["msg_type"], c.code) for c in creates] == [("post", 230001), ("text", 0)]
    assert creates[0].body["uuid"] != creates[1].body["uuid"]
    [message] = fake_feishu.sent(chat)
    assert message["content"] == {"text": "Use bold and `code`:\nx = 1"}


async def test_long_reply_is_split_into_accepted_posts(tmp_path, fake_feishu, fake_openai, running):
    fake_openai.reset()
    lines = [f"- item {i}: " + "长文本 long text " * 12 for i in range(400)]
    fake_openai.script(oa.text("**Report**\n\n" + "\n".join(lines) + "\n\n```python\nprint('done')\n```"))
    gateway = await start(tmp_path, fake_openai, fake_feishu, running)
    chat = "oc_longreply00000000000000000001"
    assert (await fake_feishu.post_event(url(gateway), fake_feishu.text_event("report", chat_id=chat)))[0] == 200
    await wait_until(lambda: any(m["content"]["zh_cn"]["content"][-1][0]["tag"] == "code_block"
                                 for m in fake_feishu.sent(chat)), what="last part")
    sent = fake_feishu.sent(chat)
    assert len(sent) >= 3
    creates = [c for c in fake_feishu.calls("create") if c.body["receive_id"] == chat]
    assert all(c.code == 0 for c in creates) and len(creates) == len(sent)
    assert [c.body["uuid"][-3:] for c in creates] == [f":p{i}" for i in range(len(sent))]
    text = "\n".join(post_text(m["content"]) for m in sent)
    assert text.startswith("Report\n• item 0: ") and text.count("• item") == 400


async def test_typing_reaction_is_added_and_removed(tmp_path, fake_feishu, fake_openai, running):
    fake_openai.reset()
    fake_openai.script(oa.delay(1.2, "thought about it"))  # the indicator starts after 0.5 s
    gateway = await start(tmp_path, fake_openai, fake_feishu, running)
    chat = "oc_typing0000000000000000000000001"
    event = fake_feishu.text_event("slow one", chat_id=chat)
    message_id = event["event"]["message"]["message_id"]
    assert (await fake_feishu.post_event(url(gateway), event))[0] == 200
    added = await fake_feishu.wait_for_call("reaction", lambda c: message_id in c.path)
    assert added.body == {"reaction_type": {"emoji_type": "Typing"}}
    await fake_feishu.wait_for_call("reaction_delete", lambda c: message_id in c.path)
    assert len([c for c in fake_feishu.calls("reaction") if message_id in c.path]) == 1
    assert not [r for r in fake_feishu.reactions() if r["message_id"] == message_id]
    assert len(fake_feishu.sent(chat)) == 1
    await wait_until(lambda: gateway.delivery.sent >= 1, what="sent recorded")  # counted after the DB write


async def test_long_connection_mode(tmp_path, fake_feishu, fake_openai, running):
    fake_openai.reset()
    fake_openai.responder = lambda req: oa.text("over the long connection")
    gateway = await start(tmp_path, fake_openai, fake_feishu, running, mode="websocket")
    assert gateway.adapters["feishu"].routes() == []
    await fake_feishu.wait_ws_connected()
    chat = "oc_websocket0000000000000000000001"
    ack = await fake_feishu.ws_push(fake_feishu.text_event("hello over ws", chat_id=chat))
    assert ack["code"] == 200
    call = await fake_feishu.wait_for_call("create", lambda c: c.body["receive_id"] == chat)
    assert post_text(call.content) == "over the long connection"
    ack = await fake_feishu.ws_push(fixture("feishu", "group_no_mention.json"))  # ignored, still acked
    assert ack["code"] == 200 and inbox_count(gateway) == 1
    await gateway.stop()
    running.remove(gateway)
    async with aiohttp.ClientSession():
        await wait_until(lambda: not fake_feishu._ws, timeout=5, what="long connection closed")


def test_wiring_requires_a_verification_token_in_webhook_mode(tmp_path, fake_feishu, fake_openai):
    from gateway.app.wiring import build_adapters

    config = gateway_config(tmp_path, fake_openai, fake_feishu=fake_feishu,
                            feishu={"verification_token_env": "GATEWAY_TEST_FEISHU_UNSET"})
    with pytest.raises(ConfigError, match="GATEWAY_TEST_FEISHU_UNSET"):
        build_adapters(config)
    config = gateway_config(tmp_path, fake_openai, fake_feishu=fake_feishu,
                            feishu={"verification_token_env": "GATEWAY_TEST_FEISHU_UNSET", "mode": "websocket"})
    assert [a.platform for a in build_adapters(config)] == ["feishu", "web"]  # the web chat is on by default
    config = gateway_config(tmp_path, fake_openai, fake_feishu=fake_feishu, feishu={"domain": "http://example.com"})
    with pytest.raises(ConfigError, match=r"feishu\.domain"):
        build_adapters(config)
