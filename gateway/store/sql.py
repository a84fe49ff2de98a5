"""``Store``: every read and write the gateway makes, each a short transaction.

Calls block (SQLAlchemy sync engine): call them from worker threads or via ``asyncio.to_thread``,
never directly on the main loop (DESIGN §2).
"""

from __future__ import annotations

import dataclasses
import functools
import random
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

from sqlalchemy import Connection, Engine, delete, func, insert, or_, select, update
from sqlalchemy.exc import IntegrityError, OperationalError
from tenacity import retry, retry_if_exception, stop_after_attempt, wait_random_exponential

from gateway.core.types import ChatAddress, InboundMessage, OutboundAttachment, OutboundMessage
from gateway.store import prepared as q
from gateway.store.db import read_tx, write_tx
from gateway.store.fast import execute as run
from gateway.store.marks import Mark, failed_mark, progress_mark, retry_mark, sending_mark, sent_mark
from gateway.store.models import (
    Base,
    InboxRow,
    JobRunRow,
    LaneRow,
    MessageRow,
    OutboxRow,
    SessionAddressRow,
    SessionRow,
    SummaryRow,
    UsageRow,
    table,
)
from gateway.store.text import storable, storable_text


def _chat_key(address: ChatAddress) -> str:
    return f"{address.platform}:{address.tenant}:{address.chat_id}"


def _attachments(reply: OutboundMessage) -> list[dict[str, Any]] | None:
    """The outbox row's ``attachments`` column for ``reply`` (``None`` without files)."""
    return [a.to_dict() for a in reply.attachments] or None


def _is_lock_error(exc: BaseException) -> bool:
    return isinstance(exc, OperationalError) and any(
        word in str(exc.orig).lower() for word in ("database is locked", "database is busy", "deadlock detected",
                                                    "could not serialize")
    )


_retry_locked = retry(
    retry=retry_if_exception(_is_lock_error),
    wait=wait_random_exponential(multiplier=0.01, max=0.5),
    stop=stop_after_attempt(5),  # after the plain first attempt below: 6 in all
    reraise=True,
)

F = TypeVar("F", bound=Callable[..., Any])


def retry_locked(fn: F) -> F:
    """Retries a whole write transaction, with jitter, when SQLite's busy timeout ran out (or
    PostgreSQL reported a deadlock), up to 6 attempts (tenacity); after the last attempt the error
    surfaces — a row is never dropped silently. The first attempt is a plain call: tenacity's
    per-call set-up (a fresh ``Retrying`` and its state) is paid only once a lock error happened."""
    retried = _retry_locked(fn)

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except OperationalError as exc:
            if not _is_lock_error(exc):
                raise
        time.sleep(random.uniform(0, 0.01))  # tenacity's first wait (wait_random_exponential, multiplier 0.01)
        return retried(*args, **kwargs)

    call.retry = retried.retry  # type: ignore[attr-defined]  # tenacity's interface (statistics, tests)
    return call  # type: ignore[return-value]

_inbox = table(InboxRow)
_lanes = table(LaneRow)
_messages = table(MessageRow)
_outbox = table(OutboxRow)
_sessions = table(SessionRow)
_addresses = table(SessionAddressRow)
_job_runs = table(JobRunRow)

SETTLED = frozenset({"sent", "unconfirmed", "failed"})
"""Final outbox states; a scheduled report's run takes its outbox row's final state."""
_summaries = table(SummaryRow)
_usage = table(UsageRow)


@dataclass(frozen=True, slots=True)
class PendingInbound:
    """An inbox row waiting for its turn."""

    inbox_id: int
    session_key: str
    message: InboundMessage
    user_id: str | None = None
    """The sender's user (identities resolved at receipt)."""


class Prefetch:
    """Reads for the turn about to run, made in the transaction that hands its lane the rows
    (``Store.claim_next``, or the previous turn's ``finish_turn`` with ``LaneNext``) instead of
    transactions of their own: ``fn(conn, batch)`` runs there (again if the transaction is
    retried), and ``value`` is its result once that transaction committed (``None`` until then).
    ``fn`` must raise only what should fail that transaction (a database error)."""

    __slots__ = ("_pending", "fn", "value")

    def __init__(self, fn: Callable[[Connection, list[PendingInbound]], Any]) -> None:
        self.fn = fn
        self.value: Any = None
        self._pending: Any = None

    def run(self, conn: Connection, batch: list[PendingInbound]) -> None:
        self._pending = self.fn(conn, batch)

    def commit(self) -> None:
        self.value, self._pending = self._pending, None


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
    message's id). Tokens as the API reported them (``cached_tokens`` are part of
    ``prompt_tokens``); ``cost_usd`` at the configured price; ``day`` is ``YYYY-MM-DD`` in
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
    and the sub-agent calls made before it was stored)."""

    turn_id: str | None
    role: str
    content: str | None
    fields: dict[str, Any]
    usage: Sequence[UsageEntry] = ()


@dataclass(frozen=True, slots=True)
class StreamStart:
    """What ``Store.start_stream`` found for a streamed reply's row ``row_id``: ``send``: the first
    message may be sent now (the row holds ``"?"``); ``preview_id``: the message a resumed turn
    keeps editing; neither: no message (the row is final, or an earlier send's fate is unknown)."""

    row_id: int
    send: bool
    preview_id: str | None


class StreamRequest(NamedTuple):
    """What ``Store.start_stream`` is asked for: the reply (its address and idempotency key; the
    text is empty), the turn's session, its lane and the lane generation it runs under."""

    reply: OutboundMessage
    session_id: str | None
    session_key: str | None
    generation: int


@dataclass(frozen=True, slots=True)
class OutboxItem:
    """A claimed outbox row ready to send."""

    id: int
    attempts: int
    message: OutboundMessage
    sent_ids: tuple[str, ...] = ()
    """Platform message ids of parts delivered by earlier attempts."""
    unconfirmed: bool = False
    """The previous owner died while sending: its part in flight may or may not have arrived."""


@dataclass(frozen=True, slots=True)
class ClaimedOutbox:
    """What one ``claim_due`` took: ``items``, and ``more`` when rows may be due once they settle
    (a later pending row of one of their chats waits behind them, or ``limit`` rows were due).
    Rows queued later wake delivery themselves; rows in a retry wait are due at their time."""

    items: list[OutboxItem]
    more: bool


class Store:
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

    def insert_inbound_in(self, conn: Connection, message: InboundMessage, session_key: str, *,
                          cancel: str | None = None, control_reply: OutboundMessage | None = None,
                          user_id: str | None = None) -> None:
        """``insert_inbound`` inside the caller's write transaction ``conn`` (the sender's identity
        is read or created in it too: ``gateway.inbound.receive``). Raises ``IntegrityError`` for a
        duplicate; the caller rolls back (on PostgreSQL the transaction is spoilt)."""
        now = time.time()
        run(conn, q.INSERT_INBOX, {
            "platform": message.platform, "tenant": message.address.tenant,
            "platform_message_id": storable_text(message.message_id), "session_key": session_key,
            "user_id": user_id, "payload": storable(message.to_dict()),
            "status": "pending" if control_reply is None else "done",
            "received_at": message.received_at, "finished_at": None if control_reply is None else now,
        })
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
        """Extends the leases ``owner`` holds on ``keys``; returns the keys it still holds."""
        if not keys:
            return []
        with write_tx(self.engine) as conn:
            conn.execute(
                update(_lanes)
                .where(_lanes.c.key.in_(list(keys)), _lanes.c.lease_owner == owner)
                .values(lease_until=time.time() + lease_s)
            )
            held = conn.execute(select(_lanes.c.key).where(_lanes.c.key.in_(list(keys)),
                                                           _lanes.c.lease_owner == owner)).scalars().all()
        return list(held)

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

    def claim_new_lane_in(self, conn: Any, key: str, owner: str, lease_s: float, limit: int,
                          prefetch: Prefetch | None) -> tuple[list[PendingInbound], int] | None:
        """``claim_next`` for a lane used for the first time, inside the caller's write transaction
        ``conn`` (the one that stored the row for ``key``: ``gateway.inbound.receive``): the lane is
        created leased to ``owner`` for ``lease_s`` seconds, and its oldest ``limit`` pending rows are
        read (``prefetch`` runs on them). Returns ``(batch, generation)``, or ``None`` when the lane
        exists (whoever uses it drains what waits; nothing is written then), when nothing waits,
        or on a database without a single-statement insert-if-new (only SQLite and PostgreSQL
        have one). A new lane cannot have a turn running anywhere, so the claim is safe without
        asking the bus; the lease is what keeps other instances out until the batch's turn ends."""
        if_new = q.INSERT_LANE_IF_NEW.get(conn.dialect.name)
        if if_new is None:
            return None
        now = time.time()
        lane = {"key": key, "lease_owner": owner, "lease_until": now + lease_s, "generation": 0}
        if run(conn, if_new, lane).rowcount == 0:
            return None
        return self._first_batch(conn, key, owner, limit, prefetch)

    def _first_batch(self, conn: Any, key: str, owner: str, limit: int,
                     prefetch: Prefetch | None) -> tuple[list[PendingInbound], int] | None:
        """The batch of a lane just claimed by ``owner`` (``prefetch`` run on it), or ``None`` with
        the lease given up when nothing waits."""
        batch, generation = self._batch(conn, key, limit)
        if not batch:
            run(conn, q.RELEASE_LANE, {"b_key": key, "b_owner": owner})
            return None
        if prefetch is not None:
            prefetch.run(conn, batch)
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
        batch, generation = self._batch(conn, key, limit)
        if batch:
            return batch, generation, False
        run(conn, q.RELEASE_LANE, {"b_key": key, "b_owner": owner})
        if conn.dialect.name == "sqlite":
            return [], 0, False  # a write transaction there is the only writer: nothing was stored since the read
        waiting = run(conn, q.ANY_PENDING, {"b_key": key}).first() is not None
        return [], 0, waiting

    @staticmethod
    def _batch(conn: Any, key: str, limit: int) -> tuple[list[PendingInbound], int]:
        rows = run(conn, q.PENDING_BATCH, {"b_key": key, "b_limit": limit}).all()
        if not rows:
            return [], 0
        return [PendingInbound(row.id, key, InboundMessage.from_dict(row.payload), row.user_id)
                for row in rows], int(rows[0].generation or 0)

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
                        settings: Callable[[], dict[str, Any] | None] = lambda: None) -> OpenSession:
        """``open_session`` in the caller's write transaction ``conn`` (a lane's claim: ``Prefetch``),
        the session created in it when the key has none."""
        current = self._current_session(conn, key, window)
        if current is not None:
            return current
        prompt, made = build_system_prompt(), settings()
        return OpenSession(self._create_session(conn, key, prompt, owner_user_id, made), prompt, [], None,
                           settings=made)

    @classmethod
    def _current_session(cls, conn: Any, key: str, window: int) -> OpenSession | None:
        row = run(conn, q.CURRENT_SESSION, {"b_key": key}).first()
        if row is None:
            return None
        summary = cls._summary(conn, row.id) if window else None
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
        run(conn, q.INSERT_SESSION, {"id": session_id, "key": key, "system_prompt": system_prompt,
                                     "created_at": now, "updated_at": now, "owner_user_id": owner_user_id,
                                     "settings": settings})
        if run(conn, q.SET_LANE_SESSION, {"b_key": key, "session_id": session_id}).rowcount == 0:
            conn.execute(insert(_lanes).values(key=key, session_id=session_id, lease_until=0.0, generation=0))
        return session_id

    @retry_locked
    def switch_session(self, key: str, session_id: str) -> None:
        """Makes ``session_id`` the lane's current session (``/resume``; ownership checked by the
        caller)."""
        with write_tx(self.engine) as conn:
            conn.execute(update(_lanes).where(_lanes.c.key == key).values(session_id=session_id))

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
        ids = []
        now = time.time()
        for m in messages:
            content = storable_text(m.content) if m.content else m.content  # a tool result may hold NUL
            result = run(conn, q.INSERT_MESSAGE, {"session_id": session_id, "turn_id": m.turn_id, "role": m.role,
                                                     "content": content, "created_at": now, **m.fields})
            ids.append(int(result.inserted_primary_key[0]))
            for number, used in enumerate(m.usage):  # counted once: with the message, keyed by its id
                run(conn, q.INSERT_USAGE, {"call_key": f"message:{ids[-1]}" + (f":{number}" if number else ""),
                                           "turn_id": m.turn_id, "created_at": now, **used.columns()})
        made = Store._title(messages) if title else None
        if made is not None:
            run(conn, q.SET_TITLE, {"b_session": session_id, "b_title": made})
        return ids

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
        """Deletes a session: its transcript, summaries, chat addresses and row; a lane whose current
        session it was starts a fresh one with its next message. Its files are deleted by the
        caller (``gateway.media.index.MediaIndex.forget_session``). Returns whether it existed."""
        with write_tx(self.engine) as conn:
            conn.execute(delete(_messages).where(_messages.c.session_id == session_id))
            conn.execute(delete(_summaries).where(_summaries.c.session_id == session_id))
            conn.execute(delete(_addresses).where(_addresses.c.session_id == session_id))
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
        """
        now = time.time()
        with write_tx(self.engine) as conn:
            if messages:
                assert session_id is not None
                self._append(conn, session_id, messages, title=False)  # set with the session's touch
            if session_id is not None:
                self._touch_session(conn, session_id, replies, now, self._title(messages))
            claimed: list[OutboxItem] = []
            for reply in replies:
                owner = claim if claim is not None and len(replies) == 1 else None
                item = self._queue(conn, reply, session_id, session_key, generation, now, owner)
                if item is not None:
                    claimed.append(item)
            stream_keys = [stream_key] if isinstance(stream_key, str) else list(stream_key or ())
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
    def _touch_session(conn: Any, session_id: str, replies: Sequence[OutboundMessage], now: float,
                       title: str | None = None) -> None:
        """Last use, the title when the session has none yet (``title``: ``_title``), and the chats
        the session was used from."""
        if title is None:
            run(conn, q.TOUCH_SESSION, {"b_session": session_id, "b_now": now})
        else:
            run(conn, q.TOUCH_SESSION_TITLED, {"b_session": session_id, "b_now": now, "b_title": title})
        for reply in replies[:1]:
            a = reply.address
            chat_key = f"{a.platform}:{a.tenant}:{a.chat_id}"
            upsert = q.UPSERT_ADDRESS.get(conn.dialect.name)
            if upsert is not None:
                run(conn, upsert, {"session_id": session_id, "chat_key": chat_key, "address": a.to_dict(),
                                   "last_used_at": now})
                continue
            touched = run(conn, q.TOUCH_ADDRESS, {"b_session": session_id, "b_chat": chat_key, "b_now": now,
                                                     "b_address": a.to_dict()}).rowcount
            if not touched:
                run(conn, q.INSERT_ADDRESS, {"session_id": session_id, "chat_key": chat_key,
                                                "address": a.to_dict(), "last_used_at": now})

    @staticmethod
    def _queue(conn: Any, reply: OutboundMessage, session_id: str | None, session_key: str | None,
               generation: int, now: float, claim: tuple[str, float] | None = None) -> OutboxItem | None:
        """Inserts an outbox row unless its idempotency key is already queued. A ``streaming`` row
        of the same key (the turn's preview) gets the final text instead. With ``claim`` (see
        ``finish_turn``) the new row, or the streaming one, goes in *claimed* when its chat has no
        unsettled row and its lane's generation is still ``generation``, and is returned (else
        *pending*)."""
        a = reply.address
        chat_key = _chat_key(a)
        preview = None
        if claim is not None and session_key is not None:  # the key's row and both checks in one read
            row = run(conn, q.QUEUE_CHECK, {"b_key": reply.idempotency_key, "b_chat": chat_key,
                                            "b_lane": session_key}).first()
            found, preview = ((row.id, row.status) if row.id is not None else None), row.preview_id
            # An earlier reply of the chat goes first (claim_due hands this one out after it); a
            # turn that was stopped (/stop, an interrupt) has its row cancelled by claim_due.
            if row.unsettled or (row.generation or 0) > generation:
                claim = None
        else:  # no claim, or no lane to check the turn against
            row = run(conn, q.OUTBOX_BY_KEY, {"b_key": reply.idempotency_key}).first()
            found = (row.id, row.status) if row is not None else None
            if found is None and claim is not None and \
                    run(conn, q.UNSETTLED_IN_CHAT, {"b_chat": chat_key}).first() is not None:
                claim = None
        owner, claim_s = claim if claim is not None else (None, 0.0)
        if found is not None:
            if found[1] != "streaming":
                return None  # queued already (a resumed turn's reply)
            # The turn's preview row gets the final text; claimed like a new row, it is sent at once
            # (an edit of the preview, as claim_due would hand it out), not after a delivery pass.
            run(conn, q.FINISH_STREAM, {
                "b_id": found[0], "text": reply.text, "reply_to_id": reply.reply_to_id,
                "status": "claimed" if owner else "pending", "generation": generation, "next_attempt_at": now,
                "attachments": _attachments(reply), "buttons": [list(b) for b in reply.buttons] or None,
                "attempts": 1 if owner else 0, "claimed_by": owner, "claim_until": now + claim_s if owner else 0.0})
            if owner is None:
                return None
            edit_id = preview if preview not in (None, "?") else None  # "?": its fate unknown, sent anew
            return OutboxItem(found[0], 1, dataclasses.replace(reply, edit_id=edit_id, resume_from=0))
        result = run(conn, q.INSERT_OUTBOX, {
            "idempotency_key": reply.idempotency_key, "session_id": session_id, "session_key": session_key,
            "chat_key": chat_key, "generation": generation, "address": a.to_dict(), "text": reply.text,
            "reply_to_id": reply.reply_to_id, "status": "claimed" if owner else "pending",
            "attempts": 1 if owner else 0, "buttons": [list(b) for b in reply.buttons] or None,
            "next_attempt_at": now, "claim_until": now + claim_s if owner else 0.0, "claimed_by": owner,
            "created_at": now, "attachments": _attachments(reply),
        })
        if owner is None:
            return None
        return OutboxItem(int(result.inserted_primary_key[0]), 1, reply)

    # -- streamed previews -------------------------------------------------------------------
    @retry_locked
    def start_stream(self, reply: OutboundMessage, session_id: str | None, session_key: str | None,
                     generation: int) -> StreamStart | None:
        """Before a streamed reply's first message (a preview, a plan), in one write transaction:
        ``None`` while another reply to the chat is unsettled (the message would overtake it: try
        again later); otherwise the reply's ``streaming`` outbox row, created on first use (a
        resumed turn finds its own), and what to do with it (``StreamStart``). A row the message
        is to be sent for holds ``"?"`` as its preview id once this returns: a crash during the send
        leaves it unknown, never resent."""
        with write_tx(self.engine) as conn:
            return self._start_stream_in(conn, StreamRequest(reply, session_id, session_key, generation))

    @retry_locked
    def start_streams(self, requests: list[StreamRequest]) -> list[StreamStart | None]:
        """``start_stream`` for several replies in one write transaction, in order (``GroupCommit``:
        the previews of a burst's streamed replies)."""
        with write_tx(self.engine) as conn:
            return [self._start_stream_in(conn, request) for request in requests]

    def start_stream_request(self, request: StreamRequest) -> StreamStart | None:
        """``start_stream`` of one ``StreamRequest`` (``GroupCommit``'s single item)."""
        return self.start_stream(*request)

    @staticmethod
    def _start_stream_in(conn: Any, request: StreamRequest) -> StreamStart | None:
        reply, session_id, session_key, generation = request
        a = reply.address
        chat_key, key = _chat_key(a), reply.idempotency_key
        if run(conn, q.UNSETTLED_BEFORE_STREAM, {"b_chat": chat_key, "b_key": key}).first() is not None:
            return None
        row = run(conn, q.STREAM_BY_KEY, {"b_key": key}).first()
        if row is None:
            now = time.time()
            result = run(conn, q.INSERT_OUTBOX, {
                "idempotency_key": key, "session_id": session_id, "session_key": session_key,
                "chat_key": chat_key, "generation": generation, "address": a.to_dict(), "text": reply.text,
                "reply_to_id": reply.reply_to_id, "status": "streaming", "attempts": 0, "next_attempt_at": now,
                "claim_until": 0.0, "created_at": now, "preview_id": "?"})
            return StreamStart(int(result.inserted_primary_key[0]), True, None)
        if row.status != "streaming" or row.preview_id == "?":
            return StreamStart(row.id, False, None)  # final already, or a first send's fate unknown
        if row.preview_id is not None:
            return StreamStart(row.id, False, row.preview_id)
        run(conn, q.SET_PREVIEW, {"b_id": row.id, "b_preview": "?"})
        return StreamStart(row.id, True, None)

    @retry_locked
    def set_preview(self, outbox_id: int, preview_id: str | None) -> bool:
        """Records the preview message id (the id right after its send, ``"?"`` when the send's
        outcome is unknown, ``None`` when it certainly failed) while the row is still ``streaming``."""
        with write_tx(self.engine) as conn:
            return self._set_preview_in(conn, (outbox_id, preview_id))

    @retry_locked
    def set_previews(self, previews: list[tuple[int, str | None]]) -> list[bool]:
        """``set_preview`` for several ``(outbox_id, preview_id)`` in one write transaction, in order
        (``GroupCommit``); per row whether it was still ``streaming``."""
        with write_tx(self.engine) as conn:
            return [self._set_preview_in(conn, preview) for preview in previews]

    def set_preview_of(self, preview: tuple[int, str | None]) -> bool:
        """``set_preview`` of one ``(outbox_id, preview_id)`` (``GroupCommit``'s single item)."""
        return self.set_preview(*preview)

    @staticmethod
    def _set_preview_in(conn: Any, preview: tuple[int, str | None]) -> bool:
        outbox_id, preview_id = preview
        return bool(run(conn, q.SET_PREVIEW, {"b_id": outbox_id, "b_preview": preview_id}).rowcount == 1)

    def claim_outbox(self, owner: str, limit: int, claim_s: float) -> list[OutboxItem]:
        """The rows ``claim_due`` claims."""
        return self.claim_due(owner, limit, claim_s).items

    @retry_locked
    def claim_due(self, owner: str, limit: int, claim_s: float) -> ClaimedOutbox:
        """Claims due outbox rows, oldest first, at most one per chat: a row waits while an earlier
        row of its chat is unsettled (chat order; no call to a chat during its retry wait).

        Rows whose lane generation moved on (``/stop``, interrupt) become ``cancelled`` instead.
        A row left ``sending`` by an owner whose claim expired is reclaimed as ``unconfirmed``.
        Claimed rows are ``claimed`` (``sending`` during a part's API call, see ``mark_sending``)
        until ``mark_sent``/``mark_retry``/``mark_failed``. ``more`` tells the caller to claim
        again once these are settled (see ``ClaimedOutbox``).
        """
        now = time.time()
        items: list[OutboxItem] = []
        with write_tx(self.engine) as conn:
            while True:
                rows = run(conn, q.DUE_OUTBOX, {"b_now": now, "b_limit": limit}).all()
                stale = [r.id for r in rows if r.lane_generation is not None and r.lane_generation > r.generation]
                if not stale:
                    break
                # Replies of stopped turns are never sent; rows behind them may now go: select again.
                conn.execute(update(_outbox).where(_outbox.c.id.in_(stale))
                             .values(status="cancelled", error="turn stopped before delivery"))
            for row in rows:
                claimed = run(conn, q.CLAIM_OUTBOX_ROW, {"b_id": row.id, "b_now": now, "b_owner": owner,
                                                            "b_until": now + claim_s,
                                                            "b_attempts": row.attempts + 1}).rowcount
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
                                edit_id=row.preview_id if row.preview_id not in (None, "?") else None,
                                buttons=tuple((str(b[0]), str(b[1])) for b in row.buttons or ()),
                                attachments=tuple(OutboundAttachment.from_dict(a) for a in row.attachments or ()),
                            ),
                            sent_ids,
                            unconfirmed=row.status == "sending",
                        )
                    )
            more = len(rows) >= limit or (bool(items) and run(conn,
                q.PENDING_IN_CHATS, {"b_chats": sorted({_chat_key(i.message.address) for i in items})}).first()
                is not None)
        return ClaimedOutbox(items, more)

    @retry_locked
    def mark_sent(self, outbox_id: int, owner: str, platform_message_ids: Sequence[str], status: str = "sent",
                  note: str | None = None) -> bool:
        """Settles a delivered row (``status`` ``unconfirmed`` when a part in flight at a crash was
        skipped rather than risk sending it twice). Like every ``mark_*``, it writes only while
        ``owner`` still holds the claim and returns whether it did (fencing a stale sender)."""
        return self._settle(sent_mark(outbox_id, owner, platform_message_ids, status, note))

    @retry_locked
    def mark_sending(self, outbox_id: int, owner: str, platform_message_ids: Sequence[str], claim_s: float) -> bool:
        """Marks that a part's API call is about to start, with the ids of the parts delivered before
        it: from now until ``mark_progress``, the next part's ``mark_sending`` or ``mark_sent``, a
        crash leaves this part unconfirmed (a retry skips it rather than risk sending it twice)."""
        return self._settle(sending_mark(outbox_id, owner, platform_message_ids, claim_s))

    @retry_locked
    def mark_progress(self, outbox_id: int, owner: str, platform_message_ids: Sequence[str], claim_s: float) -> bool:
        """Records the parts of a reply with files delivered so far and extends the claim (before a
        file's upload, which may take long; text parts are recorded by the next ``mark_sending``)."""
        return self._settle(progress_mark(outbox_id, owner, platform_message_ids, claim_s))

    @retry_locked
    def mark_retry(self, outbox_id: int, owner: str, next_attempt_at: float, error: str,
                   sent_ids: Sequence[str]) -> bool:
        """Schedules another attempt, keeping the ids of parts already delivered."""
        return self._settle(retry_mark(outbox_id, owner, next_attempt_at, error, sent_ids))

    @retry_locked
    def mark_failed(self, outbox_id: int, owner: str, error: str, sent_ids: Sequence[str]) -> bool:
        return self._settle(failed_mark(outbox_id, owner, error, sent_ids))

    @retry_locked
    def settle(self, mark: Mark) -> bool:
        """Writes one mark (``sending_mark``, ``sent_mark``...: what ``mark_*`` write) in a transaction
        of its own; whether ``owner`` still held the claim."""
        return self._settle(mark)

    @retry_locked
    def settle_many(self, marks: list[Mark]) -> list[bool]:
        """Writes several rows' marks in one transaction, in order (``GroupCommit``: the delivery
        marks of a burst); per mark whether its owner still held the claim."""
        with write_tx(self.engine) as conn:
            return [self._settle_in(conn, mark) for mark in marks]

    def _settle(self, mark: Mark) -> bool:
        with write_tx(self.engine) as conn:
            return self._settle_in(conn, mark)

    @staticmethod
    def _settle_in(conn: Connection, mark: Mark) -> bool:
        outbox_id, owner, values = mark
        result = run(conn, q.SETTLE_OUTBOX, {"b_id": outbox_id, "b_owner": owner, **values})
        if result.rowcount == 1 and values.get("status") in SETTLED:
            # A scheduled report's run is settled with its answer, in the same transaction:
            # "delivered" (with the platform's message ids) only once the platform returned them.
            run(conn, q.SETTLE_JOB_RUN, {"b_id": outbox_id, "b_status": values["status"],
                                            "b_ids": values.get("platform_message_ids"),
                                            "b_error": values.get("error"), "b_now": time.time()})
        return bool(result.rowcount == 1)

    def outbox_rows(self) -> list[dict[str, Any]]:
        """All outbox rows as dicts (tests and admin)."""
        with read_tx(self.engine) as conn:
            return [dict(r._mapping) for r in conn.execute(select(_outbox).order_by(_outbox.c.id)).all()]

    def outbox_counts(self) -> dict[str, int]:
        """Number of outbox rows by status (metrics)."""
        with read_tx(self.engine) as conn:
            rows = conn.execute(select(_outbox.c.status, func.count()).group_by(_outbox.c.status)).all()
        return {status: count for status, count in rows}

    def purge_all(self) -> None:
        """Deletes every row (tests only)."""
        with write_tx(self.engine) as conn:
            for table in reversed(Base.metadata.sorted_tables):
                if table.name != "alembic_version":
                    conn.execute(delete(table))
