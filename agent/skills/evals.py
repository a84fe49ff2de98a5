"""Skill evals: example tasks with expected properties, run against a model to get pass rates.

An eval file (``<skill>/evals/*.json``) holds cases, either as a list or as ``{"cases": [...]}``::

    {"cases": [{"name": "weekday report",
                "task": "Summarise yesterday's sales: 12 orders, 3 refunds.",
                "expect": {"contains": ["12 orders"], "not_contains": ["I cannot"],
                           "matches": "^\\\\*\\\\*Daily report", "max_chars": 1500,
                           "tools_called": ["update_plan"]}}]}

Each run starts a fresh conversation with the skill already loaded (its ``load_skill`` call and
result are placed before the task, so every run follows the same version), runs the agent loop,
acceptance checklist included, and checks the final reply. ``contains``/``not_contains`` are
case-insensitive substrings, ``matches`` a regular expression (``re.search``, multi-line).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.budget import Limits
from agent.context import RunContext
from agent.loop import run_turn
from agent.model import ChatModel
from agent.skills.skill import Skill, read_json
from agent.skills.tool import render_skill
from agent.tools import ToolRegistry
from agent.turn_state import TurnState

EXPECT_KEYS = ("contains", "not_contains", "matches", "max_chars", "min_chars", "tools_called")


@dataclass(frozen=True)
class EvalCase:
    """One example task: ``name``, the user's ``task`` and the ``expect``\\ ed properties."""

    name: str
    task: str
    expect: dict[str, Any]
    source: str = ""


@dataclass
class EvalResult:
    """One run of one case: whether it passed, the failed properties and the reply."""

    case: EvalCase
    passed: bool
    failures: list[str] = field(default_factory=list)
    reply: str = ""


def load_cases(path: Path) -> list[EvalCase]:
    """The cases of one eval file.

    Raises:
        ValueError: the file is not JSON, a case lacks ``task`` or ``expect``, ``expect`` is empty
            or has an unknown key, or a ``matches`` pattern does not compile (naming file and case).
    """
    data = read_json(path)
    raw = data.get("cases") if isinstance(data, dict) else data
    if not isinstance(raw, list) or not raw:
        raise ValueError(f"{path}: expected a non-empty list of cases (or {{\"cases\": [...]}})")
    cases = []
    for index, case in enumerate(raw):
        where = f"{path}: case {index + 1}"
        if not isinstance(case, dict) or not isinstance(case.get("task"), str) or not case["task"].strip():
            raise ValueError(f"{where}: field 'task' (the user's message) is missing")
        expect = case.get("expect")
        if not isinstance(expect, dict) or not expect:
            raise ValueError(f"{where}: field 'expect' is missing or empty (say what a good answer has)")
        unknown = sorted(set(expect) - set(EXPECT_KEYS))
        if unknown:
            raise ValueError(f"{where}: unknown expectation {unknown[0]!r} (known: {', '.join(EXPECT_KEYS)})")
        for pattern in _as_list(expect.get("matches")):
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"{where}: 'matches' pattern {pattern!r} is invalid: {exc}") from None
        cases.append(EvalCase(str(case.get("name") or f"case {index + 1}"), case["task"], expect, str(path)))
    return cases


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    return list(value) if isinstance(value, list) else [value]


def check(expect: dict[str, Any], reply: str, tools_called: set[str]) -> list[str]:
    """The expectations ``reply`` fails (empty: it passes)."""
    failures = []
    low = reply.lower()
    failures += [f"does not contain {s!r}" for s in _as_list(expect.get("contains")) if str(s).lower() not in low]
    failures += [f"contains {s!r}" for s in _as_list(expect.get("not_contains")) if str(s).lower() in low]
    failures += [f"does not match {p!r}" for p in _as_list(expect.get("matches"))
                 if not re.search(p, reply, re.MULTILINE)]
    if "max_chars" in expect and len(reply) > int(expect["max_chars"]):
        failures.append(f"is {len(reply)} characters, more than {expect['max_chars']}")
    if "min_chars" in expect and len(reply) < int(expect["min_chars"]):
        failures.append(f"is {len(reply)} characters, fewer than {expect['min_chars']}")
    failures += [f"never called {t}" for t in _as_list(expect.get("tools_called")) if t not in tools_called]
    return failures


def skill_cases(skill: Skill) -> list[EvalCase]:
    """Every case of every eval file of ``skill`` (files in name order)."""
    return [case for path in skill.eval_files() for case in load_cases(path)]


def run_case(case: EvalCase, skill: Skill, *, system_prompt: str, model: ChatModel, tools: ToolRegistry,
             limits: Limits, bridge: Any = None) -> EvalResult:
    """Runs ``case`` once in a fresh conversation with ``skill`` loaded; checks the final reply.
    Raises ``agent.model.ModelError`` when the model endpoint fails."""
    state = TurnState()
    state.add_skill(skill.name, skill.version, skill.checks)
    loaded = render_skill(skill.name, skill.version, skill.body, skill.files(), skill.checks,
                          [t for t in skill.toolset if t not in tools.tools])
    call = {"id": "call_eval_load_skill", "type": "function",
            "function": {"name": "load_skill", "arguments": json.dumps({"name": skill.name})}}
    history = [{"role": "user", "content": case.task},
               {"role": "assistant", "content": None, "tool_calls": [call]},
               {"role": "tool", "tool_call_id": call["id"], "content": loaded}]
    called: set[str] = {"load_skill"}

    def record(message: dict[str, Any], *_: Any) -> None:
        for tool_call in message.get("tool_calls") or ():
            called.add(tool_call["function"]["name"])

    outcome = run_turn(system_prompt=system_prompt, history=history, model=model, tools=tools, bridge=bridge,  # type: ignore[arg-type]
                       limits=limits, record=record, context=RunContext(session_id="eval", turn_id="eval",
                                                                        state=state))
    failures = check(case.expect, outcome.reply, called)
    if outcome.stop_reason not in ("stop", "length"):
        failures.insert(0, f"the run stopped early ({outcome.stop_reason})")
    return EvalResult(case, not failures, failures, outcome.reply)


def run_evals(skill: Skill, runs: int = 1, on_result: Callable[[EvalResult], None] | None = None,
              **kwargs: Any) -> list[EvalResult]:
    """Runs every case of ``skill`` ``runs`` times (``kwargs`` as for ``run_case``)."""
    results = []
    for case in skill_cases(skill):
        for _ in range(runs):
            result = run_case(case, skill, **kwargs)
            results.append(result)
            if on_result is not None:
                on_result(result)
    return results
