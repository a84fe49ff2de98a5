"""Who uses which blob: the ``attachments`` table, and deleting files (retention, a user's
``/forget_files``, a deleted session) without breaking a blob someone else still uses.

Blobs are content-addressed, so two messages with the same bytes (one meme in two chats) share
one blob. Each use is one ``attachments`` row; deleting removes rows first, then every blob no
row refers to any more (``MediaIndex.collect``), and the copies of a document or audio file
saved into its session's workspace (``uploads/``) once no row of that session uses those bytes
(``forget_saved``). The transcript keeps its references: a message whose file was deleted is
rendered as "no longer stored".
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, delete, func, insert, select, update

from gateway.core.ports import BlobStore
from gateway.store.db import read_tx, write_tx
from gateway.store.models import AttachmentRow, table
from gateway.store.sql import retry_locked

log = logging.getLogger("gateway.media")

_rows = table(AttachmentRow)


@dataclass(frozen=True, slots=True)
class Use:
    """One use of a blob: ``role`` is ``original`` | ``rendition`` | ``outbound``."""

    sha256: str
    kind: str
    mime_type: str
    size: int
    name: str | None = None
    role: str = "original"


@dataclass(frozen=True, slots=True)
class Forgotten:
    """What a deletion removed: ``files`` (the files as sent, renditions not counted), ``blobs``
    deleted (renditions included), their ``bytes``."""

    files: int
    blobs: int
    bytes: int


def move_user_files(conn: Any, from_user: str, to_user: str) -> int:
    """Gives every file ``from_user`` sent to ``to_user``, inside the caller's transaction: ``/link``
    joins two users into one, and files follow the account that joined (``/files`` counts them,
    ``/forget_files`` deletes them). Returns the number of ``attachments`` rows moved."""
    return int(conn.execute(update(_rows).where(_rows.c.owner_user_id == from_user)
                            .values(owner_user_id=to_user)).rowcount or 0)


@dataclass(frozen=True, slots=True)
class Dropped:
    """A file sent in session ``session_id`` that no row of that session uses any more (its copy in
    the session's workspace, if one was saved, goes too): ``sha256``, ``kind``, ``mime_type``, ``name``
    as its ``attachments`` row had them."""

    session_id: str
    sha256: str
    kind: str
    mime_type: str
    name: str | None


class MediaIndex:
    """The ``attachments`` SQL on ``engine``; ``blobs`` is where unreferenced bytes are deleted;
    ``forget_saved(dropped)`` deletes the workspace copies of files no row of their session uses
    any more (``ContentReader.forget_saved``; ``None``: nothing is saved into workspaces)."""

    def __init__(self, engine: Engine, blobs: BlobStore,
                 forget_saved: Callable[[Sequence[Dropped]], int] | None = None) -> None:
        self.engine = engine
        self.blobs = blobs
        self.forget_saved = forget_saved

    @retry_locked
    def record(self, uses: Sequence[Use], *, session_id: str | None, owner_user_id: str | None,
               turn_id: str | None) -> None:
        """Adds one row per use (a turn run again after a crash adds no second row for a blob it
        already recorded in that turn)."""
        if not uses:
            return
        now = time.time()
        with write_tx(self.engine) as conn:
            known = set()
            if turn_id is not None:
                known = {(r.sha256, r.role) for r in conn.execute(
                    select(_rows.c.sha256, _rows.c.role).where(_rows.c.turn_id == turn_id,
                                                               _rows.c.session_id == session_id))}
            fresh = [u for u in uses if (u.sha256, u.role) not in known]
            if fresh:
                conn.execute(insert(_rows), [
                    {"sha256": u.sha256, "session_id": session_id, "owner_user_id": owner_user_id,
                     "turn_id": turn_id, "role": u.role, "kind": u.kind, "mime_type": u.mime_type[:255],
                     "size": u.size, "name": (u.name or None) and u.name[:255], "created_at": now}
                    for u in fresh])

    def count(self, *, owner_user_id: str | None = None, session_id: str | None = None) -> tuple[int, int]:
        """``(files, bytes)`` of original uploads of a user or a session (what ``/forget_files`` would delete)."""
        query = select(func.count(), func.coalesce(func.sum(_rows.c.size), 0)).where(_rows.c.role == "original")
        if owner_user_id is not None:
            query = query.where(_rows.c.owner_user_id == owner_user_id)
        if session_id is not None:
            query = query.where(_rows.c.session_id == session_id)
        with read_tx(self.engine) as conn:
            files, size = conn.execute(query).one()
        return int(files), int(size)

    def forget_user(self, user_id: str) -> Forgotten:
        """Deletes every file ``user_id`` sent (originals and renditions), in every session."""
        return self._forget(_rows.c.owner_user_id == user_id)

    def forget_session(self, session_id: str) -> Forgotten:
        """Deletes every file of one session (call it when the session is deleted)."""
        return self._forget(_rows.c.session_id == session_id)

    def expire(self, older_than_s: float, now: float | None = None) -> Forgotten:
        """Deletes files recorded more than ``older_than_s`` seconds ago (``media.retention_days``)."""
        return self._forget(_rows.c.created_at < (now if now is not None else time.time()) - older_than_s)

    @retry_locked
    def _delete_rows(self, where: Any) -> tuple[int, list[str], int, list[Dropped]]:
        with write_tx(self.engine) as conn:
            found = conn.execute(select(_rows.c.sha256, _rows.c.size, _rows.c.role, _rows.c.session_id,
                                        _rows.c.kind, _rows.c.mime_type, _rows.c.name).where(where)).all()
            if not found:
                return 0, [], 0, []
            conn.execute(delete(_rows).where(where))
            shas = sorted({r.sha256 for r in found})
            left = conn.execute(select(_rows.c.sha256, _rows.c.session_id).where(_rows.c.sha256.in_(shas))
                                .distinct()).all()
        still = {r.sha256 for r in left}
        used = {(r.session_id, r.sha256) for r in left}  # the same bytes sent again in that session
        dropped = {(r.session_id, r.sha256): Dropped(r.session_id, r.sha256, r.kind, r.mime_type, r.name)
                   for r in found if r.role == "original" and r.session_id and (r.session_id, r.sha256) not in used}
        gone = [s for s in shas if s not in still]
        sizes = {r.sha256: int(r.size) for r in found}
        return sum(1 for r in found if r.role != "rendition"), gone, sum(sizes[s] for s in gone), list(dropped.values())

    def _forget(self, where: Any) -> Forgotten:
        files, unreferenced, size, dropped = self._delete_rows(where)
        removed = self.collect(unreferenced)
        if dropped and self.forget_saved is not None:
            try:
                self.forget_saved(dropped)
            except OSError as exc:  # the blobs are gone; the copies are tried again by nobody: say so
                log.warning("could not delete %d file(s) saved in workspaces: %s", len(dropped), exc)
        return Forgotten(files, removed, size if removed else 0)

    def collect_unreferenced(self, older_than_s: float, now: float | None = None, chunk: int = 500) -> int:
        """Deletes the blobs no row refers to that were last stored more than ``older_than_s``
        seconds before ``now`` (``media.unreferenced_hours``): a web upload never sent with a
        message, a file stored by a turn that crashed before recording its use. A blob used or
        stored again meanwhile is kept. Returns how many were deleted."""
        cutoff = (now if now is not None else time.time()) - older_than_s
        stored_before = getattr(self.blobs, "stored_before", None)
        delete_blobs = getattr(self.blobs, "delete", None)
        if stored_before is None or delete_blobs is None:
            return 0
        removed = 0
        candidates = iter(stored_before(cutoff))
        while batch := list(itertools.islice(candidates, chunk)):
            with read_tx(self.engine) as conn:
                used = set(conn.execute(select(_rows.c.sha256).where(_rows.c.sha256.in_(batch)).distinct()).scalars())
            removed += int(delete_blobs([s for s in batch if s not in used], stored_before=cutoff))
        return removed

    def collect(self, shas: Iterable[str]) -> int:
        """Deletes those of ``shas`` that no row refers to (a use recorded meanwhile keeps its blob)."""
        shas = list(shas)
        if not shas:
            return 0
        with read_tx(self.engine) as conn:
            used = {r[0] for r in conn.execute(select(_rows.c.sha256).where(_rows.c.sha256.in_(shas)).distinct())}
        delete_blobs = getattr(self.blobs, "delete", None)
        return int(delete_blobs([s for s in shas if s not in used])) if delete_blobs else 0
