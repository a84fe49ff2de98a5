"""Rebuilds a turn's ``TurnState`` from its transcript when a turn resumes after a crash.

Everything the state holds is also in the transcript: the skills loaded (each ``load_skill``
result starts with ``Skill NAME (version V)`` and lists the acceptance checks), the plan (the
latest accepted ``update_plan`` call) and whether the checklist was asked (the host's checklist
message). So a turn taken over by another instance still records the skill versions it used and
still asks for the checklist, once.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from agent.loop import CHECKLIST_REQUEST
from agent.skills.tool import CHECKS_HEADER
from agent.turn_state import TurnState

_LOADED = re.compile(r"^Skill ([a-z0-9][a-z0-9-]*) \(version ([^)\n]+)\)")
_CHECKLIST_START = CHECKLIST_REQUEST.split("{", 1)[0]


def restore_state(turn: Sequence[dict[str, Any]]) -> TurnState:
    """The state of a turn whose model-facing messages so far (its user message first) are ``turn``."""
    state = TurnState()
    calls: dict[str, dict[str, Any]] = {}
    for message in turn:
        if message.get("role") == "assistant":
            calls.update({c["id"]: c["function"] for c in message.get("tool_calls") or []})
        elif message.get("role") == "user" and str(message.get("content") or "").startswith(_CHECKLIST_START):
            state.checks_asked = True
        elif message.get("role") == "tool":
            function = calls.get(message.get("tool_call_id") or "", {})
            content = str(message.get("content") or "")
            if function.get("name") == "load_skill" and (found := _LOADED.match(content)):
                checks = content.split(CHECKS_HEADER, 1)[1] if CHECKS_HEADER in content else ""
                state.add_skill(found.group(1), found.group(2).strip(), tuple(
                    line[2:].strip() for line in checks.splitlines() if line.startswith("- ")))
            elif function.get("name") == "update_plan" and not content.startswith("Error"):
                try:
                    state.plan = json.loads(function.get("arguments") or "{}")["steps"]
                except (ValueError, KeyError, TypeError):
                    pass
    return state
