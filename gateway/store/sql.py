"""``Store``: every read and write the gateway makes, each a short transaction.

Calls block (SQLAlchemy sync engine): call them from worker threads or via ``asyncio.to_thread``,
never directly on the main loop (DESIGN §2).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, and_, delete, func, insert, or_, select, update
from sqlalchemy.exc import IntegrityError

from gateway.store.db import read_tx, write_tx
from gateway.store.models import InboxRow, LaneRow, MessageRow, OutboxRow, SessionRow
from gateway.types import ChatAddress, InboundMessage, OutboundMessage

_inbox = InboxRow.__table__
_lanes = LaneRow.__table__
_messages = MessageRow.__table__
_outbox = OutboxRow.__table__
_sessions = SessionRow.__table__


@dataclass(frozen=True, slots=True)
class PendingInbound:
    """An inbox row waiting for its turn."""

    inbox_id: int
    session_key: str
    message: InboundMessage


@dataclass(frozen=True, slots=True)
class StoredMessage:
    """A transcript row as the agent context needs it (a projection of ``messages``)."""

    id: int
    turn_id: str | None
    role: str
    content: str | None
    tool_calls: list[dict[str, Any]] | None
    tool_call_id: str | None
    name: str | None
    meta: dict[str, Any] | None


@dataclass(frozen=True, slots=True)
class OutboxItem:
    """A claimed outbox row ready to send."""

    id: int
    attempts: int
    message: OutboundMessage
    sent_ids: tuple[str, ...] = ()
    """Platform message ids of parts delivered by earlier attempts."""


class Store:
    """Durable state on one SQLAlchemy engine (SQLite or PostgreSQL)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    # -- inbox -------------------------------------------------------------------------------
    def insert_inbound(self, message: InboundMessage, session_key: str) -> bool:
        """Writes ``message`` to the inbox once. Returns ``False`` for a duplicate (same platform,
        tenant and message id), which the caller acknowledges and drops."""
        try:
            with write_tx(self.engine) as conn:
                conn.execute(
                    insert(_inbox).values(
                        platform=message.platform,
                        tenant=message.address.tenant,
                        platform_message_id=message.message_id,
                        session_key=session_key,
                        payload=message.to_dict(),
                        status="pending",
                        received_at=message.received_at,
                    )
                )
        except IntegrityError:
            return False
        return True

    def next_pending(self, session_key: str) -> PendingInbound | None:
        """Oldest pending inbox row for ``session_key`` (arrival order), or ``None``."""
        with read_tx(self.engine) as conn:
            row = conn.execute(
                select(_inbox.c.id, _inbox.c.payload)
                .where(_inbox.c.session_key == session_key, _inbox.c.status == "pending")
                .order_by(_inbox.c.id)
                .limit(1)
            ).first()
        if row is None:
            return None
        return PendingInbound(row.id, session_key, InboundMessage.from_dict(row.payload))

    def keys_waiting(self, now: float, limit: int = 100) -> list[str]:
        """Session keys with pending inbox rows whose lane is not leased (or the lease expired)."""
        with read_tx(self.engine) as conn:
            rows = conn.execute(
                select(_inbox.c.session_key)
                .select_from(_inbox.outerjoin(_lanes, _lanes.c.key == _inbox.c.session_key))
                .where(
                    _inbox.c.status == "pending",
                    or_(_lanes.c.key.is_(None), _lanes.c.lease_owner.is_(None), _lanes.c.lease_until < now),
                )
                .group_by(_inbox.c.session_key)
                .order_by(func.min(_inbox.c.id))
                .limit(limit)
            ).all()
        return [r.session_key for r in rows]

    def count_inbox(self, status: str) -> int:
        with read_tx(self.engine) as conn:
            return conn.execute(select(func.count()).select_from(_inbox).where(_inbox.c.status == status)).scalar_one()

    # -- lanes (one turn per session key at a time) ------------------------------------------
    def claim_lane(self, key: str, owner: str, lease_s: float) -> bool:
        """Takes the lease on ``key`` if it is free, expired or already ours. Atomic on both
        backends: one conditional UPDATE (the row is created on first use)."""
        now = time.time()
        for _ in range(2):
            with write_tx(self.engine) as conn:
                result = conn.execute(
                    update(_lanes)
                    .where(
                        _lanes.c.key == key,
                        or_(_lanes.c.lease_owner.is_(None), _lanes.c.lease_owner == owner, _lanes.c.lease_until < now),
                    )
                    .values(lease_owner=owner, lease_until=now + lease_s)
                )
                if result.rowcount == 1:
                    return True
                exists = conn.execute(select(_lanes.c.key).where(_lanes.c.key == key)).first()
                if exists is not None:
                    return False
            try:
                with write_tx(self.engine) as conn:
                    conn.execute(insert(_lanes).values(key=key, lease_owner=owner, lease_until=now + lease_s))
                return True
            except IntegrityError:
                continue  # another instance created it first: try the conditional update again
        return False

    def renew_lanes(self, keys: Sequence[str], owner: str, lease_s: float) -> None:
        """Extends the leases ``owner`` holds on ``keys``."""
        if not keys:
            return
        with write_tx(self.engine) as conn:
            conn.execute(
                update(_lanes)
                .where(_lanes.c.key.in_(list(keys)), _lanes.c.lease_owner == owner)
                .values(lease_until=time.time() + lease_s)
            )

    def release_lane(self, key: str, owner: str) -> None:
        with write_tx(self.engine) as conn:
            conn.execute(
                update(_lanes)
                .where(_lanes.c.key == key, _lanes.c.lease_owner == owner)
                .values(lease_owner=None, lease_until=0.0)
            )

    def lane_exists(self, key: str) -> bool:
        """Whether the session key has been used before (the bot is part of that conversation)."""
        with read_tx(self.engine) as conn:
            return conn.execute(select(_lanes.c.key).where(_lanes.c.key == key)).first() is not None

    # -- sessions and transcript -------------------------------------------------------------
    def current_session(self, key: str, build_system_prompt: Callable[[], str]) -> tuple[str, str]:
        """Returns ``(session_id, system_prompt)`` of the key's current session, creating the
        session (and storing its system prompt, built once) on first use."""
        with read_tx(self.engine) as conn:
            row = conn.execute(
                select(_sessions.c.id, _sessions.c.system_prompt)
                .select_from(_lanes.join(_sessions, _sessions.c.id == _lanes.c.session_id))
                .where(_lanes.c.key == key)
            ).first()
        if row is not None:
            return row.id, row.system_prompt
        session_id = uuid.uuid4().hex
        prompt = build_system_prompt()
        now = time.time()
        with write_tx(self.engine) as conn:
            conn.execute(
                insert(_sessions).values(id=session_id, key=key, system_prompt=prompt, created_at=now, updated_at=now)
            )
            conn.execute(update(_lanes).where(_lanes.c.key == key).values(session_id=session_id))
        return session_id, prompt

    def append_message(
        self,
        session_id: str,
        turn_id: str | None,
        role: str,
        content: str | None,
        *,
        tool_calls: list[dict[str, Any]] | None = None,
        tool_call_id: str | None = None,
        name: str | None = None,
        meta: dict[str, Any] | None = None,
        platform_message_id: str | None = None,
        prompt_tokens: int | None = None,
        completion_tokens: int | None = None,
    ) -> int:
        """Appends one transcript message; returns its id."""
        with write_tx(self.engine) as conn:
            result = conn.execute(
                insert(_messages).values(
                    session_id=session_id,
                    turn_id=turn_id,
                    role=role,
                    content=content,
                    tool_calls=tool_calls,
                    tool_call_id=tool_call_id,
                    name=name,
                    meta=meta,
                    platform_message_id=platform_message_id,
                    prompt_tokens=prompt_tokens,
                    completion_tokens=completion_tokens,
                    created_at=time.time(),
                )
            )
            return int(result.inserted_primary_key[0])

    def load_window(self, session_id: str, limit: int) -> list[StoredMessage]:
        """The newest ``limit`` transcript messages, oldest first: O(window), not O(history)."""
        cols = (
            _messages.c.id,
            _messages.c.turn_id,
            _messages.c.role,
            _messages.c.content,
            _messages.c.tool_calls,
            _messages.c.tool_call_id,
            _messages.c.name,
            _messages.c.meta,
        )
        with read_tx(self.engine) as conn:
            rows = conn.execute(
                select(*cols).where(_messages.c.session_id == session_id).order_by(_messages.c.id.desc()).limit(limit)
            ).all()
        return [StoredMessage(*row) for row in reversed(rows)]

    def transcript(self, session_id: str) -> list[StoredMessage]:
        """The whole transcript, oldest first (for tests and admin views, not the hot path)."""
        return self.load_window(session_id, 1_000_000)

    # -- turn completion and outbox ----------------------------------------------------------
    def finish_turn(self, inbox_id: int, status: str, replies: Sequence[OutboundMessage],
                    session_id: str | None) -> None:
        """Marks the inbox row done (or failed) and queues ``replies`` in one transaction.

        A reply whose idempotency key is already queued (a resumed turn) is not queued again.
        """
        now = time.time()
        with write_tx(self.engine) as conn:
            for reply in replies:
                exists = conn.execute(
                    select(_outbox.c.id).where(_outbox.c.idempotency_key == reply.idempotency_key)
                ).first()
                if exists is None:
                    conn.execute(
                        insert(_outbox).values(
                            idempotency_key=reply.idempotency_key,
                            session_id=session_id,
                            address=reply.address.to_dict(),
                            text=reply.text,
                            reply_to_id=reply.reply_to_id,
                            status="pending",
                            attempts=0,
                            next_attempt_at=now,
                            claim_until=0.0,
                            created_at=now,
                        )
                    )
            conn.execute(update(_inbox).where(_inbox.c.id == inbox_id).values(status=status, finished_at=now))

    def claim_outbox(self, owner: str, limit: int, claim_s: float) -> list[OutboxItem]:
        """Claims due outbox rows (pending and due, or ``sending`` with an expired claim), oldest
        first. Claimed rows are ``sending`` until ``mark_sent``/``mark_retry``/``mark_failed``."""
        now = time.time()
        due = or_(
            and_(_outbox.c.status == "pending", _outbox.c.next_attempt_at <= now),
            and_(_outbox.c.status == "sending", _outbox.c.claim_until < now),
        )
        items: list[OutboxItem] = []
        with write_tx(self.engine) as conn:
            rows = conn.execute(
                select(_outbox.c.id, _outbox.c.attempts, _outbox.c.idempotency_key, _outbox.c.address,
                       _outbox.c.text, _outbox.c.reply_to_id, _outbox.c.platform_message_ids)
                .where(due)
                .order_by(_outbox.c.id)
                .limit(limit)
            ).all()
            for row in rows:
                claimed = conn.execute(
                    update(_outbox)
                    .where(_outbox.c.id == row.id, due)
                    .values(status="sending", claimed_by=owner, claim_until=now + claim_s, attempts=row.attempts + 1)
                ).rowcount
                if claimed:
                    sent_ids = tuple(row.platform_message_ids or ())
                    items.append(
                        OutboxItem(
                            row.id,
                            row.attempts + 1,
                            OutboundMessage(
                                address=ChatAddress.from_dict(row.address),
                                text=row.text,
                                idempotency_key=row.idempotency_key,
                                reply_to_id=row.reply_to_id,
                                resume_from=len(sent_ids),
                            ),
                            sent_ids,
                        )
                    )
        return items

    def mark_sent(self, outbox_id: int, platform_message_ids: Sequence[str]) -> None:
        with write_tx(self.engine) as conn:
            conn.execute(
                update(_outbox)
                .where(_outbox.c.id == outbox_id)
                .values(status="sent", platform_message_ids=list(platform_message_ids), sent_at=time.time(), error=None)
            )

    def mark_retry(self, outbox_id: int, next_attempt_at: float, error: str, sent_ids: Sequence[str]) -> None:
        """Schedules another attempt, keeping the ids of parts already delivered."""
        with write_tx(self.engine) as conn:
            conn.execute(
                update(_outbox)
                .where(_outbox.c.id == outbox_id)
                .values(status="pending", next_attempt_at=next_attempt_at, error=error, claimed_by=None,
                        platform_message_ids=list(sent_ids))
            )

    def mark_failed(self, outbox_id: int, error: str, sent_ids: Sequence[str]) -> None:
        with write_tx(self.engine) as conn:
            conn.execute(
                update(_outbox)
                .where(_outbox.c.id == outbox_id)
                .values(status="failed", error=error, platform_message_ids=list(sent_ids))
            )

    def next_outbox_due(self) -> float | None:
        """Earliest ``next_attempt_at`` of pending rows (for the delivery timer), or ``None``."""
        with read_tx(self.engine) as conn:
            return conn.execute(
                select(func.min(_outbox.c.next_attempt_at)).where(_outbox.c.status == "pending")
            ).scalar_one_or_none()

    def outbox_rows(self) -> list[dict[str, Any]]:
        """All outbox rows as dicts (tests and admin)."""
        with read_tx(self.engine) as conn:
            return [dict(r._mapping) for r in conn.execute(select(_outbox).order_by(_outbox.c.id)).all()]

    def purge_all(self) -> None:
        """Deletes every row (tests only)."""
        with write_tx(self.engine) as conn:
            for table in (_outbox, _inbox, _messages, _lanes, _sessions):
                conn.execute(delete(table))
