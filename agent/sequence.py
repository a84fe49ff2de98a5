"""Validation and repair of a chat message sequence before it is sent (DESIGN §5).

The API rejects a request where a ``tool`` message does not answer a call of the assistant
message right before it, or where an assistant ``tool_calls`` message is not followed by an
answer to each call. Rather than send such a request, ``repair`` fixes it: orphan tool messages
are dropped, duplicate answers are dropped, and a call left without an answer gets an explicit
``INTERRUPTED`` result placed right after the answers it has.
"""

from __future__ import annotations

from typing import Any

INTERRUPTED = "Error: this tool call was interrupted before it returned a result."


def problems(messages: list[dict[str, Any]]) -> list[str]:
    """What is wrong with ``messages`` (wire shape), in order; ``[]`` when the API would accept
    the tool-call sequence. Each entry names the message index."""
    found: list[str] = []
    open_ids: list[str] = []
    owner = -1
    for i, message in enumerate(messages):
        if message.get("role") == "tool":
            call_id = message.get("tool_call_id")
            if call_id in open_ids:
                open_ids.remove(call_id)
            else:
                found.append(f"messages[{i}]: tool message {call_id!r} answers no preceding tool call")
            continue
        found.extend(f"messages[{owner}]: tool call {cid!r} has no answer" for cid in open_ids)
        open_ids, owner = [], i
        if message.get("role") == "assistant" and message.get("tool_calls"):
            open_ids = [str(call.get("id")) for call in message["tool_calls"]]
    found.extend(f"messages[{owner}]: tool call {cid!r} has no answer" for cid in open_ids)
    return found


def repair(messages: list[dict[str, Any]], *, keep_trailing_calls: bool = False,
           interrupted: str = INTERRUPTED) -> list[dict[str, Any]]:
    """A valid copy of ``messages``: orphan and duplicate tool messages dropped, unanswered calls
    answered with ``interrupted``. Messages are not copied (the same dicts are reused).

    ``keep_trailing_calls``: leave the calls of the last assistant message unanswered when only
    tool messages follow it (a turn resumed after a crash answers those itself).
    """
    out: list[dict[str, Any]] = []
    open_ids: list[str] = []

    def close() -> None:
        out.extend({"role": "tool", "tool_call_id": cid, "content": interrupted} for cid in open_ids)
        open_ids.clear()

    for message in messages:
        if message.get("role") == "tool":
            if message.get("tool_call_id") in open_ids:
                open_ids.remove(message["tool_call_id"])
                out.append(message)
            continue
        close()
        out.append(message)
        if message.get("role") == "assistant" and message.get("tool_calls"):
            open_ids.extend(str(call["id"]) for call in message["tool_calls"])
    if not keep_trailing_calls:
        close()
    return out
