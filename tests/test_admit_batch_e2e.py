"""A burst's admit, step by step for the whole batch (``Inbound._admit_set``), on SQLite and on
PostgreSQL: Telegram webhooks that arrive while another writer holds the inbox are stored together
once it lets go. Each is acknowledged only once stored, in the order they came; a sender with two
of them is created once; a sender known before keeps their user; a chat's settings apply to its
new session; a chat's two messages are answered one after the other, each once, the second with
the first in its context; a redelivery, and
a message posted twice in one batch, are refused once each and the rest of that batch stored."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from sqlalchemy import func, select

from gateway.store.db import write_tx
from gateway.store.models import IdentityRow, InboxRow
from tests.conftest import gateway_config, start_gateway
from tests.fakes import openai as oa
from tests.test_telegram_e2e import dm_update, sends_to

SECRET = "webhook-secret-0123456789"


class _InboxHeld:
    """Another writer holding the inbox until released: on SQLite the database's write lock (a
    transaction open), on PostgreSQL an ``EXCLUSIVE`` lock on the inbox table (reads go on, every
    insert waits)."""

    def __init__(self, engine: Any) -> None:
        self._engine = engine
        self._holding, self._release = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._hold)

    def _hold(self) -> None:
        with write_tx(self._engine) as conn:
            if self._engine.dialect.name == "postgresql":
                conn.exec_driver_sql("LOCK TABLE inbox IN EXCLUSIVE MODE")
            self._holding.set()
            self._release.wait(10)

    async def __aenter__(self) -> _InboxHeld:
        self._thread.start()
        assert await asyncio.to_thread(self._holding.wait, 5)
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self._release.set()
        await asyncio.to_thread(self._thread.join, 5)


def _last_user_text(request: dict[str, Any]) -> str:
    content = [m for m in request["messages"] if m["role"] == "user"][-1]["content"]
    return content if isinstance(content, str) else " ".join(p.get("text", "") for p in content)


def _answer(request: dict[str, Any]) -> oa.TextReply:
    """Names the message it answers (its word ``w<n>``), so a reply shows which turn sent it."""
    word = next(w for w in _last_user_text(request).split() if w.startswith("w"))
    return oa.text(f"re {word}")


async def _post_held(fake_telegram, engine: Any, url: str, updates: list[dict[str, Any]]) -> list[int]:
    """Posts ``updates`` in order while the inbox is held; none is acknowledged before it lets go."""
    async with _InboxHeld(engine):
        posts = []
        for update in updates:  # a little apart, so they reach the gateway in this order
            posts.append(asyncio.ensure_future(fake_telegram.post_webhook(url, update, SECRET)))
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.2)
        assert not any(p.done() for p in posts)  # nothing acknowledged while nothing could be stored
    return list(await asyncio.gather(*posts))


def _users(db_url: str, n: int, offset: int = 0) -> list[int]:
    """``n`` Telegram users (and their DM chats) of this test and backend alone: the fake keeps
    every call it was sent across tests."""
    base = 5553000 if db_url.startswith("sqlite") else 5554000
    return [base + offset + i for i in range(1, n + 1)]


def _stored(engine: Any) -> list[tuple[int, str]]:
    """(chat, text) of the inbox rows in the order they were stored."""
    with engine.connect() as conn:
        rows = conn.execute(select(InboxRow.payload).order_by(InboxRow.id)).scalars().all()
    return [(int(p["address"]["chat_id"]), p["text"]) for p in rows]


def _stored_tenant(engine: Any) -> str:
    """The Telegram tenant (the bot's id) of the stored rows."""
    with engine.connect() as conn:
        return str(conn.execute(select(InboxRow.tenant).limit(1)).scalar_one())


def _identities(engine: Any, user: int) -> list[str]:
    """The user ids the gateway holds for Telegram user ``user``."""
    with engine.connect() as conn:
        return list(conn.execute(select(IdentityRow.user_id).where(
            IdentityRow.platform == "telegram", IdentityRow.platform_user_id == str(user))).scalars())


async def test_a_batch_of_webhooks_is_admitted_together_each_sender_once_each_message_answered_once(
        db_url, tmp_path, fake_telegram, fake_openai, running):
    fake_openai.reset()
    fake_openai.responder = _answer
    config = gateway_config(tmp_path, fake_openai, fake_telegram, database={"url": db_url},
                            telegram={"mode": "webhook"}, agent={"streaming": []})
    gateway = await start_gateway(config, running)
    engine = gateway.engine
    url = f"http://127.0.0.1:{gateway.http_port}/telegram/webhook"
    known, first, a, b, c, d = _users(db_url, 6)

    assert await fake_telegram.post_webhook(url, dm_update("w0 hello", 9800, user_id=known), SECRET) == 200
    await fake_telegram.wait_for_call("sendMessage", lambda call: int(call.params["chat_id"]) == known, timeout=15)
    known_user = _identities(engine, known)
    batches = gateway.inbound._admits.batches
    tenant = _stored_tenant(engine)
    # c's chat has a persona an admin set: the batch reads the chats' settings together, and c's
    # new session is made with it, the others' without
    gateway.chats.overrides.set("telegram", tenant, str(c), "persona", "Answer like a pirate.", "telegram:1")

    # The first waits on the inbox in a transaction of its own; the rest arrive meanwhile and are
    # admitted together once it committed: a's two messages among them, the known sender too.
    burst = [dm_update("w1 first", 9801, user_id=first), dm_update("w2 from a", 9802, user_id=a),
             dm_update("w3 from b", 9803, user_id=b), dm_update("w4 again a", 9804, user_id=a),
             dm_update("w5 known", 9805, user_id=known), dm_update("w6 from c", 9806, user_id=c)]
    assert await _post_held(fake_telegram, engine, url, burst) == [200] * 6
    assert gateway.inbound._admits.batches > batches
    assert _stored(engine)[1:] == [(first, "w1 first"), (a, "w2 from a"), (b, "w3 from b"), (a, "w4 again a"),
                                   (known, "w5 known"), (c, "w6 from c")]
    assert _identities(engine, known) == known_user
    for user in (first, a, b, c):
        assert len(_identities(engine, user)) == 1

    # A redelivery of b's message among the next batch, and d's message twice in it (a retry that
    # came before the first was acknowledged): each refused, the others stored once.
    again = [dm_update("w7 first again", 9807, user_id=first), dm_update("w3 from b", 9803, user_id=b),
             dm_update("w8 from d", 9808, user_id=d), dm_update("w8 from d", 9808, user_id=d)]
    assert await _post_held(fake_telegram, engine, url, again) == [200] * 4
    assert _stored(engine)[7:] == [(first, "w7 first again"), (d, "w8 from d")]
    assert (gateway.inbound.received, gateway.inbound.duplicates) == (9, 2)

    answers = {known: ["re w0", "re w5"], first: ["re w1", "re w7"], a: ["re w2", "re w4"], b: ["re w3"],
               c: ["re w6"], d: ["re w8"]}
    for chat, texts in answers.items():
        count = len(texts)
        await fake_telegram.wait_for_call(
            "sendMessage", lambda call, chat=chat, count=count: len(sends_to(fake_telegram, chat)) >= count, timeout=15)
    await asyncio.sleep(0.3)
    for chat, texts in answers.items():  # each once, a chat's in the order its messages came
        assert [call.params["text"] for call in sends_to(fake_telegram, chat)] == texts
    systems = {_answer(record["json"]).content.split()[-1]: record["json"]["messages"][0]["content"]
               for record in fake_openai.requests}
    assert "Answer like a pirate." in systems["w6"]
    assert not any("pirate" in systems[word] for word in ("w1", "w2", "w3", "w4", "w5"))
    # the session a new chat got at its batch's admit is the chat's: its next turn continues it
    contexts = {_answer(record["json"]).content.split()[-1]: [m.get("content") for m in record["json"]["messages"]]
                for record in fake_openai.requests}
    assert "w1 first" in str(contexts["w7"]) and "re w1" in str(contexts["w7"])
    assert "w2 from a" in str(contexts["w4"]) and "w0 hello" in str(contexts["w5"])
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(InboxRow).where(InboxRow.status != "done")).scalar() == 0


@pytest.mark.parametrize("policy", ["interrupt"])
async def test_under_the_interrupt_policy_a_batch_is_admitted_message_by_message(
        db_url, tmp_path, fake_telegram, fake_openai, running, policy):
    fake_openai.reset()
    fake_openai.responder = _answer
    config = gateway_config(tmp_path, fake_openai, fake_telegram, database={"url": db_url},
                            telegram={"mode": "webhook"}, agent={"streaming": []}, bus={"busy_policy": policy})
    gateway = await start_gateway(config, running)
    url = f"http://127.0.0.1:{gateway.http_port}/telegram/webhook"
    first, a, b = _users(db_url, 3, 100)
    burst = [dm_update("w1 first", 9901, user_id=first), dm_update("w2 from a", 9902, user_id=a),
             dm_update("w3 from b", 9903, user_id=b)]
    assert await _post_held(fake_telegram, gateway.engine, url, burst) == [200] * 3
    assert gateway.inbound._admits.batches >= 1
    # one chat at a time, the chats in their session keys' order (each admit locks its lane: every
    # transaction takes lanes in one order, tests/test_lock_order.py); a chat's own messages in order
    assert sorted(_stored(gateway.engine)) == [(first, "w1 first"), (a, "w2 from a"), (b, "w3 from b")]
    for chat, word in ((first, "w1"), (a, "w2"), (b, "w3")):
        await fake_telegram.wait_for_call("sendMessage", lambda call, chat=chat: int(call.params["chat_id"]) == chat,
                                          timeout=15)
        assert [call.params["text"] for call in sends_to(fake_telegram, chat)] == [f"re {word}"]
