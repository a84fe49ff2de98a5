"""``MemoryService``: long-term memory as the turn runner uses it (issue 10).

Before a turn (``annotate``, on the turn's worker thread): the newest user message's memory block
is computed once and stored in that message's ``meta`` (``memory``: the block text,
``memory_ids``: its entries), so a resumed turn and every later turn render the same bytes and
the provider's prompt cache stays valid. Entries already shown in the loaded window are not
repeated. After a turn (``after_turn``): explicit "remember ..." requests are stored at once, before
the turn's reply is handed to delivery (the user's next message, ``/memory`` and ``/forget`` see
them); the model-proposed candidates are asked for on the memory thread, off the
reply's path (the reply is already queued), and a failure there is only logged.

Owners: a DM conversation's memory belongs to its user (``user:<user id>``; linked accounts are
one user, so memory follows them across platforms); a group's to the chat (``group:<key without
its thread>``, per member with ``sessions.group_scope = "user"``). Nothing is read across owners.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection

from agent.model import ChatModel
from gateway.core.session_keys import GroupScope, is_dm_key, session_key_for
from gateway.core.types import InboundMessage
from gateway.memory.promote import (
    EXPLICIT_WEIGHT,
    MAX_WEIGHT,
    PROPOSED_WEIGHT,
    TurnMessage,
    evidence_problem,
    explicit_request,
    guess_type,
    parse_proposal,
    proposal_request,
    restated,
)
from gateway.memory.recall import Embed, Recaller
from gateway.memory.store import MAX_TEXT_CHARS, Memory, MemoryStore, NewMemory, too_long, user_owner
from gateway.memory.terms import words
from gateway.sessions.directory import Directory
from gateway.store.sql import Store, StoredMessage

log = logging.getLogger("gateway.memory")

REWRITE_PROMPT = (
    "Rewrite the user's message as a short search query (keywords only) for looking up what is known "
    "about the user from earlier conversations. Answer with the query only."
)


@dataclass(frozen=True, slots=True)
class Candidates:
    """Memory entries matching ``query``'s words, read ahead (``MemoryService.candidates``)."""

    query: str
    memories: list[Memory]


def owner_for(key: str) -> str:
    """The memory owner of a session key: ``dm:<user>`` -> ``user:<user>``; a group key without
    its ``:thread:…`` part -> ``group:<rest>`` (one memory per group chat, or per member of it
    when the key is per user)."""
    if is_dm_key(key):
        return user_owner(key[3:])
    return "group:" + re.sub(r":thread:[^:]*", "", key)


class MemoryService:
    """Load and write-back for turns; the owner of a message for tools and commands.

    Args:
        memories: the memory table.
        store: the transcript (the turn's messages are read back from it after the turn).
        directory: resolves a message's sender to their (linked) user for tools and commands.
        recaller: gates 2-4 (``gateway.memory.recall``).
        model: returns the chat model client (proposals and the optional query rewrite).
        group_scope: ``sessions.group_scope`` (which conversation a group message belongs to).
        promote: ask the model for candidates after each turn.
        promote_min_chars: turns whose user messages are shorter than this and used no tool are
            not worth a proposal call ("thanks", "ok").
        rewrite_query: gate 1 asks the model for a retrieval query first (one more call per turn).
        embed: the embeddings client (``None``: keyword recall only).
    """

    def __init__(self, *, memories: MemoryStore, store: Store, directory: Directory, recaller: Recaller,
                 model: Callable[[], ChatModel], group_scope: GroupScope = "chat", promote: bool = True,
                 promote_min_chars: int = 24, rewrite_query: bool = False, embed: Embed | None = None) -> None:
        self.memories = memories
        self.store = store
        self.directory = directory
        self.recaller = recaller
        self.model = model
        self.group_scope = group_scope
        self.promote = promote
        self.promote_min_chars = promote_min_chars
        self.rewrite_query = rewrite_query
        self.embed = embed
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="memory")

    def owner_of(self, message: InboundMessage) -> str:
        """The memory owner of the conversation ``message`` belongs to (its sender's linked user
        for a DM). Blocks on a directory read."""
        identity = self.directory.identify(message)
        return owner_for(session_key_for(message, identity.user_id, self.group_scope))

    # -- load --------------------------------------------------------------------------------
    def candidates(self, conn: Connection, *, key: str, query: str) -> Candidates | None:
        """The keyword candidates ``annotate`` would read for ``query`` in ``key``'s conversation,
        read in the caller's transaction ``conn`` (a lane's claim); ``None`` when recall needs more
        than that read (a rewritten query or an embedding: model calls, never inside a
        transaction) or it failed (``annotate`` then reads them itself)."""
        if self.rewrite_query or self.embed is not None:
            return None
        try:
            return Candidates(query, self.recaller.keyword_candidates(conn, owner_for(key), query))
        except Exception:
            log.warning("memory candidates could not be read with the session; read at recall", exc_info=True)
            return None

    def annotate(self, meta: dict[str, Any], *, key: str, query: str, window: Sequence[StoredMessage],
                 read: Candidates | None = None) -> dict[str, Any]:
        """``meta`` of the turn's newest user message with its memory block added (unchanged when
        nothing passes the gates or memory fails: a turn never fails for memory). Counts a hit on
        each injected entry. ``read``: ``candidates`` read earlier, used when they are for this
        ``query``."""
        try:
            shown = {i for row in window if row.role == "user" and row.meta for i in row.meta.get("memory_ids", ())}
            found = read.memories if read is not None and read.query == query else None
            query = self._query(query)
            scored = self.recaller.recall(owner_for(key), query, exclude=shown, query_vector=self.query_vector(query),
                                          candidates=found)
            block = self.recaller.block(scored)
            if not block.ids:
                return meta
            self.memories.used(block.ids)
            return {**meta, "memory": block.text, "memory_ids": list(block.ids)}
        except Exception:
            log.exception("memory recall failed; the turn goes on without memory")
            return meta

    def _query(self, text: str) -> str:
        """Gate 1: the message, or the model's retrieval query for it."""
        if not self.rewrite_query or not text.strip():
            return text
        try:
            reply = self.model().complete([{"role": "system", "content": REWRITE_PROMPT},
                                           {"role": "user", "content": text}], [])
        except Exception as exc:
            log.warning("memory query rewrite failed (%s); using the message", exc)
            return text
        rewritten = " ".join((reply.content or "").split())[:300]
        return rewritten or text

    def query_vector(self, text: str) -> list[float] | None:
        """The query's embedding (``None`` without an embeddings endpoint or when the call fails)."""
        if self.embed is None or not text.strip():
            return None
        try:
            return self.embed([text])[0]
        except Exception as exc:
            log.warning("embedding the memory query failed (%s); keyword recall only", exc)
            return None

    # -- write-back --------------------------------------------------------------------------
    def after_turn(self, *, key: str, session_id: str, turn_ids: Sequence[str],
                   user_texts: Sequence[str] | None = None) -> None:
        """Promotes the turn's explicit requests now and queues the proposal call (see module doc).
        ``user_texts``: the turn's user messages as stored, when the caller has them: with proposals
        off and no explicit request among them there is nothing to do, and the transcript is not
        read. Never raises."""
        try:
            if user_texts is not None and not self.promote and \
                    not any(explicit_request(text) for text in user_texts if text):
                return
            owner = owner_for(key)
            turn = self.turn_messages(session_id, turn_ids)
            saved = self.save_explicit(owner, turn)
            if self.embed is not None and saved:
                self._pool.submit(self._embed_entries, saved)
            users = sum(len(m.text) for m in turn if m.role == "user")
            if self.promote and (users >= self.promote_min_chars or any(m.role == "tool" for m in turn)):
                self._pool.submit(self._propose_logged, owner, turn)
        except Exception:
            log.exception("memory write-back failed for session %s", session_id)

    @staticmethod
    def stores_now(user_texts: Sequence[str]) -> bool:
        """Whether the turn's user messages ask to remember something ("remember ...": ``after_turn``
        stores it at once, so the caller runs it before the reply goes out)."""
        return any(explicit_request(text) for text in user_texts if text)

    def turn_messages(self, session_id: str, turn_ids: Sequence[str]) -> list[TurnMessage]:
        """The turn's user messages, tool results and assistant texts from the transcript, in order."""
        return [TurnMessage(id_, role, content) for id_, role, content in self.store.turn_texts(session_id, turn_ids)
                if content and role in ("user", "tool", "assistant")]

    def save_explicit(self, owner: str, turn: Sequence[TurnMessage]) -> list[Memory]:
        """Stores each "remember ..." user message of the turn (a restated entry is reinforced
        instead; one longer than ``MAX_TEXT_CHARS`` is not stored: ``refusal_notice`` told the user)."""
        saved: list[Memory] = []
        for message in turn:
            what = explicit_request(message.text) if message.role == "user" else None
            if what is None:
                continue
            if len(what) > MAX_TEXT_CHARS:
                log.info("explicit memory request of %d characters not stored (message %s)", len(what), message.id)
                continue
            same = restated(what, self.memories.keyword_search(owner, words(what), 10))
            if same is not None:
                self.memories.reinforce(same.id, max(same.weight, EXPLICIT_WEIGHT), [message.id])
                continue
            saved.append(self.memories.add(NewMemory(owner, what, guess_type(what), "user_explicit", 1.0,
                                                     EXPLICIT_WEIGHT, (message.id,))))
        return saved

    @staticmethod
    def refusal_notice(texts: Sequence[str]) -> str:
        """What to add to the turn's reply when a "remember ..." among the user's ``texts`` will
        not be stored because it is too long (``""`` otherwise): the user learns it at once,
        whatever the model said."""
        for text in texts:
            what = explicit_request(text)
            if what is not None and len(what) > MAX_TEXT_CHARS:
                return (f"\n\n(Not remembered: {too_long(what)}. Say \"remember ...\" again with the "
                        "short version.)")
        return ""

    def _embed_entries(self, entries: Sequence[Memory]) -> None:
        try:
            for memory, vector in zip(entries, self.embed([m.text for m in entries]) if self.embed else [],
                                      strict=True):
                self.memories.set_embedding(memory.id, vector)
        except Exception as exc:
            log.warning("embedding %d memory entries failed (%s); they are found by keyword only", len(entries), exc)

    def _propose_logged(self, owner: str, turn: Sequence[TurnMessage]) -> None:
        try:
            self.propose(owner, turn)
        except Exception as exc:
            log.warning("memory proposal failed: %s", exc)

    def propose(self, owner: str, turn: Sequence[TurnMessage]) -> list[Memory]:
        """One model call for candidates, then the promotion gate; returns the entries added.

        Raises:
            agent.model.ModelError: the call failed; ``ValueError``: the answer is not the schema.
        """
        said = " ".join(m.text for m in turn if m.role in ("user", "tool"))
        existing = self.memories.keyword_search(owner, words(said)[:200], 20)
        reply = self.model().complete(proposal_request(turn, existing), [])
        proposal = parse_proposal(reply.content)
        added: list[Memory] = []
        for candidate in proposal.memories:
            problem = evidence_problem(candidate, turn)
            if problem is not None:
                log.info("memory candidate dropped: %s", problem)
                continue
            same = restated(candidate.text, [*existing, *added])
            if same is not None:
                if candidate.supersedes:
                    self.memories.supersede(owner, candidate.supersedes, same.id)
                else:
                    self.memories.reinforce(same.id, min(MAX_WEIGHT, same.weight + 0.5), candidate.evidence)
                continue
            vector = None
            if self.embed is not None:
                try:
                    vector = self.embed([candidate.text])[0]
                except Exception as exc:
                    log.warning("embedding a memory entry failed (%s)", exc)
            added.append(self.memories.add(
                NewMemory(owner, candidate.text, candidate.type, "task", candidate.confidence, PROPOSED_WEIGHT,
                          tuple(candidate.evidence), vector), supersedes=candidate.supersedes))
        return added

    def close(self) -> None:
        """Waits for queued write-backs, then stops the memory thread."""
        self._pool.shutdown(wait=True)
