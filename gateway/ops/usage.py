"""Usage: what model calls cost, per user, chat, provider and model, per day and month.

Every model call of a chat turn is one ``usage`` row, written with the call's transcript message
(``gateway.store.sql.UsageEntry``), so a step is counted exactly once even when a turn is rerun
after a crash; so is each transcription of a voice note or audio file, written with the user
message that carries its transcript (``TurnRunner.transcription_entry``; model = the transcription
model, cost per minute of audio). A call's ``day`` is its date in ``limits.timezone``; a month is the range of its
days (``day`` strings sort as dates). Cached prompt tokens are part of ``prompt_tokens`` (as the
OpenAI API reports them) and are never added again: ``cached_tokens`` says how many of them were
cached. Reads here are indexed sums (``ix_usage_user_day``, ``ix_usage_chat_day``, ``ix_usage_day``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from sqlalchemy import Connection, Engine, func, select

from gateway.store.db import read_tx
from gateway.store.models import IdentityRow, UsageRow, table

_usage = table(UsageRow)
_identities = table(IdentityRow)


@dataclass(frozen=True)
class Totals:
    """Summed usage: tokens as reported (``cached_tokens`` are among ``prompt_tokens``), USD, calls."""

    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    calls: int = 0


_SUMS = (func.coalesce(func.sum(_usage.c.prompt_tokens), 0), func.coalesce(func.sum(_usage.c.cached_tokens), 0),
         func.coalesce(func.sum(_usage.c.completion_tokens), 0), func.coalesce(func.sum(_usage.c.cost_usd), 0.0),
         func.count())


def _totals(row: Sequence[Any]) -> Totals:
    prompt, cached, completion, cost, calls = row
    return Totals(int(prompt), int(cached), int(completion), float(cost), int(calls))


class Calendar:
    """Days and months in one time zone (``limits.timezone``): what ``usage.day`` holds and when a
    daily or monthly limit resets.

    Args:
        zone: IANA time zone name.
        clock: epoch seconds now (``time.time``).
    """

    def __init__(self, zone: str = "UTC", clock: Callable[[], float] = time.time) -> None:
        self.zone_name = zone
        self.zone = ZoneInfo(zone)
        self.clock = clock

    def now(self) -> datetime:
        """The local time now."""
        return datetime.fromtimestamp(self.clock(), self.zone)

    def day(self, epoch: float | None = None) -> str:
        """``YYYY-MM-DD`` of ``epoch`` (now by default) in the zone."""
        moment = self.now() if epoch is None else datetime.fromtimestamp(epoch, self.zone)
        return moment.date().isoformat()

    def month_days(self, day: str) -> tuple[str, str]:
        """The first and last ``YYYY-MM-DD`` of ``day``'s month."""
        first = date.fromisoformat(day).replace(day=1)
        following = (first + timedelta(days=32)).replace(day=1)
        return first.isoformat(), (following - timedelta(days=1)).isoformat()

    def next_day(self) -> datetime:
        """The next local midnight (when a daily limit resets)."""
        today = self.now().date()
        return datetime.combine(today + timedelta(days=1), datetime.min.time(), self.zone)

    def next_month(self) -> datetime:
        """The first local midnight of next month (when a monthly limit resets)."""
        first = (self.now().date().replace(day=1) + timedelta(days=32)).replace(day=1)
        return datetime.combine(first, datetime.min.time(), self.zone)

    def show(self, moment: datetime, seconds: bool = False) -> str:
        """``2026-12-02 00:00 UTC``: a moment as users are told it (in the zone)."""
        local = moment.astimezone(self.zone)
        return f"{local:%Y-%m-%d %H:%M{':%S' if seconds else ''}} {self.zone_name}"


def spent(conn: Connection, *, first_day: str, last_day: str, user_id: str | None = None,
          chat_key: str | None = None) -> float:
    """USD of one user and/or chat from ``first_day`` to ``last_day``, read on ``conn`` (an indexed sum)."""
    query = select(func.coalesce(func.sum(_usage.c.cost_usd), 0.0)).where(_usage.c.day >= first_day,
                                                                          _usage.c.day <= last_day)
    if user_id is not None:
        query = query.where(_usage.c.user_id == user_id)
    if chat_key is not None:
        query = query.where(_usage.c.chat_key == chat_key)
    return float(conn.execute(query).scalar_one())


class UsageLedger:
    """Sums of the ``usage`` table.

    Args:
        engine: the gateway's database.
        calendar: what "today" and "this month" are.
    """

    def __init__(self, engine: Engine, calendar: Calendar) -> None:
        self.engine = engine
        self.calendar = calendar

    def totals(self, *, first_day: str, last_day: str, user_id: str | None = None,
               chat_key: str | None = None) -> Totals:
        """Usage from ``first_day`` to ``last_day`` (inclusive), of one user and/or chat, or of everyone."""
        query = select(*_SUMS).where(_usage.c.day >= first_day, _usage.c.day <= last_day)
        if user_id is not None:
            query = query.where(_usage.c.user_id == user_id)
        if chat_key is not None:
            query = query.where(_usage.c.chat_key == chat_key)
        with read_tx(self.engine) as conn:
            return _totals(conn.execute(query).one())

    def cost(self, *, first_day: str, last_day: str, user_id: str | None = None,
             chat_key: str | None = None) -> float:
        """USD spent from ``first_day`` to ``last_day`` (what a limit is checked against)."""
        with read_tx(self.engine) as conn:
            return spent(conn, first_day=first_day, last_day=last_day, user_id=user_id, chat_key=chat_key)

    def by_model(self, *, first_day: str, last_day: str,
                 user_id: str | None = None) -> list[tuple[str, str, Totals]]:
        """``(provider, model, totals)`` from ``first_day`` to ``last_day``, most expensive first."""
        query = (select(_usage.c.provider, _usage.c.model, *_SUMS)
                 .where(_usage.c.day >= first_day, _usage.c.day <= last_day)
                 .group_by(_usage.c.provider, _usage.c.model))
        if user_id is not None:
            query = query.where(_usage.c.user_id == user_id)
        with read_tx(self.engine) as conn:
            rows = [(row[0], row[1], _totals(row[2:])) for row in conn.execute(query)]
        return sorted(rows, key=lambda r: (-r[2].cost_usd, r[0], r[1]))

    def by_user(self, *, first_day: str, last_day: str, limit: int = 20) -> list[tuple[str, str, Totals]]:
        """``(user id, an identity of theirs as platform:id (display name), totals)`` of the users
        who spent most from ``first_day`` to ``last_day``; scheduled reports (no user) as ``-``."""
        query = (select(_usage.c.user_id, *_SUMS).where(_usage.c.day >= first_day, _usage.c.day <= last_day)
                 .group_by(_usage.c.user_id).order_by(func.sum(_usage.c.cost_usd).desc()).limit(limit))
        with read_tx(self.engine) as conn:
            rows = [(row[0], _totals(row[1:])) for row in conn.execute(query)]
            ids = [user for user, _ in rows if user is not None]
            names: dict[str, str] = {}
            for ident in conn.execute(select(_identities).where(_identities.c.user_id.in_(ids))
                                      .order_by(_identities.c.id)) if ids else []:
                label = f"{ident.platform}:{ident.platform_user_id}"
                names.setdefault(ident.user_id, f"{label} ({ident.display_name})" if ident.display_name else label)
        return [(user or "-", names.get(user or "", "scheduled reports" if user is None else user), totals)
                for user, totals in rows]

    def daily_cost(self, days: list[str]) -> dict[str, float]:
        """USD per day for ``days`` (consecutive ``YYYY-MM-DD``, oldest first); 0 for days without calls."""
        query = (select(_usage.c.day, func.sum(_usage.c.cost_usd))
                 .where(_usage.c.day >= days[0], _usage.c.day <= days[-1]).group_by(_usage.c.day))
        with read_tx(self.engine) as conn:
            found = {row[0]: float(row[1] or 0) for row in conn.execute(query)}
        return {day: found.get(day, 0.0) for day in days}

    def daily_turns(self, days: list[str]) -> dict[str, dict[str, int]]:
        """Turns that called the model, per platform, per day: ``{platform: {day: turns}}``."""
        query = (select(_usage.c.platform, _usage.c.day, func.count(func.distinct(_usage.c.turn_id)))
                 .where(_usage.c.day >= days[0], _usage.c.day <= days[-1])
                 .group_by(_usage.c.platform, _usage.c.day))
        result: dict[str, dict[str, int]] = {}
        with read_tx(self.engine) as conn:
            for platform, day, turns in conn.execute(query):
                result.setdefault(platform, dict.fromkeys(days, 0))[day] = int(turns)
        return dict(sorted(result.items()))

    def last_days(self, count: int) -> list[str]:
        """The ``count`` days up to today, oldest first."""
        today = date.fromisoformat(self.calendar.day())
        return [(today - timedelta(days=count - 1 - i)).isoformat() for i in range(count)]
