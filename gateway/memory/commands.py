"""``/memory``, ``/memory export`` and ``/forget ID``: see and delete long-term memory, without the model.

In a DM they act on the sender's own memory (the linked user's, on any platform); in a group, on
the group's memory. Nobody can see or delete another owner's entries: an id that is not the
owner's gets the same answer as an id that does not exist.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

from gateway.core.i18n import _
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
        line += "  " + _("[superseded by #{id}]", id=memory.superseded_by)
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
        dm = message.chat_type == "dm"
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
            return _("Usage: /memory (list), /memory export (everything as JSON), /forget ID (delete one).")
        if not entries:
            return _("Your memory is empty. Say \"remember ...\" and I will keep it.") if dm else \
                _("This chat's memory is empty. Say \"remember ...\" and I will keep it.")
        valid = sum(1 for m in entries if m.superseded_by is None)
        shown = entries[-LISTED:]
        head = _("Your memory: {valid} in use, {old} superseded (kept for history). ") if dm else \
            _("This chat's memory: {valid} in use, {old} superseded (kept for history). ")
        lines = [head.format(valid=valid, old=len(entries) - valid)
                 + _("/forget ID deletes one; /memory export gives all as JSON.")]
        if len(entries) > len(shown):
            lines.append(_("(newest {shown} of {all})", shown=len(shown), all=len(entries)))
        lines += [_line(m) for m in reversed(shown)]
        return "\n".join(lines)

    def _forget(self, owner: str, args: list[str]) -> str:
        raw = args[0].lstrip("#") if args else ""
        if not (raw.isascii() and raw.isdigit() and len(raw) <= 18):  # '²' passes isdigit; ids fit a BIGINT
            return _("Usage: /forget ID (the number after # in /memory).")
        deleted = self.service.memories.forget(owner, int(raw))
        if not deleted:
            return _("No memory entry of yours has that ID. See /memory.")
        older = [f"#{i}" for i in deleted if i != int(raw)]
        if older:
            return _("Forgotten: #{id} (and {older}, which it replaced).", id=raw, older=", ".join(older))
        return _("Forgotten: #{id}.", id=raw)


def export(memory: Memory) -> dict[str, object]:
    """An entry as ``/memory export`` shows it (every field except the embedding vector)."""
    return {"id": memory.id, "text": memory.text, "type": memory.type, "source": memory.source,
            "confidence": memory.confidence, "created_at": datetime.fromtimestamp(memory.created_at, UTC).isoformat(),
            "last_used_at": datetime.fromtimestamp(memory.last_used_at, UTC).isoformat()
            if memory.last_used_at else None, "hits": memory.hits, "weight": memory.weight,
            "superseded_by": memory.superseded_by, "evidence": memory.evidence,
            "has_embedding": memory.embedding is not None}
