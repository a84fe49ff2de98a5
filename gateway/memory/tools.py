"""The agent's memory tools: ``recall_memory(query)`` and ``save_memory(text, type)``.

They act on the memory of the conversation being answered (``gateway.core.types.CURRENT_MESSAGE``:
the DM user's, or the group's); outside a chat turn (a scheduled report) they refuse. What the
model saves must be stated by this turn's user messages or tool results (the same evidence rule
as the promotion gate), so text the model made up is not stored.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from agent.context import RunContext
from agent.tools import Tool, tool
from gateway.core.types import CURRENT_MESSAGE
from gateway.memory.promote import restated, ungrounded
from gateway.memory.recall import line_of
from gateway.memory.service import MemoryService
from gateway.memory.store import MAX_TEXT_CHARS, NewMemory, too_long
from gateway.memory.terms import words

SAVED_WEIGHT = 1.5


def memory_tools(service: MemoryService) -> list[Tool]:
    """Builds both tools on ``service``."""

    def recall_memory(query: str) -> str:
        """Search the long-term memory of this conversation's user (or group) for notes from earlier
        conversations: preferences, facts, decisions, past episodes. The most relevant notes are
        already shown at the top of the user's message; use this for anything else you need.

        Args:
            query: what to look for, in a few words.
        """
        message = CURRENT_MESSAGE.get()
        if message is None:
            return "Error: memory can only be used while answering a user in a chat."
        # An explicit search: half the threshold and no cut relative to the best (the model judges).
        policy = dataclasses.replace(service.recaller.policy, threshold=service.recaller.policy.threshold / 2,
                                     relative=0.0)
        scored = service.recaller.recall(service.owner_of(message), query, query_vector=service.query_vector(query),
                                         policy=policy)
        if not scored:
            return "No memory entries match."
        service.memories.used([s.memory.id for s in scored])
        return "\n".join(line_of(s.memory) for s in scored)

    def save_memory(ctx: RunContext, text: str,
                    type: Literal["preference", "fact", "decision", "episode"] = "fact",
                    replaces: int | None = None) -> str:
        """Save one note to the long-term memory of this conversation's user (or group), for later
        conversations: a preference, a fact about them or their work, a decision, or a task's
        conclusion. One short standalone sentence (at most 500 characters), never a transcript.
        Only save what the user said or a tool returned in this turn. Not needed when the user says
        "remember ...": that is saved automatically.

        Args:
            text: the note, one sentence.
            type: preference, fact, decision or episode.
            replaces: id (the number after #) of an existing note this one corrects; the old one
                stays in history but is no longer used.
        """
        message = CURRENT_MESSAGE.get()
        if message is None:
            return "Error: memory can only be used while answering a user in a chat."
        if len(text.strip()) > MAX_TEXT_CHARS:
            return f"Not saved: {too_long(text)}."
        provenance = ctx.provenance
        said = (provenance.trusted + "\n" + provenance.untrusted) if provenance is not None else message.text
        if ungrounded(text, said) is not None:
            return "Not saved: nothing the user said or a tool returned in this turn states it."
        owner = service.owner_of(message)
        same = restated(text, service.memories.keyword_search(owner, words(text), 10))
        if same is not None and replaces is None:
            return f"Already in memory as #{same.id}."
        turn = service.turn_messages(ctx.session_id, [ctx.turn_id]) if ctx.session_id else []
        evidence = tuple(m.id for m in turn if m.role in ("user", "tool")) or (f"turn:{ctx.turn_id}",)
        try:
            memory = service.memories.add(NewMemory(owner, text, type, "task", 0.9, SAVED_WEIGHT, evidence),
                                          supersedes=[replaces] if replaces is not None else [])
        except ValueError as exc:
            return f"Error: {exc}. Nothing was saved."
        note = f" It replaces #{replaces}." if replaces is not None else ""
        return f"Saved as #{memory.id}.{note} The user can see it with /memory and delete it with /forget {memory.id}."

    return [
        tool(recall_memory, side_effect="read", idempotent=True),
        tool(save_memory, side_effect="write", takes_context=True, needs_approval=False),
    ]
