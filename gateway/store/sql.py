"""``Store``: every read and write the gateway makes, each a short transaction (the outbox's part,
replies queued, streamed previews, delivery's claims and marks, in ``gateway.store.outbox``).

Calls block (SQLAlchemy sync engine): call them from worker threads or via ``asyncio.to_thread``,
never directly on the main loop (DESIGN §2).
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine, delete, func, insert, or_, select, update
from sqlalchemy.exc import IntegrityError

from gateway.core.types import InboundMessage, OutboundMessage
from gateway.store import prepared as q
from gateway.store.db import read_one, read_tx, write_tx
from gateway.store.fast import execute as run
from gateway.store.fast import execute_many
from gateway.store.models import (
    Base,
    InboxRow,
    LaneRow,
    MessageRow,
    OutboxRow,
    SessionRow,
    SummaryRow,
    UsageRow,
    table,
)
from gateway.store.outbox import OutboxItem, OutboxStore
from gateway.store.retries import retry_locked
from gateway.store.text import storable, storable_text

_inbox = table(InboxRow)
_lanes = table(LaneRow)
_messages = table(MessageRow)
_outbox = table(OutboxRow)
_sessions = table(SessionRow)
_summaries = table(SummaryRow)
_usage = table(UsageRow)
_MESSAGE_KEYS = frozenset(q.MESSAGE_COLUMNS)


@dataclass(frozen=True, slots=True)
class PendingInbound:
    """An inbox row waiting for its turn."""

    inbox_id: int
    session_key: str
    message: InboundMessage
    user_id: str | None = None
    """The sender's user (identities resolved at receipt)."""
    crashes: int = 0
    """How often a process died while this row's turn ran (``InboxRow.crashes``)."""


class Prefetch:
    """Reads for the turn about to run, made in the transaction that hands its lane the rows
    (``Store.claim_next``, ``claim_free_lane_in``, or the previous turn's ``finish_turn`` with
    ``LaneNext``) instead of transactions of their own: ``fn(conn, batch, fresh)`` runs there (again
    if the transaction is retried), and ``value`` is its result once that transaction committed
    (``None`` until then). ``fresh``: the lane was created in that transaction, so it has no
    session yet (``Store.open_session_in`` need not look for one); a ``NewSessions`` there
    collects the new session, written with the batch's others before the commit. ``fn`` must raise
    only what should fail that transaction (a database error) and, given a ``NewSessions``, must not
    read the lane's session."""

    __slots__ = ("_pending", "fn", "value")

    def __init__(self, fn: Callable[[Connection, list[PendingInbound], bool | NewSessions], Any]) -> None:
        self.fn = fn
        self.value: Any = None
        self._pending: Any = None

    def run(self, conn: Connection, batch: list[PendingInbound], fresh: bool | NewSessions = False) -> None:
        self._pending = self.fn(conn, batch, fresh)

    def commit(self) -> None:
        self.value, self._pending = self._pending, None


class NewSessions:
    """The sessions of lanes created in one transaction (a batch's admit: ``Store.claim_free_lanes_in``),
    written together before it commits: on PostgreSQL two statements for a batch of new chats
    (one multi-row ``INSERT_SESSION``, ``SET_LANES_SESSIONS``) instead of one each
    (``CREATE_SESSION_SET_LANE``). Truthy: it is passed where ``fresh`` is (``Prefetch``), as the
    lanes it serves were created in that transaction."""

    __slots__ = ("rows",)

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def __bool__(self) -> bool:
        return True

    def add(self, key: str, system_prompt: str, owner_user_id: str | None, settings: dict[str, Any] | None) -> str:
        """Queues lane ``key``'s new session (owned by ``owner_user_id`` for a DM); returns its id."""
        now = time.time()
        session_id = uuid.uuid4().hex
        self.rows.append({"id": session_id, "key": key, "system_prompt": system_prompt, "created_at": now,
                          "updated_at": now, "owner_user_id": owner_user_id, "settings": settings})
        return session_id

    def write(self, conn: Any) -> None:
        """Inserts the queued sessions and points their lanes (created in ``conn``'s transaction) at
        them; raises the database's errors (the transaction is then rolled back)."""
        if not self.rows:
            return
        execute_many(conn, q.INSERT_SESSION, self.rows)
        run(conn, q.SET_LANES_SESSIONS, {"b_keys": [row["key"] for row in self.rows],
                                         "b_sessions": [row["id"] for row in self.rows]})
        self.rows = []


@dataclass(slots=True)
class LaneNext:
    """What follows a turn in its lane, read in the turn's last transaction (``Store.finish_turn``'s
    ``then``) instead of a transaction of its own (``Store.next_or_release``): the lane's next
    pending rows (at most ``limit``) under the lease ``owner`` holds on ``key``, or, when none wait,
    the lease given up. Filled in only once that transaction committed (``done``); ``batch``,
    ``generation`` and ``waiting`` are then what ``next_or_release`` returns."""

    key: str
    owner: str
    limit: int = 1
    prefetch: Prefetch | None = None
    """Run on the next rows in the same transaction (``Prefetch``)."""
    done: bool = False
    batch: list[PendingInbound] = dataclasses.field(default_factory=list)
    generation: int = 0
    waiting: bool = False

    @property
    def released(self) -> bool:
        """The lease was given up (nothing waited when the turn finished)."""
        return self.done and not self.batch


def _inbox_row(message: InboundMessage, session_key: str, user_id: str | None, done: bool,
               now: float) -> dict[str, Any]:
    """The inbox columns of ``message`` (``done``: handled at once, a control command's row)."""
    return {"platform": message.platform, "tenant": message.address.tenant,
            "platform_message_id": storable_text(message.message_id), "session_key": session_key,
            "user_id": user_id, "payload": storable(message.to_dict()), "status": "done" if done else "pending",
            "received_at": message.received_at, "finished_at": now if done else None}


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
    platform_message_id: str | None = None
    """The platform's id of a user message (as ``InboundMessage.message_id``), else ``None``."""


@dataclass(frozen=True, slots=True)
class Summary:
    """The newest stored summary of a session: ``text`` condenses every message with
    ``id <= covers_to_id``."""

    covers_to_id: int
    text: str


@dataclass(frozen=True, slots=True)
class OpenSession:
    """What a turn loads: the session, its stored system prompt, the newest messages after the
    latest summary's cut (at most ``window`` of them), that summary (``None``: none yet) and when
    the session was last used (``None`` for a session just created)."""

    session_id: str
    system_prompt: str
    window: list[StoredMessage]
    last_used_at: float | None
    summary: Summary | None = None
    settings: dict[str, Any] | None = None
    """What the session was created with (``sessions.settings``; ``None``: the defaults)."""


@dataclass(frozen=True, slots=True)
class UsageEntry:
    """One model call's usage, stored with its assistant message (a ``usage`` row keyed by the
    message's id), or one transcription's, stored with the user message carrying the transcript.
    Tokens as the API reported them (``cached_tokens`` are part of ``prompt_tokens``); ``cost_usd``
    at the configured price (per 1M tokens, or per minute of audio); ``day`` is ``YYYY-MM-DD`` in
    ``limits.timezone``; ``chat_key`` is ``platform:tenant:chat_id``."""

    user_id: str | None
    chat_key: str
    session_key: str | None
    platform: str
    provider: str
    model: str
    day: str
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    cost_usd: float

    def columns(self) -> dict[str, Any]:
        """The ``usage`` row's columns for this entry (what ``dataclasses.asdict`` gives, without its
        deep copy of each value: the fields are plain)."""
        return {"user_id": self.user_id, "chat_key": self.chat_key, "session_key": self.session_key,
                "platform": self.platform, "provider": self.provider, "model": self.model, "day": self.day,
                "prompt_tokens": self.prompt_tokens, "cached_tokens": self.cached_tokens,
                "completion_tokens": self.completion_tokens, "cost_usd": self.cost_usd}


@dataclass(frozen=True, slots=True)
class NewMessage:
    """A transcript message to append: ``fields`` holds the optional columns (``tool_calls``,
    ``tool_call_id``, ``meta``, ``platform_message_id``, token counts); ``usage``: the ``usage`` rows
    written in the same transaction, keyed by the message (an assistant message's own model call,
    and the sub-agent calls made before it was stored; a user message's transcriptions)."""

    turn_id: str | None
    role: str
    content: str | None
    fields: dict[str, Any]
    usage: Sequence[UsageEntry] = ()


class Store(OutboxStore):
    """Durable state on one SQLAlchemy engine (SQLite or PostgreSQL)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    # -- inbox -------------------------------------------------------------------------------
    @retry_locked
    def insert_inbound(self, message: InboundMessage, session_key: str, *, cancel: str | None = None,
                       control_reply: OutboundMessage | None = None, user_id: str | None = None) -> bool:
        """Writes ``message`` to the inbox once. Returns ``False`` for a duplicate (same platform,
        tenant and message id), which the caller acknowledges and drops.

        In the same transaction (so a turn that sees this row also sees the cancellation):
        ``cancel="if_busy"`` bumps the lane generation when a turn is running (busy policy
        ``interrupt``); ``cancel="always"`` bumps it unconditionally (``/stop``). A message with a
        ``control_reply`` is handled outside the lane: its row is stored ``done`` and the reply
        queued under the new generation.
        """
        try:
            with write_tx(self.engine) as conn:
                self.insert_inbound_in(conn, message, session_key, cancel=cancel, control_reply=control_reply,
                                       user_id=user_id)
        except IntegrityError:
            return False
        return True

    def received(self, message: InboundMessage) -> bool:
        """Whether ``message`` (platform, tenant, message id) is in the inbox already: a platform's
        redelivery, for commands whose effect comes before their row (``/language``)."""
        with read_tx(self.engine) as conn:
            return conn.execute(select(_inbox.c.id).where(
                _inbox.c.platform == message.platform, _inbox.c.tenant == message.address.tenant,
                _inbox.c.platform_message_id == storable_text(message.message_id))).first() is not None

    def insert_inbound_in(self, conn: Connection, message: InboundMessage, session_key: str, *,
                          cancel: str | None = None, control_reply: OutboundMessage | None = None,
                          user_id: str | None = None) -> None:
        """``insert_inbound`` inside the caller's write transaction ``conn`` (the sender's identity
        is read or created in it too: ``gateway.inbound.receive``). Raises ``IntegrityError`` for a
        duplicate; the caller rolls back (on PostgreSQL the transaction is spoilt)."""
        now = time.time()
        run(conn, q.INSERT_INBOX, _inbox_row(message, session_key, user_id, control_reply is not None, now))
        if cancel is not None:
            condition = [_lanes.c.key == session_key]
            if cancel == "if_busy":
                condition += [_lanes.c.lease_owner.is_not(None), _lanes.c.lease_until >= now]
            conn.execute(update(_lanes).where(*condition).values(generation=_lanes.c.generation + 1))
        if control_reply is not None:
            # The reply is queued under the lane's current generation (else a later claim would
            # take it for a reply of a stopped turn and drop it).
            generation = run(conn, q.LANE_GENERATION, {"b_key": session_key}).scalar_one_or_none() or 0
            self._queue(conn, control_reply, None, session_key, generation, now)
            a = message.address  # a finished turn records its senders; a command's row is finished now
            conn.execute(q.RECORD_MEMBER[conn.dialect.name], {
                "platform": a.platform, "tenant": a.tenant, "chat_id": a.chat_id, "user_id": message.sender.user_id,
                "chat_type": message.chat_type, "first_seen_at": now})

    @staticmethod
    def insert_inbound_many_in(conn: Connection, rows: Sequence[tuple[InboundMessage, str, str | None]]) -> None:
        """``insert_inbound_in`` (no ``cancel``, no ``control_reply``) of several ``(message,
        session_key, user_id)`` in the caller's write transaction, in order (their ids ascending so),
        with one ``execute_many`` (PostgreSQL: one round trip for the lot). Raises ``IntegrityError``
        when any is a duplicate; the caller rolls back."""
        now = time.time()
        execute_many(conn, q.INSERT_INBOX, [_inbox_row(message, key, user_id, False, now)
                                            for message, key, user_id in rows])

    def next_pending(self, session_key: str, limit: int = 1) -> list[PendingInbound]:
        """The oldest ``limit`` pending inbox rows of ``session_key``, in arrival order."""
        with read_tx(self.engine) as conn:
            rows = conn.execute(
                select(_inbox.c.id, _inbox.c.payload)
                .where(_inbox.c.session_key == session_key, _inbox.c.status == "pending")
                .order_by(_inbox.c.id)
                .limit(limit)
            ).all()
        return [PendingInbound(row.id, session_key, InboundMessage.from_dict(row.payload)) for row in rows]

    def pending_batch(self, session_key: str, limit: int) -> list[PendingInbound]:
        """The oldest ``limit`` pending rows of ``session_key`` with their users (as a lane's batch)."""
        with read_tx(self.engine) as conn:
            return self._batch(conn, session_key, limit)[0]

    def keys_waiting(self, now: float, limit: int = 100) -> list[str]:
        """Session keys with pending inbox rows whose lane is not leased (or the lease expired)."""
        with read_one(self.engine) as conn:  # the sweeper's read, every few seconds: one round trip
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

    def count_leases(self, now: float) -> int:
        """Lane leases held right now, by any instance (receiver leases included; metrics)."""
        with read_tx(self.engine) as conn:
            return conn.execute(select(func.count()).select_from(_lanes).where(
                _lanes.c.lease_owner.is_not(None), _lanes.c.lease_until >= now)).scalar_one()

    # -- lanes (one turn per session key at a time) ------------------------------------------
    @retry_locked
    def claim_lane(self, key: str, owner: str, lease_s: float) -> bool:
        """Takes the lease on ``key`` if it is free, expired or already ours. Atomic on both
        backends: one conditional UPDATE (the row is created on first use)."""
        now = time.time()
        for _ in range(2):
            with write_tx(self.engine) as conn:
                result = run(conn, q.CLAIM_LANE, {"b_key": key, "b_owner": owner, "b_now": now,
                                                     "b_until": now + lease_s})
                if result.rowcount == 1:
                    return True
                if conn.execute(select(_lanes.c.key).where(_lanes.c.key == key)).first() is not None:
                    return False
            try:
                with write_tx(self.engine) as conn:
                    conn.execute(insert(_lanes).values(key=key, lease_owner=owner, lease_until=now + lease_s,
                                                       generation=0))
                return True
            except IntegrityError:
                continue  # another instance created it first: try the conditional update again
        return False

    @retry_locked
    def renew_lanes(self, keys: Sequence[str], owner: str, lease_s: float) -> list[str]:
        """Extends the leases ``owner`` holds on ``keys``; returns the keys it still holds.

        One statement whose row locks are taken in key order (``prepared.lock_lanes_in_key_order``), as every
        other transaction that locks several lanes takes them: a plain multi-row ``UPDATE`` locks in
        the plan's order (heap order under a bitmap scan) and could deadlock with another
        instance's batch admit (PostgreSQL)."""
        if not keys:
            return []
        with write_tx(self.engine) as conn:
            mine = q.lock_lanes_in_key_order(_lanes.c.key.in_(list(keys)), _lanes.c.lease_owner == owner)
            held = conn.execute(update(_lanes).where(_lanes.c.key.in_(select(mine.c.key)))
                                .values(lease_until=time.time() + lease_s).returning(_lanes.c.key)).scalars().all()
        return sorted(held)

    @retry_locked
    def release_lane(self, key: str, owner: str) -> bool:
        """Gives the lease up; returns whether rows still wait for ``key`` (stored meanwhile)."""
        with write_tx(self.engine) as conn:
            run(conn, q.RELEASE_LANE, {"b_key": key, "b_owner": owner})
            waiting = run(conn, q.ANY_PENDING, {"b_key": key}).first()
        return waiting is not None

    def claim_next(self, key: str, owner: str, lease_s: float, limit: int = 1,
                   prefetch: Prefetch | None = None) -> tuple[list[PendingInbound], int] | None:
        """``claim_lane`` and a read of the next batch in one transaction (the bus's way into a lane).

        Returns ``None`` when another instance holds the lease, or when nothing waits (the lease
        is then given back in the same transaction); otherwise the oldest ``limit`` pending rows
        and the lane's generation, with the lease held until ``next_or_release`` gives it up.
        ``prefetch`` runs on that batch in the same transaction (``Prefetch``).
        """
        claimed = self._claim_next(key, owner, lease_s, limit, prefetch)
        if claimed is not None and prefetch is not None:
            prefetch.commit()
        return claimed

    @retry_locked
    def _claim_next(self, key: str, owner: str, lease_s: float, limit: int,
                    prefetch: Prefetch | None) -> tuple[list[PendingInbound], int] | None:
        now = time.time()
        try:
            with write_tx(self.engine) as conn:
                claimed = run(conn, q.CLAIM_LANE, {"b_key": key, "b_owner": owner, "b_now": now,
                                                      "b_until": now + lease_s}).rowcount == 1
                if not claimed:
                    # The lane's first use (a new chat): its row is created leased to us, in this
                    # transaction; a lane that exists is leased by another instance, which drains
                    # what waits. (Elsewhere than SQLite and PostgreSQL: a read, then the insert,
                    # which fails when another instance created the lane meanwhile: then the
                    # claim is tried again.)
                    lane = {"key": key, "lease_owner": owner, "lease_until": now + lease_s, "generation": 0}
                    if_new = q.INSERT_LANE_IF_NEW.get(conn.dialect.name)
                    if if_new is not None:
                        if run(conn, if_new, lane).rowcount == 0:
                            return None
                    elif run(conn, q.LANE_EXISTS, {"b_key": key}).first() is not None:
                        return None
                    else:
                        run(conn, q.INSERT_LANE, lane)
                return self._first_batch(conn, key, owner, limit, prefetch)
        except IntegrityError:
            return self._claim_next(key, owner, lease_s, limit, prefetch)

    def claim_free_lane_in(self, conn: Any, key: str, owner: str, lease_s: float, limit: int,
                           prefetch: Prefetch | None) -> tuple[list[PendingInbound], int] | None:
        """``claim_next`` inside the caller's write transaction ``conn`` (the one that stored a row
        for ``key``: ``gateway.inbound.receive``), for a lane no turn holds: a lane used for the first
        time is created leased to ``owner`` for ``lease_s`` seconds (``INSERT_LANE_IF_NEW``; its
        prefetch is told it is ``fresh``), one whose lease is free or expired is leased so
        (``CLAIM_FREE_LANE``); then its oldest ``limit`` pending rows are read (``prefetch`` runs on
        them). Returns ``(batch, generation)``, or ``None`` when a lease is held (by a turn here or
        on another instance, which drains what waits; nothing is written then), when nothing
        waits, or on a database without a single-statement insert-if-new (only SQLite and
        PostgreSQL have one). Like ``claim_next``'s, the claim is one conditional statement, so
        only one instance can win it; the lease keeps the others out until the batch's turn ends."""
        if_new = q.INSERT_LANE_IF_NEW.get(conn.dialect.name)
        if if_new is None:
            return None
        now = time.time()
        if conn.dialect.name == "postgresql":  # the insert or the claim in one round trip, a new lane's batch too
            rows = run(conn, q.CLAIM_FREE_LANE_WITH_BATCH, {"b_key": key, "b_owner": owner, "b_now": now,
                                                             "b_until": now + lease_s, "b_limit": limit}).all()
            if not rows[0].won:
                return None
            if not rows[0].fresh:  # read after the claim, in a snapshot that sees what the claim waited for
                return self._first_batch(conn, key, owner, limit, prefetch)
            return self._first_batch(conn, key, owner, limit, prefetch, fresh=True,
                                     rows=[row for row in rows if row.id is not None])
        lane = {"key": key, "lease_owner": owner, "lease_until": now + lease_s, "generation": 0}
        if run(conn, if_new, lane).rowcount == 1:
            return self._first_batch(conn, key, owner, limit, prefetch, fresh=True)
        if run(conn, q.CLAIM_FREE_LANE, {"b_key": key, "b_owner": owner, "b_now": now,
                                         "b_until": now + lease_s}).rowcount == 1:
            return self._first_batch(conn, key, owner, limit, prefetch)
        return None

    def claim_free_lanes_in(self, conn: Any, keys: Sequence[str], owner: str, lease_s: float, limit: int,
                            prefetches: Callable[[], Prefetch | None]) -> dict[str, tuple[list[PendingInbound], int,
                                                                                        Prefetch | None]]:
        """``claim_free_lane_in`` for each of ``keys`` (distinct) in the caller's write transaction
        ``conn`` (a batch's admit, ``gateway.inbound.receive``). On PostgreSQL the lanes are created
        or claimed in one statement (``CLAIM_FREE_LANES``: one round trip for a batch's new chats
        instead of one each); a lane that existed has its batch read afterwards, one statement
        each. ``prefetches()`` makes each claimed lane's ``Prefetch`` (run on its batch here).
        Returns ``{key: (batch, generation, prefetch)}`` for the lanes claimed with rows waiting;
        a key missing was not claimed (a lease is held, nothing waits, or the database has no
        single-statement insert-if-new)."""
        claimed: dict[str, tuple[list[PendingInbound], int, Prefetch | None]] = {}
        if conn.dialect.name != "postgresql" or len(keys) < 2:
            for key in keys:
                prefetch = prefetches()
                one = self.claim_free_lane_in(conn, key, owner, lease_s, limit, prefetch)
                if one is not None:
                    claimed[key] = (*one, prefetch)
            return claimed
        now = time.time()
        rows = run(conn, q.CLAIM_FREE_LANES, {"b_keys": sorted(set(keys)), "b_owner": owner, "b_now": now,
                                              "b_until": now + lease_s, "b_limit": limit}).all()
        by_key: dict[str, list[Any]] = {}
        for row in rows:
            by_key.setdefault(row.key, []).append(row)
        sessions = NewSessions()  # the new lanes' sessions, written together below
        for key, won in by_key.items():
            prefetch = prefetches()
            if won[0].fresh:
                one = self._first_batch(conn, key, owner, limit, prefetch, fresh=sessions,
                                        rows=[row for row in won if row.id is not None])
            else:  # read after the claim, in a snapshot that sees what the claim waited for
                one = self._first_batch(conn, key, owner, limit, prefetch)
            if one is not None:
                claimed[key] = (*one, prefetch)
        sessions.write(conn)
        return claimed

    def _first_batch(self, conn: Any, key: str, owner: str, limit: int, prefetch: Prefetch | None,
                     fresh: bool | NewSessions = False,
                     rows: list[Any] | None = None) -> tuple[list[PendingInbound], int] | None:
        """The batch of a lane just claimed by ``owner`` (``prefetch`` run on it; ``fresh``: the
        lane was created in this transaction; ``rows``: the batch's rows, read with the claim), or
        ``None`` with the lease given up when nothing waits."""
        batch, generation = self._batch(conn, key, limit) if rows is None else self._pending(key, rows)
        if not batch:
            run(conn, q.RELEASE_LANE, {"b_key": key, "b_owner": owner})
            return None
        if prefetch is not None:
            prefetch.run(conn, batch, fresh)
        return batch, generation

    @retry_locked
    def next_or_release(self, key: str, owner: str, limit: int = 1) -> tuple[list[PendingInbound], int, bool]:
        """After a turn: the next pending rows of ``key`` (lease kept), or, when none wait, gives
        the lease up in the same transaction. Returns ``(batch, generation, waiting)``; ``waiting``
        (empty batch only) is whether a row was stored meanwhile (PostgreSQL: committed between
        the read and the release), which the caller drains again."""
        with write_tx(self.engine) as conn:
            return self._next_or_release(conn, key, owner, limit)

    def _next_or_release(self, conn: Any, key: str, owner: str, limit: int) -> tuple[list[PendingInbound], int, bool]:
        if conn.dialect.name == "sqlite":
            batch, generation = self._batch(conn, key, limit)
            if not batch:
                run(conn, q.RELEASE_LANE, {"b_key": key, "b_owner": owner})
            # a write transaction there is the only writer: nothing was stored since the read
            return batch, generation, False
        # PostgreSQL: the read and the release in one round trip; then, in a later snapshot, a row
        # another instance committed meanwhile (its admit found the lane held)
        batch, generation = self._batch(conn, key, limit, q.BATCH_OR_RELEASE, owner)
        if batch:
            return batch, generation, False
        return [], 0, run(conn, q.ANY_PENDING, {"b_key": key}).first() is not None

    @staticmethod
    def _batch(conn: Any, key: str, limit: int, statement: Any = q.PENDING_BATCH,
               owner: str | None = None) -> tuple[list[PendingInbound], int]:
        values = {"b_key": key, "b_limit": limit}
        if owner is not None:
            values["b_owner"] = owner
        return Store._pending(key, run(conn, statement, values).all())

    @staticmethod
    def _pending(key: str, rows: list[Any]) -> tuple[list[PendingInbound], int]:
        """``(batch, generation)`` of ``PENDING_BATCH``'s rows (``([], 0)`` for none)."""
        if not rows:
            return [], 0
        return [PendingInbound(row.id, key, InboundMessage.from_dict(row.payload), row.user_id, row.crashes)
                for row in rows], int(rows[0].generation or 0)

    @retry_locked
    def mark_last_try(self, inbox_ids: Sequence[int], marked: bool = True) -> None:
        """Marks (``marked``) or unmarks the rows of a turn making its last try after crashes
        (``InboxRow.last_try``): a crash while they are marked counts for them
        (``gateway.ops.instance_store``). Only that rare path writes it."""
        with write_tx(self.engine) as conn:
            conn.execute(update(_inbox).where(_inbox.c.id.in_(list(inbox_ids))).values(last_try=marked))

    def lane_exists(self, key: str) -> bool:
        """Whether the session key has been used before (the bot is part of that conversation)."""
        with read_tx(self.engine) as conn:
            return conn.execute(select(_lanes.c.key).where(_lanes.c.key == key)).first() is not None

    def lane_busy(self, key: str) -> bool:
        """Whether a turn is running for ``key`` (a live lease is held)."""
        with read_tx(self.engine) as conn:
            row = conn.execute(select(_lanes.c.lease_owner, _lanes.c.lease_until).where(_lanes.c.key == key)).first()
        return row is not None and row.lease_owner is not None and row.lease_until >= time.time()

    def lane_generation(self, key: str) -> int:
        """The lane's current generation (0 for a lane never used)."""
        with read_tx(self.engine) as conn:
            value = conn.execute(select(_lanes.c.generation).where(_lanes.c.key == key)).scalar_one_or_none()
        return int(value or 0)

    # -- sessions and transcript -------------------------------------------------------------
    def open_session(self, key: str, build_system_prompt: Callable[[], str], window: int,
                     owner_user_id: str | None = None,
                     settings: Callable[[], dict[str, Any] | None] = lambda: None) -> OpenSession:
        """The key's current session with its stored system prompt, its newest summary and the
        newest ``window`` messages after that summary's cut, in one read (O(window) rows however
        long the transcript is); created (prompt built once and stored, with ``settings()``) on
        first use."""
        with read_tx(self.engine) as conn:
            current = self._current_session(conn, key, window)
        if current is not None:
            return current
        prompt, made = build_system_prompt(), settings()
        session_id = self.new_session(key, prompt, owner_user_id, made)
        return OpenSession(session_id, prompt, [], None, settings=made)  # what was just stored

    def open_session_in(self, conn: Connection, key: str, build_system_prompt: Callable[[], str], window: int,
                        owner_user_id: str | None = None,
                        settings: Callable[[], dict[str, Any] | None] = lambda: None,
                        fresh: bool | NewSessions = False) -> OpenSession:
        """``open_session`` in the caller's write transaction ``conn`` (a lane's claim: ``Prefetch``),
        the session created in it when the key has none. ``fresh``: the key's lane was created in
        this transaction (``Prefetch``), so it has no session: none is looked for (one statement
        fewer for a new chat's first turn); a ``NewSessions`` there: the session is added to it, and
        written with the others it holds before the transaction commits."""
        current = None if fresh else self._current_session(conn, key, window)
        if current is not None:
            return current
        prompt, made = build_system_prompt(), settings()
        if isinstance(fresh, NewSessions):
            return OpenSession(fresh.add(key, prompt, owner_user_id, made), prompt, [], None, settings=made)
        return OpenSession(self._create_session(conn, key, prompt, owner_user_id, made), prompt, [], None,
                           settings=made)

    @classmethod
    def _current_session(cls, conn: Any, key: str, window: int) -> OpenSession | None:
        """The key's current session with its newest summary and ``window`` messages after its
        cut: two statements (``CURRENT_SESSION_SUMMARY``, ``WINDOW``; PostgreSQL: one,
        ``SESSION_WITH_WINDOW``), one for ``window`` 0."""
        if not window:
            row = run(conn, q.CURRENT_SESSION, {"b_key": key}).first()
            return None if row is None else OpenSession(row.id, row.system_prompt, [], row.updated_at, None,
                                                        row.settings)
        if conn.dialect.name == "postgresql":  # the session and its window in one round trip
            row = run(conn, q.SESSION_WITH_WINDOW, {"b_key": key, "b_limit": window}).first()
            if row is None:
                return None
            summary = Summary(row.covers_to_id, row.summary_text) if row.covers_to_id is not None else None
            return OpenSession(row.id, row.system_prompt, [StoredMessage(*m) for m in row.window or ()],
                               row.updated_at, summary, row.settings)
        row = run(conn, q.CURRENT_SESSION_SUMMARY, {"b_key": key}).first()
        if row is None:
            return None
        summary = Summary(row.covers_to_id, row.summary_text) if row.covers_to_id is not None else None
        after = summary.covers_to_id if summary is not None else 0
        return OpenSession(row.id, row.system_prompt, cls._window(conn, row.id, window, after), row.updated_at,
                           summary, row.settings)

    @retry_locked
    def new_session(self, key: str, system_prompt: str, owner_user_id: str | None,
                    settings: dict[str, Any] | None = None) -> str:
        """Creates a session for ``key`` (owned by ``owner_user_id`` for a DM) and makes it the
        lane's current one; the previous one stays listed. ``settings``: what the chat's settings
        chose for it (``sessions.settings``). Returns its id."""
        with write_tx(self.engine) as conn:
            return self._create_session(conn, key, system_prompt, owner_user_id, settings)

    @staticmethod
    def _create_session(conn: Any, key: str, system_prompt: str, owner_user_id: str | None,
                        settings: dict[str, Any] | None) -> str:
        session_id = uuid.uuid4().hex
        now = time.time()
        row = {"id": session_id, "key": key, "system_prompt": system_prompt, "created_at": now, "updated_at": now,
               "owner_user_id": owner_user_id, "settings": settings}
        if conn.dialect.name == "postgresql":  # the session and the lane's pointer to it in one round trip
            lane_set = run(conn, q.CREATE_SESSION_SET_LANE,
                           {"b_key": key, **{f"s_{name}": value for name, value in row.items()}}).rowcount == 1
        else:
            run(conn, q.INSERT_SESSION, row)
            lane_set = run(conn, q.SET_LANE_SESSION, {"b_key": key, "session_id": session_id}).rowcount == 1
        if not lane_set:
            conn.execute(insert(_lanes).values(key=key, session_id=session_id, lease_until=0.0, generation=0))
        return session_id

    @retry_locked
    def switch_session(self, key: str, session_id: str) -> None:
        """Makes ``session_id`` the lane's current session (``/resume``; ownership checked by the
        caller). Resuming is a use: the session's ``updated_at`` becomes now, so a reset policy
        (``sessions.idle_reset_minutes``, ``daily_reset_hour``) does not replace it at the next
        message."""
        with write_tx(self.engine) as conn:
            conn.execute(update(_lanes).where(_lanes.c.key == key).values(session_id=session_id))
            conn.execute(update(_sessions).where(_sessions.c.id == session_id).values(updated_at=time.time()))

    def session_settings(self, session_id: str) -> dict[str, Any] | None:
        """What the session was created with (``sessions.settings``; ``None``: the defaults, or no
        such session)."""
        with read_tx(self.engine) as conn:
            return conn.execute(select(_sessions.c.settings).where(_sessions.c.id == session_id)).scalar()

    def current_session_id(self, key: str) -> str | None:
        with read_tx(self.engine) as conn:
            return conn.execute(select(_lanes.c.session_id).where(_lanes.c.key == key)).scalar()

    @retry_locked
    def current_session(self, key: str, build_system_prompt: Callable[[], str],
                        owner_user_id: str | None = None) -> tuple[str, str]:
        """``(session_id, system_prompt)`` of the key's current session, created on first use."""
        opened = self.open_session(key, build_system_prompt, 0, owner_user_id)
        return opened.session_id, opened.system_prompt

    @retry_locked
    def append_message(self, session_id: str, turn_id: str | None, role: str, content: str | None,
                       usage: Sequence[UsageEntry] = (), **fields: Any) -> int:
        """Appends one transcript message (and its ``usage`` rows, see ``NewMessage``); returns its id.
        ``fields``: ``tool_calls``, ``tool_call_id``, ``name``, ``meta``, ``platform_message_id``,
        ``prompt_tokens``, ``completion_tokens``."""
        with write_tx(self.engine) as conn:
            return self._append(conn, session_id, [NewMessage(turn_id, role, content, fields, usage)])[0]

    @retry_locked
    def add_meta(self, message_id: int, values: dict[str, Any]) -> None:
        """Merges ``values`` into a transcript message's ``meta`` (what a finished run adds to its
        already written answer, e.g. the files it sent)."""
        with write_tx(self.engine) as conn:
            meta = conn.execute(select(_messages.c.meta).where(_messages.c.id == message_id)).scalar()
            conn.execute(update(_messages).where(_messages.c.id == message_id)
                         .values(meta={**(meta if isinstance(meta, dict) else {}), **values}))

    @retry_locked
    def append_messages(self, session_id: str, messages: Sequence[NewMessage]) -> list[int]:
        """Appends several transcript messages in one transaction, in order; returns their ids."""
        with write_tx(self.engine) as conn:
            return self._append(conn, session_id, messages)

    @staticmethod
    def _append(conn: Any, session_id: str, messages: Sequence[NewMessage], title: bool = True) -> list[int]:
        """Inserts ``messages`` (and their usage rows); with ``title`` also sets the session's title
        when it has none (``_title``). Returns the messages' ids."""
        now = time.time()
        rows = [Store._message_row(session_id, m, now) for m in messages]
        if conn.dialect.name == "postgresql":  # with their usage rows: one round trip per MESSAGES_PER_INSERT
            ids: list[int] = []
            for start in range(0, len(rows), q.MESSAGES_PER_INSERT):
                chunk = messages[start:start + q.MESSAGES_PER_INSERT]
                values = {f"{column}_{i}": row.get(column)
                          for i, row in enumerate(rows[start:start + len(chunk)]) for column in q.MESSAGE_COLUMNS}
                calls = [(i, n, used) for i, m in enumerate(chunk) for n, used in enumerate(m.usage)]
                for j, (i, _, used) in enumerate(calls):
                    columns = {"turn_id": chunk[i].turn_id, "created_at": now, **used.columns()}
                    values.update({f"u{j}_{c}": columns[c] for c in q.USAGE_COLUMNS})
                statement = q.insert_messages(len(chunk), tuple((i, n) for i, n, _ in calls))
                ids += sorted(int(r.id) for r in run(conn, statement, values).all())
        else:
            ids = [int(run(conn, q.INSERT_MESSAGE, row).inserted_primary_key[0]) for row in rows]
            for m, message_id in zip(messages, ids, strict=True):
                for number, used in enumerate(m.usage):  # counted once: with the message, keyed by its id
                    run(conn, q.INSERT_USAGE, {"call_key": f"message:{message_id}" + (f":{number}" if number else ""),
                                               "turn_id": m.turn_id, "created_at": now, **used.columns()})
        made = Store._title(messages) if title else None
        if made is not None:
            run(conn, q.SET_TITLE, {"b_session": session_id, "b_title": made})
        return ids

    @staticmethod
    def _message_row(session_id: str, m: NewMessage, now: float) -> dict[str, Any]:
        """``messages`` columns of ``m``. Raises ``ValueError`` for a field that is not a column."""
        content = storable_text(m.content) if m.content else m.content  # a tool result may hold NUL
        row = {"session_id": session_id, "turn_id": m.turn_id, "role": m.role, "content": content, "created_at": now,
               **m.fields}
        if not row.keys() <= _MESSAGE_KEYS:
            raise ValueError(f"not a messages column: {sorted(row.keys() - _MESSAGE_KEYS)}")
        return row

    @staticmethod
    def _title(messages: Sequence[NewMessage]) -> str | None:
        """The session's title if these messages carry its first user message (set only while the
        session has none): that message's text on one line, at most 80 characters."""
        first_user = next((m.content for m in messages if m.role == "user" and m.content), None)
        return " ".join(first_user.split())[:80] if first_user else None

    def load_window(self, session_id: str, limit: int) -> list[StoredMessage]:
        """The newest ``limit`` transcript messages, oldest first: O(window), not O(history)."""
        with read_tx(self.engine) as conn:
            return self._window(conn, session_id, limit)

    def calls_spent(self, turn_id: str, message_ids: Sequence[int]) -> tuple[int, int, float]:
        """``(model calls, tokens, USD)`` of ``turn_id`` recorded with its assistant messages
        ``message_ids`` (their own calls and their sub-agents', keyed ``message:<id>`` and
        ``message:<id>:<n>``; a transcription, kept with the user message, is not a model call):
        what a turn resumed after a restart has spent already (``ix_usage_turn``)."""
        wanted = {str(i) for i in message_ids}
        if not wanted:
            return 0, 0, 0.0
        with read_tx(self.engine) as conn:
            rows = conn.execute(select(_usage.c.call_key, _usage.c.prompt_tokens, _usage.c.completion_tokens,
                                       _usage.c.cost_usd).where(_usage.c.turn_id == turn_id)).all()
        mine = [r for r in rows if r.call_key.startswith("message:") and r.call_key.split(":")[1] in wanted]
        return (len(mine), sum(r.prompt_tokens + r.completion_tokens for r in mine),
                sum(float(r.cost_usd) for r in mine))

    def turn_texts(self, session_id: str, turn_ids: Sequence[str],
                   scan: int = 400) -> list[tuple[int, str, str | None]]:
        """``(id, role, content)`` of the messages of ``turn_ids`` among the newest ``scan``
        transcript messages, oldest first."""
        with read_tx(self.engine) as conn:
            rows = run(conn, q.TURN_TEXTS, {"b_session": session_id, "b_limit": scan,
                                               "b_turns": list(turn_ids)}).all()
        return [(row.id, row.role, row.content) for row in rows]

    @retry_locked
    def save_summary(self, session_id: str, covers_to_id: int, text: str, prompt_tokens: int | None = None,
                     completion_tokens: int | None = None, usage: Sequence[UsageEntry] = ()) -> None:
        """Stores a summary of every message of ``session_id`` with ``id <= covers_to_id``; later
        turns load it instead of those messages. ``usage``: the summary call's ``usage`` row, written
        in the same transaction (keyed ``summary:<id>``)."""
        now = time.time()
        with write_tx(self.engine) as conn:
            result = conn.execute(insert(_summaries).values(
                session_id=session_id, covers_to_id=covers_to_id, text=text, prompt_tokens=prompt_tokens,
                completion_tokens=completion_tokens, created_at=now))
            key = result.inserted_primary_key
            assert key is not None
            summary_id = int(key[0])
            for number, used in enumerate(usage):
                conn.execute(insert(_usage).values(call_key=f"summary:{summary_id}" + (f":{number}" if number else ""),
                                                   turn_id=None, created_at=now, **used.columns()))

    def latest_summary(self, session_id: str) -> Summary | None:
        """The session's newest summary, or ``None``."""
        with read_tx(self.engine) as conn:
            return self._summary(conn, session_id)

    @staticmethod
    def _summary(conn: Any, session_id: str) -> Summary | None:
        row = run(conn, q.LATEST_SUMMARY, {"b_session": session_id}).first()
        return Summary(row.covers_to_id, row.text) if row is not None else None

    @staticmethod
    def _window(conn: Any, session_id: str, limit: int, after_id: int = 0) -> list[StoredMessage]:
        rows = run(conn, q.WINDOW, {"b_session": session_id, "b_after": after_id, "b_limit": limit}).all()
        return [StoredMessage(*row) for row in reversed(rows)]

    @retry_locked
    def delete_session(self, session_id: str) -> bool:
        """Deletes a session: its transcript, summaries and row; a lane whose current
        session it was starts a fresh one with its next message. What its settled turns left in
        the inbox and outbox is erased too (the messages' payloads, the replies' texts; the rows
        stay until ``database.keep_settled_days``, for deduplication). Its files are deleted by the
        caller (``gateway.media.index.MediaIndex.forget_session``). Returns whether it existed."""
        with write_tx(self.engine) as conn:
            turns = conn.execute(select(_messages.c.turn_id).where(_messages.c.session_id == session_id)
                                 .distinct()).scalars().all()
            inbox_ids = sorted({int(t[2:]) for t in turns if t and t.startswith("in") and t[2:].isdigit()})
            for chunk in range(0, len(inbox_ids), 500):
                conn.execute(update(_inbox).where(_inbox.c.id.in_(inbox_ids[chunk:chunk + 500]),
                                                  _inbox.c.status.in_(q.SETTLED_INBOX))
                             .values(payload={"erased": True}))
            conn.execute(update(_outbox).where(_outbox.c.session_id == session_id,
                                               _outbox.c.status.in_(q.SETTLED_OUTBOX))
                         .values(text="", buttons=None))
            conn.execute(delete(_messages).where(_messages.c.session_id == session_id))
            conn.execute(delete(_summaries).where(_summaries.c.session_id == session_id))
            conn.execute(update(_lanes).where(_lanes.c.session_id == session_id).values(session_id=None))
            return bool(conn.execute(delete(_sessions).where(_sessions.c.id == session_id)).rowcount)

    def transcript(self, session_id: str) -> list[StoredMessage]:
        """The whole transcript, oldest first (for tests and admin views, not the hot path)."""
        return self.load_window(session_id, 1_000_000)

    # -- turn completion and outbox ----------------------------------------------------------
    @retry_locked
    def finish_turn(
        self,
        inbox_ids: Sequence[int],
        status: str,
        replies: Sequence[OutboundMessage],
        *,
        session_id: str | None = None,
        session_key: str | None = None,
        generation: int = 0,
        merged_status: str = "merged",
        messages: Sequence[NewMessage] = (),
        stream_key: str | Sequence[str] | None = None,
        claim: tuple[str, float] | None = None,
        then: LaneNext | None = None,
        streamed: bool = True,
    ) -> list[OutboxItem]:
        """Queues ``replies`` and marks the turn's inbox rows in one transaction: the last row gets
        ``status``, earlier ones (answered together by a merged turn) ``merged_status``.

        ``claim`` = ``(owner, claim_s)``: a single reply whose chat has no unsettled row, of a turn
        whose lane generation has not moved on, is queued already *claimed* by ``owner`` (as
        ``claim_due`` would, in the same transaction) and returned, for the caller to send at once;
        a streamed reply's row (*streaming*, its preview's) is claimed so too and returned as an edit
        of the preview (``edit_id``; none when the preview's fate is unknown). Otherwise the reply
        stays *pending* for ``claim_due`` and nothing is returned. A
        claim not acted on (a crash) is freed when the instance id is taken over, or expires after
        ``claim_s``; the row is then claimed again like any other.

        A reply whose idempotency key is already queued (a resumed turn) is not queued again; a
        ``streaming`` row of the same key gets the final text (*claimed* as above, or *pending*). The turn's
        streaming row ``stream_key`` left without a reply (a cancelled turn) becomes ``cancelled``
        (its preview stays as it was); ``stream_key`` may list several (the reply's and the
        plan's, ``gateway.delivery.progress``). ``messages`` (the final transcript messages, not yet
        written) are appended first.

        ``then``: the lane's next rows are read, or its lease given up, in the same transaction
        (``LaneNext``; one transaction per turn fewer than ``next_or_release`` after it).
        ``streamed=False``: no preview took a reply's row in this run of the turn (PostgreSQL: the
        reply is then queued in one statement, ``OutboxStore._queue``).
        """
        now = time.time()
        stream_keys = [stream_key] if isinstance(stream_key, str) else list(stream_key or ())
        with write_tx(self.engine) as conn:
            if messages:
                assert session_id is not None
                self._append(conn, session_id, messages, title=False)  # set with the session's touch
            claimed: list[OutboxItem] = []
            for reply in replies:
                owner = claim if claim is not None and len(replies) == 1 else None
                item = self._queue(conn, reply, session_id, session_key, generation, now, owner, streamed)
                if item is not None:
                    claimed.append(item)
            # After the replies are queued (a streamed reply's row is no longer *streaming*): the
            # session's touch and its chat, the turn's streams cancelled, its inbox rows finished
            title = self._title(messages)
            if conn.dialect.name == "postgresql" and session_id is not None and replies:
                values = {"b_ids": list(inbox_ids), "b_last": inbox_ids[-1], "b_status": status,
                          "b_merged": merged_status, "b_now": now, "b_session": session_id}
                if stream_keys:
                    values["b_keys"] = stream_keys
                if title is not None:
                    values["b_title"] = title
                run(conn, q.finish_writes(title is not None, bool(stream_keys)), values)  # one round trip
            else:
                if session_id is not None:
                    self._touch_session(conn, session_id, now, title)
                run(conn, q.RECORD_MEMBERS if conn.dialect.name == "postgresql" else q.RECORD_MEMBERS_SQLITE,
                    {"b_ids": list(inbox_ids), "b_now": now})
                if stream_keys:
                    run(conn, q.CANCEL_STREAMS, {"b_keys": stream_keys})
                *earlier, last = inbox_ids
                if earlier:
                    run(conn, q.FINISH_INBOX_MANY, {"b_ids": earlier, "status": merged_status, "finished_at": now})
                run(conn, q.FINISH_INBOX, {"b_id": last, "status": status, "finished_at": now})
            following = self._next_or_release(conn, then.key, then.owner, then.limit) if then is not None else None
            if following is not None and following[0] and then is not None and then.prefetch is not None:
                then.prefetch.run(conn, following[0])
        if then is not None and following is not None:  # committed: the caller may act on it
            then.batch, then.generation, then.waiting = following
            then.done = True
            if then.prefetch is not None and then.batch:
                then.prefetch.commit()
        return claimed

    @staticmethod
    def _touch_session(conn: Any, session_id: str, now: float, title: str | None = None) -> None:
        """Last use, and the title when the session has none yet (``title``: ``_title``; SQLite, on
        PostgreSQL ``q.finish_writes`` does both)."""
        if title is None:
            run(conn, q.TOUCH_SESSION, {"b_session": session_id, "b_now": now})
        else:
            run(conn, q.TOUCH_SESSION_TITLED, {"b_session": session_id, "b_now": now, "b_title": title})

    def purge_all(self) -> None:
        """Deletes every row (tests only)."""
        with write_tx(self.engine) as conn:
            for table in reversed(Base.metadata.sorted_tables):
                if table.name != "alembic_version":
                    conn.execute(delete(table))
