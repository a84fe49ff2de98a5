"""Limits on usage (``limits.*``), checked from the database before a turn's model call.

Several instances share the database, so every check reads it: a user's messages of the last 60
seconds from ``inbox`` (``ix_inbox_user_received``), and the day's or month's cost from ``usage``
(``ix_usage_user_day``, ``ix_usage_chat_day``). A turn over a limit makes no model call; its inbox
rows end ``limited``, and they do not count towards ``user_messages_per_minute`` (so the time told
is when the user may write again). The user is told once per ``period`` (``limit_notices``): for
the per-minute limit, until that reset time; for a cost limit, once and then at most once every
``NOTICE_EVERY_S`` while still over. The other messages of that stretch get no reply.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, Engine, and_, func, insert, select
from sqlalchemy.exc import IntegrityError

from gateway.core.config import LimitsConfig
from gateway.core.i18n import _
from gateway.ops.usage import Calendar, Totals, UsageLedger, spent
from gateway.ops.usage_texts import LIMIT_REPLIES
from gateway.store.db import read_tx, write_tx
from gateway.store.models import InboxRow, LimitNoticeRow, table

_inbox = table(InboxRow)
_notices = table(LimitNoticeRow)

LIMITED = "limited"
"""The inbox status of a message answered by a limit (no model call)."""

WINDOW_S = 60.0
"""The window of ``limits.user_messages_per_minute``."""

NOTICE_EVERY_S = 3600.0
"""A user (or chat) over a cost limit is told again at most this often while they keep writing."""


def usd(amount: float) -> str:
    """``$0.0165``: dollars as ``/status`` and ``/usage`` show them (4 decimals below $100)."""
    return f"${amount:.4f}" if amount < 100 else f"${amount:,.2f}"


@dataclass(frozen=True)
class Refusal:
    """A turn refused by a limit: ``text`` is the reply; ``subject`` and ``period`` key its notice."""

    limit: str
    text: str
    subject: str
    period: str


class UsageLimits:
    """The configured limits of one gateway.

    Args:
        engine: the shared database.
        config: ``limits.*``.
        clock: epoch seconds now.
    """

    def __init__(self, engine: Engine, config: LimitsConfig, clock: Any = time.time) -> None:
        self.engine = engine
        self.config = config
        self.clock = clock
        self.calendar = Calendar(config.timezone, clock)
        self.ledger = UsageLedger(engine, self.calendar)

    @property
    def any(self) -> bool:
        """Whether any limit is configured (no check runs otherwise)."""
        c = self.config
        return any(v is not None for v in (c.user_daily_usd, c.user_monthly_usd, c.chat_daily_usd,
                                           c.user_messages_per_minute))

    def check(self, *, inbox_id: int, user_id: str | None, chat_key: str) -> Refusal | None:
        """The first limit the turn answering inbox row ``inbox_id`` is over, or ``None``: the
        per-minute count, then the month, the day, the chat's day (the one resetting last is told
        first). A user's limits apply only to turns with a user (not scheduled reports)."""
        c = self.config
        if not self.any:
            return None
        today = self.calendar.day()
        first, last = self.calendar.month_days(today)
        with read_tx(self.engine) as conn:  # one transaction, a few indexed reads
            if user_id is not None and c.user_messages_per_minute is not None:
                refusal = self._per_minute(conn, inbox_id, user_id, c.user_messages_per_minute)
                if refusal is not None:
                    return refusal
            return self._cost_limits(conn, user_id, chat_key, today, first, last)

    def _cost_limits(self, conn: Connection, user_id: str | None, chat_key: str, today: str, first: str,
                     last: str) -> Refusal | None:
        """The first cost limit over: the user's month, the user's day, the chat's day."""
        c = self.config
        notice_period = f"{today}#{int(self.clock() // NOTICE_EVERY_S)}"
        calendar = self.calendar
        next_day, next_month = calendar.show(calendar.next_day()), calendar.show(calendar.next_month())
        # (limit name, limit, notice subject, what is summed, when it resets)
        checks: list[tuple[str, float, str, dict[str, str], str]] = []
        if user_id is not None and c.user_monthly_usd is not None:
            checks.append(("user_monthly_usd", c.user_monthly_usd, f"user:{user_id}",
                           {"user_id": user_id, "first_day": first, "last_day": last}, next_month))
        if user_id is not None and c.user_daily_usd is not None:
            checks.append(("user_daily_usd", c.user_daily_usd, f"user:{user_id}",
                           {"user_id": user_id, "first_day": today, "last_day": today}, next_day))
        if c.chat_daily_usd is not None:
            checks.append(("chat_daily_usd", c.chat_daily_usd, f"chat:{chat_key}",
                           {"chat_key": chat_key, "first_day": today, "last_day": today}, next_day))
        for name, limit, subject, scope, reset in checks:
            cost = spent(conn, **scope)
            if cost >= limit:
                text = _(LIMIT_REPLIES[name], spent=usd(cost), limit=usd(limit), reset=reset)
                return Refusal(name, text, subject, notice_period)
        return None

    def _per_minute(self, conn: Connection, inbox_id: int, user_id: str, limit: int) -> Refusal | None:
        """Over ``limit`` when, counting this message, more than ``limit`` of the user's messages
        received up to it in the last ``WINDOW_S`` were not refused."""
        received = conn.execute(select(_inbox.c.received_at).where(_inbox.c.id == inbox_id)).scalar()
        if received is None:
            return None
        count, oldest = conn.execute(
            select(func.count(), func.min(_inbox.c.received_at)).where(and_(
                _inbox.c.user_id == user_id, _inbox.c.received_at > received - WINDOW_S,
                _inbox.c.received_at <= received, _inbox.c.id < inbox_id, _inbox.c.status != LIMITED))).one()
        if count + 1 <= limit:
            return None
        reset = float(oldest) + WINDOW_S  # the oldest counted message leaves the window
        wait = max(1, int(reset - self.clock() + 0.999))
        text = _(LIMIT_REPLIES["user_messages_per_minute"],
                 limit=limit, reset=self.calendar.show(datetime.fromtimestamp(reset, UTC), seconds=True), wait=wait)
        return Refusal("user_messages_per_minute", text, f"user:{user_id}", f"until {reset:.3f}")

    def tell(self, refusal: Refusal, inbox_id: int) -> bool:
        """Whether the turn of ``inbox_id`` answers ``refusal`` with its text: the first turn of
        the refusal's period does (a rerun of that same turn too); later ones stay silent."""
        values = {"subject": refusal.subject, "limit_name": refusal.limit, "period": refusal.period}
        try:
            with write_tx(self.engine) as conn:
                conn.execute(insert(_notices).values(**values, inbox_id=inbox_id, created_at=self.clock()))
            return True
        except IntegrityError:
            with read_tx(self.engine) as conn:
                told = conn.execute(select(_notices.c.inbox_id).where(
                    *(getattr(_notices.c, k) == v for k, v in values.items()))).scalar()
            return told == inbox_id

    def report_totals(self, *, user_id: str | None = None, chat_key: str | None = None) -> tuple[Totals, Totals]:
        """``(today, this month)`` of a user or chat (everyone's with neither)."""
        today = self.calendar.day()
        first, last = self.calendar.month_days(today)
        return (self.ledger.totals(first_day=today, last_day=today, user_id=user_id, chat_key=chat_key),
                self.ledger.totals(first_day=first, last_day=last, user_id=user_id, chat_key=chat_key))
