"""Usage and limits against the database, on SQLite and PostgreSQL: a model call's usage row is
written with its message (once), months and days follow ``limits.timezone``, a limit's reply says
when it resets there, a user is told once per period (a rerun of the same turn again), and the
per-minute count leaves out the messages it refused."""

from __future__ import annotations

import dataclasses
from datetime import datetime
from zoneinfo import ZoneInfo

import pytest
from sqlalchemy import insert, select, update

from gateway.core.config import LimitsConfig
from gateway.core.types import ChatAddress, InboundMessage, OutboundMessage, Sender
from gateway.ops.usage_limits import LIMITED, UsageLimits
from gateway.store.db import create_db_engine
from gateway.store.models import InboxRow, UsageRow
from gateway.store.sql import NewMessage, Store, UsageEntry

CHAT = "telegram:1:5550001"
SHANGHAI = ZoneInfo("Asia/Shanghai")


@pytest.fixture
def engine(db_url):
    engine = create_db_engine(db_url)
    yield engine
    engine.dispose()


def at(text: str, zone: ZoneInfo = SHANGHAI) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=zone).timestamp()


def entry(day: str, cost: float, user: str | None = "u1", chat: str = CHAT) -> UsageEntry:
    return UsageEntry(user_id=user, chat_key=chat, session_key=f"{chat}", platform="telegram", provider="default",
                      model="gpt-4o-mini", day=day, prompt_tokens=1500, cached_tokens=1000, completion_tokens=20,
                      cost_usd=cost)


def spend(engine, *entries: UsageEntry) -> None:
    with engine.begin() as conn:
        for number, e in enumerate(entries):
            conn.execute(insert(UsageRow.__table__).values(call_key=f"test:{number}", turn_id=f"t{number}",
                                                           created_at=0.0, **dataclasses.asdict(e)))


def limits(engine, now: float, **config) -> UsageLimits:
    return UsageLimits(engine, LimitsConfig(**config), clock=lambda: now)


def test_usage_is_written_with_its_message_once_and_kept_with_the_turn(engine):
    store = Store(engine)
    session_id = store.new_session("telegram:1:5550001", "system", "u1")
    ids = store.append_messages(session_id, [
        NewMessage("in1", "assistant", None, {"tool_calls": [], "prompt_tokens": 1500, "completion_tokens": 20},
                   (entry("2026-03-15", 0.008),)),
        NewMessage("in1", "tool", "result", {"tool_call_id": "c1"})])
    with engine.connect() as conn:
        rows = conn.execute(select(UsageRow.call_key, UsageRow.turn_id, UsageRow.cached_tokens)).all()
    assert [tuple(r) for r in rows] == [(f"message:{ids[0]}", "in1", 1000)]


def test_a_transcription_is_written_with_the_user_message_that_carries_it(engine):
    """A voice note's transcription rides with its user message (the turn writes it before the model
    call, with its usage row): keyed by that message, beside the answer's own row."""
    store = Store(engine)
    session_id = store.new_session("telegram:1:5550001", "system", "u1")
    heard = dataclasses.replace(entry("2026-03-15", 0.009), model="whisper-1", prompt_tokens=0, cached_tokens=0,
                                completion_tokens=0)
    ids = store.append_messages(session_id, [
        NewMessage("in1", "user", "(voice)", {"meta": {"cost_usd": 0.009}}, (heard,)),
        NewMessage("in1", "assistant", "ok", {"prompt_tokens": 1500, "completion_tokens": 20},
                   (entry("2026-03-15", 0.008),))])
    with engine.connect() as conn:
        rows = conn.execute(select(UsageRow.call_key, UsageRow.model, UsageRow.cost_usd)).all()
    assert {r.call_key: (r.model, r.cost_usd) for r in rows} == {f"message:{ids[0]}": ("whisper-1", 0.009),
                                                                 f"message:{ids[1]}": ("gpt-4o-mini", 0.008)}
    now = at("2026-03-15T12:00:00")
    refusal = limits(engine, now, user_daily_usd=0.017, timezone="Asia/Shanghai").check(
        inbox_id=1, user_id="u1", chat_key=CHAT)
    assert refusal is not None and "($0.0170 of $0.0170)" in refusal.text  # both count towards the limit


def test_finish_turn_writes_the_final_calls_usage_in_its_transaction(engine):
    store = Store(engine)
    message = InboundMessage(ChatAddress("telegram", "1", "5550001"), "5550001:1", "dm", Sender("5550001"), "hi")
    assert store.insert_inbound(message, "telegram:1:5550001", user_id="u1")
    [pending] = store.next_pending("telegram:1:5550001")
    session_id = store.new_session("telegram:1:5550001", "system", "u1")
    reply = OutboundMessage(message.address, "answer", idempotency_key="in1-x:0")
    final = NewMessage("in1", "assistant", "answer", {"prompt_tokens": 1700, "completion_tokens": 50},
                       (entry("2026-03-15", 0.0085),))
    store.finish_turn([pending.inbox_id], "done", [reply], session_id=session_id, messages=[final])
    with engine.connect() as conn:
        costs = conn.execute(select(UsageRow.cost_usd)).scalars().all()
    assert costs == [0.0085]


def test_monthly_limit_counts_this_months_days_in_the_zone_and_resets_on_the_first(engine):
    spend(engine, entry("2026-02-28", 10.0), entry("2026-03-01", 1.5), entry("2026-03-16", 1.0),
          entry("2026-03-16", 5.0, user="u2"))
    # 23:30 UTC on 15 March is already 16 March in Shanghai.
    now = at("2026-03-15T23:30:00", ZoneInfo("UTC"))
    over = limits(engine, now, user_monthly_usd=2.5, timezone="Asia/Shanghai")
    refusal = over.check(inbox_id=1, user_id="u1", chat_key=CHAT)
    assert refusal is not None and refusal.limit == "user_monthly_usd"
    assert refusal.text == ("💸 You have used this month's budget ($2.5000 of $2.5000), so I did not answer. "
                            "It resets on 2026-04-01 00:00 Asia/Shanghai.")
    assert limits(engine, now, user_monthly_usd=2.6, timezone="Asia/Shanghai").check(
        inbox_id=1, user_id="u1", chat_key=CHAT) is None  # February's $10 and u2's $5 are not u1's March
    daily = limits(engine, now, user_daily_usd=1.0, timezone="Asia/Shanghai").check(
        inbox_id=1, user_id="u1", chat_key=CHAT)
    assert daily is not None and daily.text.endswith("It resets at 2026-03-17 00:00 Asia/Shanghai.")
    in_utc = limits(engine, now, user_daily_usd=1.0)  # in UTC it is still the 15th: nothing spent that day
    assert in_utc.check(inbox_id=1, user_id="u1", chat_key=CHAT) is None


def test_chat_limit_sums_every_user_of_the_chat(engine):
    group = "telegram:1:-400"
    spend(engine, entry("2026-03-16", 0.3, user="u1", chat=group), entry("2026-03-16", 0.3, user="u2", chat=group),
          entry("2026-03-16", 5.0, user="u2"))
    now = at("2026-03-16T12:00:00")
    check = limits(engine, now, chat_daily_usd=0.6, timezone="Asia/Shanghai").check
    refusal = check(inbox_id=1, user_id="u3", chat_key=group)
    assert refusal is not None and refusal.limit == "chat_daily_usd" and "($0.6000 of $0.6000)" in refusal.text
    assert check(inbox_id=1, user_id="u2", chat_key="telegram:1:5550002") is None  # another chat: its own sum


def test_a_user_is_told_once_per_period_and_a_rerun_of_that_turn_again(engine):
    now = [at("2026-03-16T12:00:00")]
    spend(engine, entry("2026-03-16", 2.0))
    usage = UsageLimits(engine, LimitsConfig(user_daily_usd=1.0, timezone="Asia/Shanghai"), clock=lambda: now[0])
    first = usage.check(inbox_id=7, user_id="u1", chat_key=CHAT)
    assert first is not None
    assert usage.tell(first, 7) is True
    assert usage.tell(usage.check(inbox_id=8, user_id="u1", chat_key=CHAT), 8) is False  # the next message: silent
    assert usage.tell(first, 7) is True  # the same turn rerun after a crash answers again (the outbox dedupes)
    now[0] += 3600  # an hour on, still over: told again, once
    later = usage.check(inbox_id=9, user_id="u1", chat_key=CHAT)
    assert usage.tell(later, 9) is True and usage.tell(later, 10) is False


def test_per_minute_counts_the_users_answered_messages_and_says_when_one_leaves(engine):
    store = Store(engine)
    start = at("2026-03-16T12:00:00", ZoneInfo("UTC"))
    for number, offset in enumerate([0, 10, 20, 25, 70]):
        message = InboundMessage(ChatAddress("telegram", "1", "5550001"), f"5550001:{number}", "dm",
                                 Sender("5550001"), f"m{number}", received_at=start + offset)
        assert store.insert_inbound(message, "telegram:1:5550001", user_id="u1")
    with engine.connect() as conn:
        ids = conn.execute(select(InboxRow.id).order_by(InboxRow.id)).scalars().all()
    check = limits(engine, start + 20, user_messages_per_minute=2).check
    assert check(inbox_id=ids[0], user_id="u1", chat_key=CHAT) is None
    assert check(inbox_id=ids[1], user_id="u1", chat_key=CHAT) is None
    third = check(inbox_id=ids[2], user_id="u1", chat_key=CHAT)
    assert third is not None and third.limit == "user_messages_per_minute"
    assert "You can write again from 2026-03-16 12:01:00 UTC (in 40 s)." in third.text, third.text
    with engine.begin() as conn:  # the third was refused: it does not count
        conn.execute(update(InboxRow.__table__).where(InboxRow.id == ids[2]).values(status=LIMITED))
    fourth = limits(engine, start + 25, user_messages_per_minute=2).check(inbox_id=ids[3], user_id="u1",
                                                                          chat_key=CHAT)
    assert fourth is not None and fourth.period == third.period  # the same stretch: one notice for both
    # At +70 s the window holds +10 (answered), +20 (refused) and +25 (refused): one counted, room for this one.
    assert limits(engine, start + 70, user_messages_per_minute=2).check(inbox_id=ids[4], user_id="u1",
                                                                        chat_key=CHAT) is None
    assert limits(engine, start + 20, user_messages_per_minute=5, user_daily_usd=None).check(
        inbox_id=ids[2], user_id="u2", chat_key=CHAT) is None  # another user's count
