"""``Approvals``: pending tool approvals in the database (issue 9), shared by all instances.

A waiting turn creates a row and polls it; ``/approve ID`` / ``/deny ID`` on any instance decide
it. Decisions are conditional updates (``status == 'pending'``), so the first decision wins and a
decision after expiry changes nothing.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass

from sqlalchemy import Engine, insert, select, update

from gateway.core.i18n import _
from gateway.core.types import OutboundMessage
from gateway.store.db import read_tx, write_tx
from gateway.store.models import ApprovalRow, table
from gateway.store.sql import Store, retry_locked

_approvals = table(ApprovalRow)
ID_ALPHABET = "abcdefghjkmnpqrstuvwxyz23456789"


@dataclass(frozen=True, slots=True)
class Approval:
    id: str
    session_key: str
    requested_by: str | None
    tool: str
    status: str


@dataclass(frozen=True, slots=True)
class CallApproval:
    """A tool call's request: its id, status and ``expires_at`` (epoch s)."""

    id: str
    status: str
    expires_at: float


class Approvals:
    """Approval rows on one engine. Every call is a short transaction (worker threads, or the
    main loop via ``Gateway.run_db``)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    @retry_locked
    def request(self, *, session_key: str, turn_id: str, call_id: str, requested_by: str | None, tool: str,
                summary: str, timeout_s: float, prompt: OutboundMessage | None = None,
                prompt_text: str = "") -> str:
        """Creates a pending approval (and queues ``prompt`` to the chat in the same transaction,
        ``{id}`` in ``prompt_text`` replaced by the id); returns the approval id (6 characters)."""
        approval_id = "".join(secrets.choice(ID_ALPHABET) for _i in range(6))
        now = time.time()
        with write_tx(self.engine) as conn:
            conn.execute(insert(_approvals).values(
                id=approval_id, session_key=session_key, turn_id=turn_id, call_id=call_id,
                requested_by=requested_by, tool=tool, summary=summary, status="pending",
                created_at=now, expires_at=now + timeout_s))
            if prompt is not None:
                text = prompt_text.replace("{id}", approval_id)
                message = OutboundMessage(prompt.address, text, idempotency_key=f"approval:{approval_id}",
                                          reply_to_id=prompt.reply_to_id,
                                          buttons=((_("✅ Approve"), f"/approve {approval_id}"),
                                                   (_("❌ Deny"), f"/deny {approval_id}")))
                # No session key: a prompt is never cancelled by a lane generation (it must reach the chat).
                Store._queue(conn, message, None, None, 0, now)
        return approval_id

    def of_call(self, session_key: str, turn_id: str, call_id: str) -> CallApproval | None:
        """The newest request made for the tool call ``call_id`` of ``turn_id`` (a resumed turn
        looks for the request its interrupted try made), or ``None`` when it made none."""
        with read_tx(self.engine) as conn:
            row = conn.execute(select(_approvals.c.id, _approvals.c.status, _approvals.c.expires_at).where(
                _approvals.c.session_key == session_key, _approvals.c.turn_id == turn_id,
                _approvals.c.call_id == call_id).order_by(_approvals.c.created_at.desc()).limit(1)).first()
        return CallApproval(row.id, row.status, row.expires_at) if row is not None else None

    def status(self, approval_id: str) -> str | None:
        with read_tx(self.engine) as conn:
            return conn.execute(select(_approvals.c.status).where(_approvals.c.id == approval_id)).scalar()

    def get(self, approval_id: str) -> Approval | None:
        with read_tx(self.engine) as conn:
            row = conn.execute(select(_approvals).where(_approvals.c.id == approval_id.strip().lower())).first()
        if row is None:
            return None
        return Approval(row.id, row.session_key, row.requested_by, row.tool, row.status)

    @retry_locked
    def decide(self, approval_id: str, status: str, decided_by: str | None) -> bool:
        """Sets ``status`` (``approved`` | ``denied`` | ``expired`` | ``cancelled``) if the row is
        still pending and, for a person's decision, not expired; returns whether it changed."""
        now = time.time()
        query = update(_approvals).where(_approvals.c.id == approval_id, _approvals.c.status == "pending")
        if status in ("approved", "denied"):
            query = query.where(_approvals.c.expires_at > now)
        with write_tx(self.engine) as conn:
            changed = conn.execute(query.values(status=status, decided_by=decided_by, decided_at=now)).rowcount
        return bool(changed)
