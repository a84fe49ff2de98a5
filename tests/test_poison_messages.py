"""A message nothing can process never blocks its conversation: characters the database or the
model request refuse are cleaned at receipt, and a turn that keeps failing for another reason is
answered with an apology after ``MAX_TURN_ATTEMPTS`` runs, so the messages behind it are answered.
End to end through python-telegram-bot and the openai client against the loopback fakes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine, select

from gateway.bus.turns import GAVE_UP_TEXT, MAX_TURN_ATTEMPTS
from gateway.store.models import InboxRow, MessageRow
from tests.conftest import TEST_TOKEN, gateway_config, start_gateway
from tests.fakes import openai as oa
from tests.fakes.telegram import FakeTelegram
from tests.helpers import wait_until
from tests.test_telegram_e2e import dm_update, sends_to


@pytest.fixture
def fake_telegram() -> Iterator[FakeTelegram]:
    """A fresh Bot API fake per test (each test runs on SQLite and PostgreSQL with the same chats)."""
    with FakeTelegram(token=TEST_TOKEN) as fake:
        yield fake


def texts(fake, chat_id: int) -> list[str]:
    return [c.params["text"] for c in sends_to(fake, chat_id)]


async def test_half_an_emoji_and_a_nul_are_cleaned_and_the_conversation_goes_on(
        tmp_path, db_url, fake_telegram, fake_openai, running):
    fake_openai.reset()
    fake_openai.responder = lambda req: oa.text("got: " + req["messages"][-1]["content"].splitlines()[-1])
    config = gateway_config(tmp_path, fake_openai, fake_telegram, database={"url": db_url})
    await start_gateway(config, running)
    chat = 5557001
    fake_telegram.inject(dm_update("half \ud83d emoji", 9101, user_id=chat))  # a lone surrogate
    fake_telegram.inject(dm_update("a\x00b", 9102, user_id=chat))  # PostgreSQL text refuses NUL
    fake_telegram.inject(dm_update("still there?", 9103, user_id=chat))
    await wait_until(lambda: len(sends_to(fake_telegram, chat)) == 3, what="three answers")
    assert texts(fake_telegram, chat) == ["got: half \ufffd emoji", "got: ab", "got: still there?"]
    engine = create_engine(db_url)
    try:
        with engine.connect() as conn:
            assert set(conn.execute(select(InboxRow.status)).scalars()) == {"done"}
            stored = list(conn.execute(select(MessageRow.content).where(MessageRow.role == "user")
                                       .order_by(MessageRow.id)).scalars())  # (no order without one)
    finally:
        engine.dispose()
    assert stored == ["half \ufffd emoji", "ab", "still there?"]


async def test_a_turn_that_keeps_failing_is_answered_with_an_apology_and_the_next_message_runs(
        tmp_path, fake_telegram, fake_openai, running):
    """A model client that breaks on one message (a bug, not an outage) fails that turn on every run."""
    from gateway.app.gateway import Gateway
    from gateway.app.wiring import build_adapters

    class BreaksOnPoison:
        model = "fake-model"

        def __init__(self) -> None:
            self.calls = 0

        def complete(self, messages, tools, on_text=None):
            self.calls += 1
            if "poison" in messages[-1]["content"]:
                raise RuntimeError("cannot handle this input")
            from agent.model import ModelReply, Usage
            return ModelReply(content="fine", tool_calls=[], finish_reason="stop", usage=Usage(1, 1))

    model = BreaksOnPoison()
    config = gateway_config(tmp_path, fake_openai, fake_telegram)
    gateway = Gateway(config, build_adapters(config), model=model)
    await gateway.start()
    running.append(gateway)
    chat = 5557002
    fake_telegram.inject(dm_update("poison", 9201, user_id=chat))
    fake_telegram.inject(dm_update("and now?", 9202, user_id=chat))
    await wait_until(lambda: len(sends_to(fake_telegram, chat)) == 2, timeout=20, what="both answered")
    assert texts(fake_telegram, chat) == [GAVE_UP_TEXT, "fine"]
    assert model.calls == MAX_TURN_ATTEMPTS + 1
    engine = create_engine(config.database.url)
    try:
        with engine.connect() as conn:
            statuses = dict(conn.execute(select(InboxRow.platform_message_id, InboxRow.status)).all())
    finally:
        engine.dispose()
    assert sorted(statuses.values()) == ["done", "failed"]
