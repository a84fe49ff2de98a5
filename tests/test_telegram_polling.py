"""``TelegramAdapter`` receiving through long polling against the wire-level fake: what it asks
``getUpdates`` for, when it confirms an offset (only after the sink stored the update), what it
does with an update it cannot read, and how it rides out errors (Bot API ``getUpdates``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest

from adapters.telegram.adapter import ALLOWED_UPDATES, TelegramAdapter
from gateway.core.types import InboundMessage
from tests.conftest import fixture
from tests.fakes.telegram import FakeTelegram
from tests.helpers import wait_until


def dm(update_id: int, text: str, message_id: int) -> dict[str, Any]:
    update = fixture("telegram", "dm_text.json")
    update.update(update_id=update_id)
    update["message"].update(message_id=message_id, text=text)
    return update


class Inbox:
    """The adapter's sink: stores what it is given, or fails the next ``failures`` writes."""

    def __init__(self, fake: FakeTelegram) -> None:
        self.fake = fake
        self.stored: list[InboundMessage] = []
        self.offsets_when_stored: list[int] = []
        self.failures = 0

    async def __call__(self, message: InboundMessage) -> None:
        if self.failures:
            self.failures -= 1
            raise RuntimeError("inbox write failed")
        self.stored.append(message)
        self.offsets_when_stored.append(self.fake.confirmed_offset)


@contextlib.asynccontextmanager
async def polling(fake: FakeTelegram, poll_timeout_s: int = 1) -> AsyncIterator[tuple[TelegramAdapter, Inbox]]:
    adapter = TelegramAdapter(token=fake.token, base_url=fake.url, poll_timeout_s=poll_timeout_s)
    inbox = Inbox(fake)
    await adapter.start(inbox)
    await adapter.start_receiving()
    try:
        yield adapter, inbox
    finally:
        await adapter.stop()


@pytest.fixture
def fake() -> Any:
    with FakeTelegram() as server:
        yield server


async def test_each_update_is_confirmed_after_it_is_stored_and_an_unreadable_one_is_dropped_once(fake, caplog):
    caplog.set_level(logging.WARNING, "adapters.telegram")
    fake.inject(dm(501, "first", 11))
    malformed = dm(502, "UNREADABLE", 12)
    malformed["message"]["sticker"] = {"file_id": "CAAD", "file_unique_id": "u"}  # no size, no kind
    fake.inject(malformed)
    press = fixture("telegram", "callback_query.json")
    press.update(update_id=503)
    press["callback_query"]["data"] = "/stop"
    fake.inject(press)
    fake.inject(dm(504, "last", 13))
    async with polling(fake) as (_, inbox):
        await wait_until(lambda: len(inbox.stored) == 3 and fake.confirmed_offset == 505, timeout=10,
                         what="three updates stored and every offset confirmed")
    assert [(m.event_id, m.command, m.text) for m in inbox.stored] == [
        ("501", None, "first"), ("503", "stop", ""), ("504", None, "last")]
    # no update was confirmed (offset = update_id + 1) before it was stored
    assert all(offset <= int(m.event_id) for offset, m in zip(inbox.offsets_when_stored, inbox.stored, strict=True))
    polls = fake.calls("getUpdates")
    assert (polls[0].params["timeout"], polls[0].params["allowed_updates"]) == (1, ALLOWED_UPDATES)
    assert "offset" not in polls[0].params  # nothing confirmed at start: the pending updates are kept
    assert polls[-1].params["offset"] == 505
    answered = fake.calls("answerCallbackQuery")
    assert [c.params["callback_query_id"] for c in answered] == ["4382000000000000001"]
    dropped = [r.getMessage() for r in caplog.records if "502" in r.getMessage()]
    assert dropped == ["telegram update 502 unreadable (message.sticker.width: Field required (+3 more)); "
                       "acknowledged and dropped"]


async def test_an_update_that_could_not_be_stored_is_asked_for_again(fake, caplog):
    fake.inject(dm(601, "keep me", 21))
    fake.inject(dm(602, "and me", 22))
    async with polling(fake) as (_, inbox):
        inbox.failures = 1
        await wait_until(lambda: len(inbox.stored) == 2 and fake.confirmed_offset == 603, timeout=10,
                         what="both updates stored after a failed write")
    assert [m.text for m in inbox.stored] == ["keep me", "and me"]
    assert inbox.offsets_when_stored[0] <= 601  # 601 was not confirmed before it was stored
    assert any("could not store telegram update 601; will retry" in r.getMessage() for r in caplog.records)


async def test_polling_backs_off_after_a_conflict_or_a_bad_gateway_and_stops_when_the_token_is_revoked(fake, caplog):
    caplog.set_level(logging.WARNING, "adapters.telegram")
    fake.fail_next("getUpdates", 409)  # another poller took over (Bot API: 409 Conflict)
    fake.fail_next("getUpdates", 502)
    fake.inject(dm(701, "after the errors", 31))
    async with polling(fake) as (adapter, inbox):
        await wait_until(lambda: len(inbox.stored) == 1, timeout=15, what="the update after two failed polls")
        failed = [r.getMessage() for r in caplog.records if "getUpdates failed" in r.getMessage()]
        assert len(failed) == 2 and "terminated by other getUpdates request" in failed[0], failed
        assert "Bad Gateway" in failed[1]

        fake.token = "7000000001:AAAnotherTokenIssuedByBotFather000"  # @BotFather /revoke
        await wait_until(lambda: any("polling stopped" in r.getMessage() for r in caplog.records), timeout=10,
                         what="polling stopped on 401 Unauthorized")
        stopped = [r for r in caplog.records if "polling stopped" in r.getMessage()]
        assert [(r.levelno, r.getMessage()) for r in stopped] == [
            (logging.ERROR, "telegram rejected the bot token; polling stopped")]
        assert not [r for r in caplog.records if "getUpdates failed" in r.getMessage()][2:]  # no retry after it
        assert adapter.bot.token not in caplog.text


async def test_a_long_poll_waits_its_whole_timeout_without_timing_out(fake, caplog):
    """Bot.get_updates' rule: the answer may take the request's read timeout (5 s) plus the long
    poll's ``timeout``; a 6-second poll with only the 5 s would fail every time."""
    caplog.set_level(logging.WARNING, "adapters.telegram")
    async with polling(fake, poll_timeout_s=6):
        await wait_until(lambda: len(fake.calls("getUpdates")) >= 2, timeout=15, what="a second long poll")
        await asyncio.sleep(0)
    assert not [r.getMessage() for r in caplog.records if "getUpdates failed" in r.getMessage()]
