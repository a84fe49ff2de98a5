"""``OutboxStore``: the ``outbox`` table's part of ``Store``: a turn's replies queued (``_queue``,
for ``Store.finish_turn``), streamed previews' rows (``start_stream``, ``set_preview``), delivery's
claims (``claim_due``) and marks (``mark_*``, ``settle``).

Calls block, as every ``Store`` call: worker threads, the DB pool, or ``write_now`` on the loop.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from sqlalchemy import Connection, Engine, func, select, update

from gateway.core.types import ChatAddress, OutboundAttachment, OutboundMessage
from gateway.store import prepared as q
from gateway.store.db import read_tx, write_one, write_tx
from gateway.store.fast import execute as run
from gateway.store.marks import Mark, failed_mark, progress_mark, retry_mark, sending_mark, sent_mark
from gateway.store.models import OutboxRow, table
from gateway.store.retries import retry_locked

_outbox = table(OutboxRow)

SETTLED = frozenset({"sent", "unconfirmed", "failed"})
"""Final outbox states; a scheduled report's run takes its outbox row's final state."""


def chat_key_of(address: ChatAddress) -> str:
    """``platform:tenant:chat_id``: the ``outbox.chat_key`` (per-chat order)."""
    return f"{address.platform}:{address.tenant}:{address.chat_id}"


def shares_chat(session_key: str) -> bool:
    """Whether lane ``session_key`` may share its chat with other lanes: every group lane may (a
    thread's or a member's conversation, and the whole group's beside its threads: a forum's
    General topic has no thread id, its topics do); a DM's lane (``dm:``) is its chat's only one."""
    return not session_key.startswith("dm:")


def _attachments(reply: OutboundMessage) -> list[dict[str, Any]] | None:
    """The outbox row's ``attachments`` column for ``reply`` (``None`` without files)."""
    return [a.to_dict() for a in reply.attachments] or None


def _buttons(reply: OutboundMessage) -> list[list[str]] | None:
    """The outbox row's ``buttons`` column for ``reply`` (``[label, data]`` pairs; ``None`` without)."""
    return [list(b) for b in reply.buttons] or None


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


class OutboxStore:
    """The outbox part of ``Store`` (module doc); ``Store`` inherits it and provides ``engine``."""

    engine: Engine

    @staticmethod
    def _queue(conn: Any, reply: OutboundMessage, session_id: str | None, session_key: str | None,
               generation: int, now: float, claim: tuple[str, float] | None = None,
               streamed: bool = True) -> OutboxItem | None:
        """Inserts an outbox row unless its idempotency key is already queued. A ``streaming`` row
        of the same key (the turn's preview) gets the final text instead. With ``claim`` (see
        ``finish_turn``) the new row, or the streaming one, goes in *claimed* when its chat has no
        unsettled row and its lane's generation is still ``generation``, and is returned (else
        *pending*). ``streamed=False``: no preview took the reply's row in this run of the turn, so
        on PostgreSQL the row is first inserted if its key is not queued, in one statement
        (``QUEUE_NEW_REPLY``), and looked for only when it is (a resumed turn's)."""
        a = reply.address
        chat_key = chat_key_of(a)
        if claim is not None and session_key is not None and conn.dialect.name == "postgresql" \
                and shares_chat(session_key):
            # Two lanes of one chat (its threads, per-member sessions, the whole group) finishing at
            # once would each see no unsettled row (READ COMMITTED) and both claim: the chat's lock,
            # held to commit, makes the second wait and then see the first (statements after it
            # take a new snapshot).
            run(conn, q.LOCK_CHAT, {"b_chat": chat_key})
        if claim is not None and session_key is not None and not streamed and conn.dialect.name == "postgresql":
            row = run(conn, q.QUEUE_NEW_REPLY, {
                "idempotency_key": reply.idempotency_key, "session_id": session_id, "session_key": session_key,
                "chat_key": chat_key, "generation": generation, "address": a.to_dict(), "text": reply.text,
                "reply_to_id": reply.reply_to_id, "buttons": _buttons(reply), "next_attempt_at": now,
                "created_at": now, "attachments": _attachments(reply), "b_owner": claim[0],
                "b_until": now + claim[1]}).first()
            if row is not None:
                return OutboxItem(int(row.id), 1, reply) if row.status == "claimed" else None
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
                "attachments": _attachments(reply), "buttons": _buttons(reply),
                "attempts": 1 if owner else 0, "claimed_by": owner, "claim_until": now + claim_s if owner else 0.0})
            if owner is None:
                return None
            edit_id = preview if preview not in (None, "?") else None  # "?": its fate unknown, sent anew
            return OutboxItem(found[0], 1, dataclasses.replace(reply, edit_id=edit_id, resume_from=0))
        result = run(conn, q.INSERT_OUTBOX, {
            "idempotency_key": reply.idempotency_key, "session_id": session_id, "session_key": session_key,
            "chat_key": chat_key, "generation": generation, "address": a.to_dict(), "text": reply.text,
            "reply_to_id": reply.reply_to_id, "status": "claimed" if owner else "pending",
            "attempts": 1 if owner else 0, "buttons": _buttons(reply),
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
        chat_key, key = chat_key_of(a), reply.idempotency_key
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
        while True:
            # Replies of stopped turns are never sent: cancelled in a transaction of their own, one
            # row at a time in id order, committed before any row is claimed; rows behind them may
            # then go (selected again). Each transaction below locks its rows in id order, so two
            # instances never hold a row the other waits for (a cancel before the claims in one
            # transaction did: A cancelled r9 then claimed r0 while B, whose snapshot predated
            # the /stop, held r0 and claimed r9: PostgreSQL's deadlock detected).
            with read_tx(self.engine) as conn:
                rows = run(conn, q.DUE_OUTBOX, {"b_now": now, "b_limit": limit}).all()
            stale = sorted(r.id for r in rows if r.lane_generation is not None and r.lane_generation > r.generation)
            if not stale:
                break
            with write_tx(self.engine) as conn:
                for outbox_id in stale:
                    conn.execute(update(_outbox).where(_outbox.c.id == outbox_id)
                                 .values(status="cancelled", error="turn stopped before delivery"))
        if not rows:
            return ClaimedOutbox([], False)  # nothing due: no write transaction (SQLite's writer stays free)
        with write_tx(self.engine) as conn:
            for row in rows:  # in id order (DUE_OUTBOX's)
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
                q.PENDING_IN_CHATS, {"b_chats": sorted({chat_key_of(i.message.address) for i in items})}).first()
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
        # One statement (``_settle_in``) for a mark that does not settle the row, and for any on
        # PostgreSQL: there one round trip (``write_one``), e.g. the *sending* mark before every
        # platform call (three with BEGIN and COMMIT), and the *sent* mark (four).
        one = self.engine.dialect.name == "postgresql" or mark[2].get("status") not in SETTLED
        with (write_one if one else write_tx)(self.engine) as conn:
            return self._settle_in(conn, mark)

    @staticmethod
    def _settle_in(conn: Connection, mark: Mark) -> bool:
        outbox_id, owner, values = mark
        if values.get("status") in SETTLED and conn.dialect.name == "postgresql":
            # the row and its job run (if any) in one statement (q.settle_with_job_run)
            return bool(run(conn, q.settle_with_job_run(frozenset(values)),
                            {"b_id": outbox_id, "b_owner": owner, "b_now": time.time(), **values}).scalar())
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
