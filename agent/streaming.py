"""Rebuilds one assistant message from streamed chat-completion chunks (pure, no I/O).

OpenAI streams each tool call as deltas: the first carries its ``id``, ``type`` and
``function.name``, later ones only ``function.arguments`` pieces and the call's ``index``. Servers
differ in how they tag the pieces, so a delta is assigned to a call by these rules, in order:

1. a delta with an ``id`` seen before continues that call (some servers repeat the id);
2. a delta with a new ``id`` starts a new call, whatever its ``index`` (vLLM and several proxies
   send every parallel call with ``index: 0``, in one chunk or in consecutive chunks);
3. a delta without an ``id`` continues the newest call sent with its ``index`` (OpenAI
   interleaves the argument pieces of parallel calls, tagged only by index), or, without an
   ``index`` either, the newest call.

A call that never got an id (a few servers send none) is given a ``call_<24 hex>`` one: the next
request must answer every call by its id, and the API rejects an empty one. A delta that repeats
an earlier call's id under another ``index`` with a function name starts a call of its own, with a
fresh id (some models give parallel calls one id; merged, their arguments ran together).

A chunk of the wrong shape (a choice, delta, call or function that is not an object; content,
name or arguments that are not text) raises ``ModelError`` (reason ``stream``: the provider's
fault, so a route fails over), never a ``TypeError`` that would fail the turn.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from agent.model_errors import ModelError


def _malformed(what: str) -> ModelError:
    return ModelError(f"malformed stream chunk: {what}", "The model's answer broke off; try again.", reason="stream")


def ends_reply(chunk: dict[str, Any]) -> bool:
    """Whether ``chunk`` (one SSE ``data:`` JSON) ends the reply: it carries choice 0's
    ``finish_reason``, or it is the usage chunk sent after it (empty ``choices``). OpenAI Chat
    Completions streaming: the finish chunk follows the last delta at once."""
    choices = chunk.get("choices")
    if not choices:
        return bool(chunk.get("usage"))
    return any(isinstance(c, dict) and c.get("index", 0) == 0 and c.get("finish_reason") for c in choices)


@dataclass
class _PartialCall:
    order: tuple[int, int]  # (stream index of its first delta, arrival): the order calls are returned in
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


@dataclass
class StreamAccumulator:
    """Feed ``add(chunk)`` with each chunk as a dict (the JSON of one SSE ``data:`` line).

    ``usage`` is the last non-empty ``usage`` object seen: OpenAI sends it once, in a final chunk
    with empty ``choices`` (``stream_options.include_usage``); servers that repeat it on every
    chunk send running totals, so it is replaced, never added up.
    """

    content: list[str] = field(default_factory=list)
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    _calls: list[_PartialCall] = field(default_factory=list)
    _by_id: dict[str, _PartialCall] = field(default_factory=dict)
    _by_index: dict[int, _PartialCall] = field(default_factory=dict)
    _text: str = ""
    _joined: int = 0  # pieces of ``content`` already in ``_text``

    def add(self, chunk: dict[str, Any]) -> str | None:
        """Merges one chunk; returns its text delta (``None`` when it had none)."""
        if chunk.get("usage"):
            if not isinstance(chunk["usage"], dict):
                raise _malformed("usage is not an object")
            self.usage = chunk["usage"]
        text: str | None = None
        choices = chunk.get("choices") or ()
        if not isinstance(choices, (list, tuple)):
            raise _malformed("choices is not a list")
        for choice in choices:
            if not isinstance(choice, dict):
                raise _malformed("a choice is not an object")
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            pieces = delta.get("tool_calls") or () if isinstance(delta, dict) else None
            if not isinstance(delta, dict) or not isinstance(pieces, (list, tuple)):
                raise _malformed("a delta or its tool_calls has the wrong type")
            for field_name in ("content", "refusal"):  # a refusal streams in place of content (OpenAI)
                if delta.get(field_name):
                    if not isinstance(delta[field_name], str):
                        raise _malformed(f"{field_name} is not text")
                    text = delta[field_name]
                    self.content.append(text)
            for piece in pieces:
                if not isinstance(piece, dict):
                    raise _malformed("a tool call delta is not an object")
                self._merge(piece)
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        return text

    def _merge(self, piece: dict[str, Any]) -> None:
        call_id = piece.get("id") or ""
        raw_index = piece.get("index")
        index = raw_index if isinstance(raw_index, int) and not isinstance(raw_index, bool) else None
        function = piece.get("function") or {}
        if not isinstance(function, dict) or not all(
                isinstance(function.get(key), (str, type(None))) for key in ("name", "arguments")):
            raise _malformed("a tool call's function, name or arguments has the wrong type")
        call = self._by_id.get(call_id) if call_id else None
        if call is not None and index is not None and function.get("name") and call.order[0] != index \
                and self._by_index.get(call.order[0]) is call:
            call_id = new_call_id()  # another call sent under an earlier call's id: its own, fresh id
            call = None
        if call is None and not call_id:
            call = self._by_index.get(index) if index is not None else (self._calls[-1] if self._calls else None)
        if call is None:
            call = _PartialCall(order=(index if index is not None else 0, len(self._calls)), id=call_id)
            self._calls.append(call)
            if call_id:
                self._by_id[call_id] = call
        if index is not None:
            self._by_index[index] = call
        name = function.get("name")
        if name and name != call.name:
            # OpenAI sends the whole name once; a few servers stream it in pieces.
            call.name = name if not call.name else call.name + name
        if function.get("arguments"):
            call.arguments.append(function["arguments"])

    @property
    def text(self) -> str:
        """The content so far (pieces joined since the last call are appended to the text kept:
        asked for during a stream, it does not join every piece again)."""
        if self._joined < len(self.content):
            self._text += "".join(self.content[self._joined:])
            self._joined = len(self.content)
        return self._text

    def tool_calls(self) -> list[dict[str, Any]]:
        """The calls in the OpenAI wire shape of a non-streamed message, ordered by stream index,
        then arrival. Every call has a non-empty ``id`` (see the module docstring)."""
        for call in self._calls:
            if not call.id:
                call.id = new_call_id()
        return [
            {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": "".join(call.arguments)}}
            for call in sorted(self._calls, key=lambda c: c.order)
        ]


def new_call_id() -> str:
    """A tool call id in OpenAI's shape (``call_`` + 24 hex digits), for a call a server sent without one."""
    return f"call_{uuid.uuid4().hex[:24]}"
