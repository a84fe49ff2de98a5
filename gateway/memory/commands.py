"""``/memory``, ``/memory export`` and ``/forget ID``: see and delete long-term memory, without the model.

In a DM they act on the sender's own memory (the linked user's, on any platform); in a group, on
the group's memory. Nobody can see or delete another owner's entries: an id that is not the
owner's gets the same answer as an id that does not exist.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

from gateway.core.types import InboundMessage
from gateway.memory.service import MemoryService
from gateway.memory.store import Memory

LISTED = 50
"""Newest entries listed by ``/memory`` (``/memory export`` has all)."""


def _day(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d")


def _line(memory: Memory) -> str:
    line = f"#{memory.id} ({memory.type}, {_day(memory.created_at)}, {memory.source}) {memory.text}"
    if memory.superseded_by is not None:
        line += f"  [superseded by #{memory.superseded_by}]"
    return line


class MemoryCommands:
    """Answers the memory commands for ``service``'s owners."""

    def __init__(self, service: MemoryService) -> None:
        self.service = service

    def handle(self, message: InboundMessage) -> str | None:
        """The reply to a memory command, or ``None`` for any other message. Blocks on the database."""
        if message.command not in ("memory", "forget"):
            return None
        owner = self.service.owner_of(message)
        whose = "Your" if message.chat_type == "dm" else "This chat's"
        args = message.text.split()
        if message.command == "forget":
            return self._forget(owner, args)
        entries = self.service.memories.entries(owner)
        if args and args[0].lower() == "export":  # a fenced block: every platform's markdown shows it as code
            data = json.dumps({"owner_kind": owner.split(":", 1)[0], "entries": [export(m) for m in entries]},
                              ensure_ascii=False, indent=1)
            fence = "```"
            while fence in data:  # an entry's own backticks cannot close the block (CommonMark: a longer fence)
                fence += "`"
            return f"{fence}json\n{data}\n{fence}"
        if args:
            return "Usage: /memory (list), /memory export (everything as JSON), /forget ID (delete one)."
        if not entries:
            return f"{whose} memory is empty. Say \"remember ...\" and I will keep it."
        valid = sum(1 for m in entries if m.superseded_by is None)
        shown = entries[-LISTED:]
        lines = [f"{whose} memory: {valid} in use, {len(entries) - valid} superseded (kept for history). "
                 "/forget ID deletes one; /memory export gives all as JSON."]
        if len(entries) > len(shown):
            lines.append(f"(newest {len(shown)} of {len(entries)})")
        lines += [_line(m) for m in reversed(shown)]
        return "\n".join(lines)

    def _forget(self, owner: str, args: list[str]) -> str:
        raw = args[0].lstrip("#") if args else ""
        if not raw.isdigit():
            return "Usage: /forget ID (the number after # in /memory)."
        deleted = self.service.memories.forget(owner, int(raw))
        if not deleted:
            return "No memory entry of yours has that ID. See /memory."
        older = [f"#{i}" for i in deleted if i != int(raw)]
        return f"Forgotten: #{raw}" + (f" (and {', '.join(older)}, which it replaced)." if older else ".")


def export(memory: Memory) -> dict[str, object]:
    """An entry as ``/memory export`` shows it (every field except the embedding vector)."""
    return {"id": memory.id, "text": memory.text, "type": memory.type, "source": memory.source,
            "confidence": memory.confidence, "created_at": datetime.fromtimestamp(memory.created_at, UTC).isoformat(),
            "last_used_at": datetime.fromtimestamp(memory.last_used_at, UTC).isoformat()
            if memory.last_used_at else None, "hits": memory.hits, "weight": memory.weight,
            "superseded_by": memory.superseded_by, "evidence": memory.evidence,
            "has_embedding": memory.embedding is not None}
