"""Turns of a stored session as skill eval cases (``gateway sessions export ID --as-eval``).

Each exported turn becomes a case with the user's ``task`` and what happened (``observed``: the
reply, why the turn stopped, the tools called, the skill versions used). Its ``expect`` is left
empty on purpose: only a person knows what a good answer has, and an eval with an empty ``expect``
is rejected by ``gateway skills validate`` / ``eval`` until it is filled in.
"""

from __future__ import annotations

from typing import Any

from gateway.store.sql import StoredMessage

FILL_IN = ("Fill in each case's 'expect' (contains, not_contains, matches, max_chars, min_chars, tools_called), "
           "then put this file into the skill's evals/ folder.")


def turns_of(transcript: list[StoredMessage]) -> dict[str, list[StoredMessage]]:
    """Messages by turn id, in transcript order."""
    turns: dict[str, list[StoredMessage]] = {}
    for message in transcript:
        if message.turn_id:
            turns.setdefault(message.turn_id, []).append(message)
    return turns


def turn_case(turn_id: str, messages: list[StoredMessage]) -> dict[str, Any] | None:
    """The eval case of one turn, or ``None`` for a turn without a user's message."""
    task = next((m.content for m in messages if m.role == "user" and (m.meta or {}).get("kind") != "checklist"
                 and m.content), None)
    if task is None:
        return None
    replies = [m for m in messages if m.role == "assistant" and not m.tool_calls]
    last = replies[-1] if replies else None
    meta = (last.meta or {}) if last is not None else {}
    tools = sorted({c["function"]["name"] for m in messages for c in (m.tool_calls or [])})
    observed = {"reply": last.content if last is not None else None,
                "stop_reason": meta.get("stop_reason", "no reply"), "tools_called": tools,
                "skills": meta.get("skills", {})}
    return {"name": f"turn {turn_id}", "task": task, "expect": {}, "observed": observed}


def failed(case: dict[str, Any]) -> bool:
    """Whether the turn ended without a normal answer (a budget, an error, no reply)."""
    return case["observed"]["stop_reason"] != "stop"


def export_cases(transcript: list[StoredMessage], *, turn: str | None = None, all_turns: bool = False
                 ) -> list[dict[str, Any]]:
    """Cases for ``turn`` only, for every turn (``all_turns``), or by default for the failed turns."""
    cases = []
    for turn_id, messages in turns_of(transcript).items():
        case = turn_case(turn_id, messages)
        if case is None or (turn is not None and turn_id != turn):
            continue
        if turn is not None or all_turns or failed(case):
            cases.append(case)
    return cases
