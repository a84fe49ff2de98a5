"""``MemoryStore``: reads and writes of the ``memories`` table (issue 10), each a short transaction.

Every read is filtered by owner, so one user's (or group's) entries never come back for another.
Keyword search uses the database's full-text engine over ``search_text`` (the entry's text with
each Chinese or Japanese character a word of its own: ``gateway.memory.terms.index_text``, written
here with the text): SQLite FTS5 (``bm25`` order) or PostgreSQL ``to_tsvector('english', ...) @@
to_tsquery`` (GIN index; ``ts_rank`` order, shorter entries first on ties); both stem English words.
Calls block: run them on worker threads.

Forgetting never deletes the row: it is emptied (text, evidence, embedding) and marked forgotten
(``superseded_by`` = its own id), so an id is never given to another entry (SQLite reuses the
highest rowid after a delete: a ``/forget`` acting on an old ``/memory`` list would hit a newer
entry). Forgotten rows are invisible to every read here.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Engine, bindparam, insert, or_, select, text, update

from gateway.memory.terms import index_text
from gateway.store.db import read_one, read_tx, write_tx
from gateway.store.fast import execute as run
from gateway.store.models import MemoryRow, table
from gateway.store.sql import retry_locked

_memories = table(MemoryRow)
_KEPT = or_(_memories.c.superseded_by.is_(None), _memories.c.superseded_by != _memories.c.id)
"""Rows that are not forgotten (valid or superseded entries)."""
MAX_TEXT_CHARS = 500
"""Longest entry text: a conclusion or constraint in a sentence or two, never a transcript (a
longer one could never fit a memory block's token budget)."""
TYPES = ("preference", "fact", "decision", "episode")
SOURCES = ("user_explicit", "task", "import")

# Full-text search, one statement per dialect (built once: recall runs before every turn).
# The PostgreSQL expression is the GIN index's (migration 0806): a row without search_text yet (an
# older release wrote it) is found by its text until ``analyse_missing`` runs.
_PG_VECTOR = "to_tsvector('english', coalesce(search_text, text))"
_PG_SEARCH = text(
    f"SELECT {', '.join(f'memories.{c.name}' for c in _memories.c)} "
    "FROM memories WHERE owner = :owner AND superseded_by IS NULL "
    f"AND {_PG_VECTOR} @@ to_tsquery('english', :query) "
    f"ORDER BY ts_rank({_PG_VECTOR}, to_tsquery('english', :query), 1) DESC, id DESC "
    "LIMIT :limit").columns(*_memories.c)  # typed columns: planned as the SQLite one
_SQLITE_SEARCH = text(
    f"SELECT {', '.join(f'memories.{c.name}' for c in _memories.c)} "
    "FROM memories_fts JOIN memories ON memories.id = memories_fts.rowid "
    "WHERE memories_fts MATCH :query AND memories.owner = :owner "
    "AND memories.superseded_by IS NULL ORDER BY bm25(memories_fts), memories.id DESC "
    "LIMIT :limit").columns(*_memories.c)  # typed columns: JSON decoded, and planned (gateway.store.fast)


@dataclass(frozen=True, slots=True)
class Memory:
    """A stored entry (see ``MemoryRow`` for the fields' meaning)."""

    id: int
    owner: str
    text: str
    type: str
    source: str
    confidence: float
    created_at: float
    last_used_at: float | None
    hits: int
    weight: float
    superseded_by: int | None
    evidence: list[Any]
    embedding: list[float] | None = field(default=None, repr=False)


@dataclass(frozen=True, slots=True)
class NewMemory:
    """An entry to store. Raises ``ValueError`` for an unknown ``type`` or ``source``, empty text,
    or text longer than ``MAX_TEXT_CHARS`` (stripped)."""

    owner: str
    text: str
    type: str
    source: str
    confidence: float = 1.0
    weight: float = 1.0
    evidence: tuple[Any, ...] = ()
    embedding: list[float] | None = None

    def __post_init__(self) -> None:
        if self.type not in TYPES:
            raise ValueError(f"memory type must be one of {', '.join(TYPES)}, not {self.type!r}")
        if self.source not in SOURCES:
            raise ValueError(f"memory source must be one of {', '.join(SOURCES)}, not {self.source!r}")
        if not self.text.strip():
            raise ValueError("a memory needs text")
        if len(self.text.strip()) > MAX_TEXT_CHARS:
            raise ValueError(too_long(self.text))


def user_owner(user_id: str) -> str:
    """The owner of a user's own memory (their DMs, on every linked account): ``user:<user id>``."""
    return f"user:{user_id}"


def member_suffix(user_id: str) -> str:
    """How the owner of a user's memory in a group ends with ``sessions.group_scope = "user"``
    (``group:<chat key>:user:<user id>``)."""
    return f":user:{user_id}"


def move_user_entries(conn: Any, from_user: str, to_user: str) -> int:
    """Gives every entry of ``from_user`` (their own and, with per-member group scope, theirs in
    each group) to ``to_user``, inside the caller's transaction: ``/link`` joins two users into one,
    and memory follows the account that joined. Returns the number of entries moved."""
    moved = conn.execute(update(_memories).where(_memories.c.owner == user_owner(from_user))
                         .values(owner=user_owner(to_user))).rowcount
    suffix = member_suffix(from_user)
    owners = conn.execute(select(_memories.c.owner).distinct().where(
        _memories.c.owner.like("group:%"), _memories.c.owner.endswith(suffix, autoescape=True))).scalars().all()
    for owner in owners:
        moved += conn.execute(update(_memories).where(_memories.c.owner == owner)
                              .values(owner=owner[:-len(suffix)] + member_suffix(to_user))).rowcount
    return int(moved)


def too_long(text: str) -> str:
    """Why ``text`` is refused as an entry (longer than ``MAX_TEXT_CHARS``)."""
    return (f"a memory entry holds at most {MAX_TEXT_CHARS} characters, this one has {len(text.strip()):,}: "
            "keep the conclusion in a sentence or two, not the whole text")


def _memory(row: Any) -> Memory:
    return Memory(row.id, row.owner, row.text, row.type, row.source, row.confidence, row.created_at,
                  row.last_used_at, row.hits, row.weight, row.superseded_by, list(row.evidence or []),
                  row.embedding)


class MemoryStore:
    """Memory entries on one engine (SQLite or PostgreSQL)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    @retry_locked
    def add(self, new: NewMemory, supersedes: Sequence[int] = (), now: float | None = None) -> Memory:
        """Stores ``new``; the owner's valid entries among ``supersedes`` get ``superseded_by`` set
        to it in the same transaction (other owners' ids are ignored). Returns the stored entry."""
        now = time.time() if now is None else now
        stored = new.text.strip()
        with write_tx(self.engine) as conn:
            result = conn.execute(insert(_memories).values(
                owner=new.owner, text=stored, search_text=index_text(stored), type=new.type, source=new.source,
                confidence=new.confidence, created_at=now, last_used_at=None, hits=0, weight=new.weight,
                superseded_by=None, evidence=list(new.evidence), embedding=new.embedding))
            memory_id = int(result.inserted_primary_key[0])  # type: ignore[index]
            old = [i for i in supersedes if i != memory_id]
            if old:
                conn.execute(update(_memories).where(_memories.c.id.in_(old), _memories.c.owner == new.owner,
                                                     _memories.c.superseded_by.is_(None))
                             .values(superseded_by=memory_id))
            row = conn.execute(select(_memories).where(_memories.c.id == memory_id)).one()
        return _memory(row)

    def keyword_search(self, owner: str, words: Sequence[str], limit: int = 30) -> list[Memory]:
        """The owner's valid entries matching any of ``words`` (full-text, stemmed), best match
        first. ``words`` are plain words (letters and digits only) or single Chinese / Japanese
        characters (``gateway.memory.terms.words``)."""
        words = [w for w in dict.fromkeys(words) if w.isalnum()]
        if not words:
            return []
        with read_one(self.engine) as conn:  # one statement: one round trip on PostgreSQL
            return self.keyword_search_in(conn, owner, words, limit)

    @staticmethod
    def keyword_search_in(conn: Connection, owner: str, words: Sequence[str], limit: int = 30) -> list[Memory]:
        """``keyword_search`` in the caller's transaction ``conn`` (a turn's lane claim reads its
        memory candidates with its session: ``gateway.bus.turns.TurnRunner.prefetch``)."""
        words = [w for w in dict.fromkeys(words) if w.isalnum()]
        if not words:
            return []
        if conn.dialect.name == "postgresql":
            rows = run(conn, _PG_SEARCH, {"owner": owner, "query": " | ".join(words), "limit": limit}).all()
        else:
            query = " OR ".join(f'"{w}"' for w in words)
            rows = run(conn, _SQLITE_SEARCH, {"owner": owner, "query": query, "limit": limit}).all()
        return [_memory(r) for r in rows]

    def with_embeddings(self, owner: str, limit: int = 2000) -> list[Memory]:
        """The owner's valid entries that have an embedding, newest first (vector candidates)."""
        with read_tx(self.engine) as conn:
            rows = conn.execute(select(_memories).where(
                _memories.c.owner == owner, _memories.c.superseded_by.is_(None), _memories.c.embedding.is_not(None))
                .order_by(_memories.c.id.desc()).limit(limit)).all()
        return [_memory(r) for r in rows]

    def entries(self, owner: str, include_superseded: bool = True) -> list[Memory]:
        """The owner's entries, oldest first (superseded ones too unless told otherwise)."""
        where = [_memories.c.owner == owner, _KEPT]
        if not include_superseded:
            where.append(_memories.c.superseded_by.is_(None))
        with read_tx(self.engine) as conn:
            rows = conn.execute(select(_memories).where(*where).order_by(_memories.c.id)).all()
        return [_memory(r) for r in rows]

    def get(self, owner: str, memory_id: int) -> Memory | None:
        """The owner's entry ``memory_id`` (``None`` for another owner's entry or none at all)."""
        with read_tx(self.engine) as conn:
            row = conn.execute(select(_memories).where(_memories.c.id == memory_id, _memories.c.owner == owner,
                                                       _KEPT)).first()
        return _memory(row) if row is not None else None

    @retry_locked
    def forget(self, owner: str, memory_id: int) -> list[int]:
        """Forgets the owner's entry ``memory_id`` and the older entries it replaced (its supersede
        chain), so forgotten words are gone from history too: their text, evidence and embedding
        are erased and the rows marked forgotten (see the module doc: ids are never reused).
        Returns the forgotten ids (empty when the owner has no such entry)."""
        with write_tx(self.engine) as conn:
            rows = conn.execute(select(_memories.c.id, _memories.c.superseded_by)
                                .where(_memories.c.owner == owner, _KEPT)).all()
            replaced: dict[int, list[int]] = {}
            for row in rows:
                if row.superseded_by is not None:
                    replaced.setdefault(row.superseded_by, []).append(row.id)
            if memory_id not in {row.id for row in rows}:
                return []
            doomed, todo = [], [memory_id]
            while todo:
                current = todo.pop()
                doomed.append(current)
                todo.extend(i for i in replaced.get(current, ()) if i not in doomed)
            conn.execute(update(_memories).where(_memories.c.id.in_(doomed), _memories.c.owner == owner).values(
                text="", search_text="", evidence=[], embedding=None, superseded_by=_memories.c.id, hits=0,
                last_used_at=None))
        return sorted(doomed)

    def analyse_missing(self, batch: int = 1000) -> int:
        """Fills ``search_text`` of the entries that have none: stored before migration ``0806`` or
        by an older release during a rolling upgrade, or cleared because their text changed
        without it (until then PostgreSQL finds them by their text's whole words, SQLite not at
        all). Run at start (``Gateway.start``), ``batch`` rows per short transaction, oldest first.
        Returns how many were filled."""
        filled, after = 0, 0
        while True:
            done, after, more = self._analyse_batch(after, batch)
            filled += done
            if not more:
                return filled

    @retry_locked
    def _analyse_batch(self, after: int, batch: int) -> tuple[int, int, bool]:
        with write_tx(self.engine) as conn:
            rows = conn.execute(select(_memories.c.id, _memories.c.text)
                                .where(_memories.c.search_text.is_(None), _memories.c.id > after)
                                .order_by(_memories.c.id).limit(batch)).all()
            if rows:  # the text is compared again: a row changed meanwhile is left for the next start
                conn.execute(update(_memories).where(_memories.c.id == bindparam("row_id"),
                                                     _memories.c.text == bindparam("read_text"),
                                                     _memories.c.search_text.is_(None))
                             .values(search_text=bindparam("analysed")),
                             [{"row_id": r.id, "read_text": r.text, "analysed": index_text(r.text)} for r in rows])
        return len(rows), rows[-1].id if rows else after, len(rows) == batch

    @retry_locked
    def used(self, ids: Sequence[int], now: float | None = None) -> None:
        """Counts a hit on each entry and restarts its decay clock (an entry injected or recalled)."""
        if not ids:
            return
        with write_tx(self.engine) as conn:
            conn.execute(update(_memories).where(_memories.c.id.in_(list(ids)))
                         .values(hits=_memories.c.hits + 1, last_used_at=time.time() if now is None else now))

    @retry_locked
    def reinforce(self, memory_id: int, weight: float, evidence: Sequence[Any], now: float | None = None) -> None:
        """A fact stated again: the entry's weight becomes ``weight`` and the new evidence is added."""
        with write_tx(self.engine) as conn:
            row = conn.execute(select(_memories.c.evidence).where(_memories.c.id == memory_id)).first()
            if row is None:
                return
            merged = list(dict.fromkeys([*(row.evidence or []), *evidence]))
            conn.execute(update(_memories).where(_memories.c.id == memory_id).values(
                weight=weight, evidence=merged, last_used_at=time.time() if now is None else now))

    @retry_locked
    def supersede(self, owner: str, old_ids: Sequence[int], new_id: int) -> list[int]:
        """Links the owner's valid entries ``old_ids`` to their replacement ``new_id`` (they stay
        stored). Returns the ids linked."""
        old = [i for i in old_ids if i != new_id]
        if not old:
            return []
        with write_tx(self.engine) as conn:
            ids = conn.execute(select(_memories.c.id).where(
                _memories.c.id.in_(old), _memories.c.owner == owner, _memories.c.superseded_by.is_(None))
            ).scalars().all()
            if ids:
                conn.execute(update(_memories).where(_memories.c.id.in_(list(ids))).values(superseded_by=new_id))
        return sorted(ids)

    @retry_locked
    def set_embedding(self, memory_id: int, embedding: list[float]) -> None:
        """Stores the entry's embedding (computed after the entry was stored)."""
        with write_tx(self.engine) as conn:
            conn.execute(update(_memories).where(_memories.c.id == memory_id).values(embedding=embedding))
