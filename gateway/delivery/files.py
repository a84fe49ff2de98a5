"""Files the agent sends back (``send_file``): their durable record and the bytes for the adapters.

When the tool runs, the file's bytes go into the blob store and one ``outbox_files`` row records
the call (session, turn, tool call id) with the file's name, type, size, digest and caption. When
the turn (or scheduled report) finishes, its reply carries those files
(``OutboundMessage.attachments``, copied into the outbox row), so delivery sends exactly the bytes
the tool saw, with the same exactly-once rules as text, even if the workspace file changed or was
deleted meanwhile. A tool call run again after a crash finds its row and records nothing twice.

The adapters read the bytes through ``BlobFiles`` (``gateway.core.ports.FileReader``) right before
each upload; a file the store no longer has (retention) fails that reply's delivery permanently.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from contextvars import ContextVar

from sqlalchemy import Engine, func, insert, select

from gateway.core.errors import BlobMissing
from gateway.core.ports import BlobStore
from gateway.core.types import ChatAddress, OutboundAttachment
from gateway.store.db import read_tx, write_tx
from gateway.store.models import AttachmentRow, OutboxFileRow, table
from gateway.store.sql import retry_locked

_files = table(OutboxFileRow)
_attachments = table(AttachmentRow)

REPLY_TARGET: ContextVar[ChatAddress | None] = ContextVar("reply_target", default=None)
"""Where the running scheduled report is posted (set by ``PushRunner`` around its agent loop);
chat turns are answered where their message came from (``CURRENT_MESSAGE``)."""


class BlobFiles:
    """``gateway.core.ports.FileReader`` on the blob store: reads off the main loop."""

    def __init__(self, blobs: BlobStore) -> None:
        self.blobs = blobs

    async def read(self, sha256: str) -> bytes | None:
        try:
            return await asyncio.to_thread(self.blobs.get, sha256)
        except BlobMissing:
            return None


class OutboxFiles:
    """The ``outbox_files`` SQL: files recorded by ``send_file``, read back per turn."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    @retry_locked
    def record(self, session_id: str, turn_id: str, call_id: str, attachment: OutboundAttachment) -> \
            tuple[OutboundAttachment, bool]:
        """Records the file of one tool call, unless that call recorded one already; returns the
        call's file and whether it is new. The blob is registered as used by the session
        (``attachments`` row, role ``outbound``) in the same transaction, so media retention and
        deleting the session account for it."""
        now = time.time()
        with write_tx(self.engine) as conn:
            row = conn.execute(select(_files).where(_files.c.session_id == session_id, _files.c.turn_id == turn_id,
                                                    _files.c.call_id == call_id)).first()
            if row is not None:
                return _attachment(row), False
            conn.execute(insert(_files).values(session_id=session_id, turn_id=turn_id, call_id=call_id,
                                               created_at=now, **attachment.to_dict()))
            conn.execute(insert(_attachments).values(
                sha256=attachment.sha256, session_id=session_id, owner_user_id=None, turn_id=turn_id, role="outbound",
                kind=attachment.kind, mime_type=attachment.mime_type, size=attachment.size, name=attachment.name,
                created_at=now))
        return attachment, True

    def recorded(self, session_id: str, turn_id: str, call_id: str) -> OutboundAttachment | None:
        """The file one tool call recorded, or ``None``."""
        with read_tx(self.engine) as conn:
            row = conn.execute(select(_files).where(_files.c.session_id == session_id, _files.c.turn_id == turn_id,
                                                    _files.c.call_id == call_id)).first()
        return _attachment(row) if row is not None else None

    def count(self, session_id: str, turn_id: str) -> int:
        """How many files the turn has recorded."""
        with read_tx(self.engine) as conn:
            return int(conn.execute(select(func.count()).select_from(_files).where(
                _files.c.session_id == session_id, _files.c.turn_id == turn_id)).scalar_one())

    def for_turn(self, session_id: str, turn_ids: str | Sequence[str]) -> list[OutboundAttachment]:
        """The files recorded during the turn(s), in the order the tool was called."""
        ids = [turn_ids] if isinstance(turn_ids, str) else list(turn_ids)
        with read_tx(self.engine) as conn:
            rows = conn.execute(select(_files).where(_files.c.session_id == session_id, _files.c.turn_id.in_(ids))
                                .order_by(_files.c.id)).all()
        return [_attachment(r) for r in rows]


def _attachment(row: object) -> OutboundAttachment:
    return OutboundAttachment(kind=row.kind, name=row.name, mime_type=row.mime_type,  # type: ignore[attr-defined]
                              size=int(row.size), sha256=row.sha256,  # type: ignore[attr-defined]
                              caption=row.caption or "", width=row.width, height=row.height)  # type: ignore[attr-defined]


def transcript_refs(attachments: Sequence[OutboundAttachment]) -> list[dict[str, object]]:
    """What the transcript keeps of files sent with a reply (``messages.meta["attachments"]`` of
    the final assistant message): name, kind, type, size, digest and caption; never the bytes."""
    return [{"kind": a.kind, "name": a.name, "mime_type": a.mime_type, "size": a.size, "sha256": a.sha256,
             **({"caption": a.caption} if a.caption else {})} for a in attachments]
