"""The load pipeline (issue 10): four gates from a user's message to the memory block of its turn.

1. **Query**: the user's message, or a retrieval query a model rewrote it into (optional).
2. **Hybrid recall**: the owner's valid entries (``superseded_by IS NULL``) matching the query's
   words in the database's full-text index, plus, when embeddings are configured, the owner's
   entries nearest the query's embedding (cosine computed here, over the owner's entries: no
   vector extension needed). Deduplicated by id.
3. **Rescoring**: similarity (the lexical cosine of stemmed terms, or the embedding cosine rescaled
   above ``vector_floor``, whichever is higher) times a factor from importance (weight decayed
   while unused, hits), freshness and type fit. Entries under ``threshold``, or under ``relative``
   times the best entry's score, are dropped.
4. **Budget**: lines are added best first while the block stays within ``budget_tokens``; an entry
   that does not fit is skipped whole (never cut) and smaller ones after it may still fit.

The block goes into the newest user message (``gateway.bus.context.render_user``), never into the
system prompt, so the request prefix stays byte-identical while the hits change.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import Connection

from agent.tokens import text_tokens
from gateway.memory.store import Memory, MemoryStore
from gateway.memory.terms import similarity, terms, words

BLOCK_HEADER = ("[Long-term memory: notes from earlier conversations, most relevant first. They may be "
                "outdated; this message wins over them.]")

DAY_S = 86_400.0

TYPE_HINTS: dict[str, frozenset[str]] = {
    "preference": frozenset(terms("prefer preference favourite favorite style format always never should "
                                  "love hate enjoy wants likes dislike")),
    "decision": frozenset(terms("decide decision decided agree agreed plan chose choice policy rule")),
    "episode": frozenset(terms("when last time happened yesterday ago did went meeting visit trip")),
}
"""Query words that ask for a certain type of entry (type fit)."""


@dataclass(frozen=True)
class RecallPolicy:
    """Tuning of gates 2-4 (``[memory]`` in the config; the defaults are the documented ones).

    Attributes:
        budget_tokens: most tokens of the whole block (header included; ``agent.tokens`` estimate).
        threshold: least score (0..1) of an injected entry.
        relative: least score as a share of the best entry's score.
        max_entries: most entries in one block.
        candidates: entries fetched per recall path (keyword, vector) before rescoring.
        half_life_days: an unused entry's weight halves every this many days.
        freshness_days: the freshness factor halves every this many days of age.
        vector_floor: an embedding cosine at or below it counts as no similarity.
    """

    budget_tokens: int = 500
    threshold: float = 0.25
    relative: float = 0.7
    max_entries: int = 12
    candidates: int = 50
    half_life_days: float = 30.0
    freshness_days: float = 180.0
    vector_floor: float = 0.3


@dataclass(frozen=True)
class Scored:
    """An entry with its rescoring: ``score`` (0..1, ranks the block) and ``similarity`` (0..1)."""

    memory: Memory
    score: float
    similarity: float


@dataclass(frozen=True)
class Block:
    """The rendered memory block (``""`` when nothing passed) and the ids of its entries, in order."""

    text: str
    ids: tuple[int, ...]


def effective_weight(memory: Memory, now: float, half_life_days: float) -> float:
    """``weight`` halved for every ``half_life_days`` since the entry was last used (or created)."""
    idle_days = max(0.0, now - (memory.last_used_at or memory.created_at)) / DAY_S
    return memory.weight * 0.5 ** (idle_days / half_life_days)


def expected_types(query_terms: set[str]) -> set[str]:
    """Entry types the query asks for (empty: no hint)."""
    return {kind for kind, hints in TYPE_HINTS.items() if query_terms & hints}


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    """Cosine similarity of two vectors (0 when either is all zeros or their lengths differ)."""
    if len(a) != len(b):
        return 0.0
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    norm = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    return dot / norm if norm else 0.0


def rescore(query: str, candidates: Iterable[Memory], now: float, policy: RecallPolicy,
            vector_similarity: dict[int, float] | None = None) -> list[Scored]:
    """Gate 3: scores each candidate and keeps those passing ``threshold`` and ``relative``, best
    first (ties: newer first). ``vector_similarity`` maps entry id -> embedding cosine."""
    q = terms(query)
    wanted = expected_types(q)
    vectors = vector_similarity or {}
    scored: list[Scored] = []
    for memory in candidates:
        sim = similarity(q, terms(memory.text))
        if memory.id in vectors:
            floor = policy.vector_floor
            sim = max(sim, max(0.0, vectors[memory.id] - floor) / (1.0 - floor))
        if sim <= 0.0:
            continue
        importance = 0.7 * min(1.0, effective_weight(memory, now, policy.half_life_days) / 3.0) \
            + 0.3 * min(1.0, math.log1p(memory.hits) / math.log1p(20))
        freshness = 0.5 ** (max(0.0, now - memory.created_at) / DAY_S / policy.freshness_days)
        fit = 1.0 if memory.type in wanted else (0.5 if wanted else 0.75)
        score = sim * (0.6 + 0.2 * importance + 0.1 * freshness + 0.1 * fit)
        scored.append(Scored(memory, score, sim))
    scored.sort(key=lambda s: (-s.score, -s.memory.id))
    if not scored:
        return []
    floor = max(policy.threshold, policy.relative * scored[0].score)
    return [s for s in scored if s.score >= floor][:policy.max_entries]


def line_of(memory: Memory) -> str:
    """One block line: type, date, text and id, e.g. ``- (preference, 2026-11-30) Use metric units. [#12]``."""
    day = datetime.fromtimestamp(memory.created_at, UTC).strftime("%Y-%m-%d")
    return f"- ({memory.type}, {day}) {' '.join(memory.text.split())} [#{memory.id}]"


def fill_budget(scored: Sequence[Scored], budget_tokens: int, header: str = BLOCK_HEADER) -> Block:
    """Gate 4: header plus lines, best first, while the block's tokens stay within
    ``budget_tokens``; a line that does not fit is skipped whole. Empty when no line fits."""
    used = text_tokens(header)
    lines: list[str] = []
    ids: list[int] = []
    for entry in scored:
        line = line_of(entry.memory)
        cost = text_tokens("\n" + line)
        if used + cost > budget_tokens:
            continue
        used += cost
        lines.append(line)
        ids.append(entry.memory.id)
    if not lines:
        return Block("", ())
    return Block("\n".join([header, *lines]), tuple(ids))


Embed = Callable[[list[str]], list[list[float]]]
"""Embeds texts (one vector per text); raises on failure."""


class Recaller:
    """Runs gates 2-4 for one owner against the store.

    Args:
        store: the memory table.
        policy: thresholds and budget.
        embed: the embeddings client (``None``: keyword recall only).
    """

    def __init__(self, store: MemoryStore, policy: RecallPolicy, embed: Embed | None = None) -> None:
        self.store = store
        self.policy = policy
        self.embed = embed

    def recall(self, owner: str, query: str, now: float | None = None, exclude: Iterable[int] = (),
               query_vector: list[float] | None = None, policy: RecallPolicy | None = None,
               candidates: Sequence[Memory] | None = None) -> list[Scored]:
        """Gates 2 and 3: the owner's entries relevant to ``query``, best first (``exclude``: ids
        left out, e.g. already shown in this conversation). ``query_vector``: the query's
        embedding when there is one; ``policy``: overrides the recaller's (an explicit search);
        ``candidates``: the keyword search's result, already read (``keyword_candidates``)."""
        now = time.time() if now is None else now
        policy = policy or self.policy
        skip = set(exclude)
        if candidates is None:
            candidates = self.store.keyword_search(owner, words(query), policy.candidates)
        found = {m.id: m for m in candidates}
        vectors: dict[int, float] = {}
        if query_vector is not None:
            nearest = sorted(((cosine(query_vector, m.embedding or []), m) for m in self.store.with_embeddings(owner)),
                             key=lambda pair: -pair[0])[:policy.candidates]
            for cos, memory in nearest:
                vectors[memory.id] = cos
                found.setdefault(memory.id, memory)
        return rescore(query, (m for i, m in found.items() if i not in skip), now, policy, vectors)

    def keyword_candidates(self, conn: Connection, owner: str, query: str) -> list[Memory]:
        """The keyword search of ``recall`` (the recaller's policy), read in the caller's
        transaction ``conn``; handed back to ``recall`` as ``candidates``."""
        return MemoryStore.keyword_search_in(conn, owner, words(query), self.policy.candidates)

    def block(self, scored: Sequence[Scored]) -> Block:
        """Gate 4 with the policy's budget."""
        return fill_budget(scored, self.policy.budget_tokens)
