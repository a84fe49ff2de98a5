"""Rebuilds one assistant message from streamed chat-completion chunks (pure, no I/O).

Tool-call deltas are merged by their ``index`` (OpenAI streaming: the first delta of a call has
its ``id``, ``type`` and ``function.name``, later ones only ``function.arguments`` pieces), never
by arrival order: servers may interleave the pieces of parallel calls.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class _PartialCall:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


@dataclass
class StreamAccumulator:
    """Feed ``add(chunk)`` with each chunk as a dict (``ChatCompletionChunk.model_dump()``)."""

    content: list[str] = field(default_factory=list)
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    _calls: dict[int, _PartialCall] = field(default_factory=dict)

    def add(self, chunk: dict[str, Any]) -> str | None:
        """Merges one chunk; returns its text delta (``None`` when it had none)."""
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        text: str | None = None
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if delta.get("content"):
                text = delta["content"]
                self.content.append(text)
            for piece in delta.get("tool_calls") or ():
                self._merge(piece)
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        return text

    def _merge(self, piece: dict[str, Any]) -> None:
        index = piece.get("index")
        if index is None:  # some servers omit it for single calls
            index = max(self._calls, default=-1) + (0 if piece.get("id") is None and self._calls else 1)
        call = self._calls.setdefault(int(index), _PartialCall())
        if piece.get("id"):
            call.id = piece["id"]
        function = piece.get("function") or {}
        name = function.get("name")
        if name and name != call.name:
            # OpenAI sends the whole name once; a few servers stream it in pieces.
            call.name = name if not call.name else call.name + name
        if function.get("arguments"):
            call.arguments.append(function["arguments"])

    @property
    def text(self) -> str:
        return "".join(self.content)

    def tool_calls(self) -> list[dict[str, Any]]:
        """The calls in ``index`` order, in the OpenAI wire shape of a non-streamed message."""
        return [
            {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": "".join(call.arguments)}}
            for _, call in sorted(self._calls.items())
        ]
