"""``TurnState``: what a turn's tools keep between steps (the plan, the skills loaded).

One per turn, shared by every tool call of the turn through ``RunContext.state`` (sub-agents
share their parent's). The loop reads it at the end: the skills' acceptance checks are asked for
before the final reply (``checklist``), and ``facts()`` is recorded with the turn's last message
(``meta.skills``: which skill versions the turn used; ``meta.plan``: the plan as it ended). The
plan also lives in the transcript (each ``update_plan`` call and its result), so a turn resumed
after a crash, ``/status`` and any instance can read it back.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

PlanSteps = list[dict[str, str]]
"""``[{"step": "Fetch the page", "status": "pending" | "in_progress" | "done"}, ...]``."""


@dataclass(frozen=True)
class LoadedSkill:
    """A skill loaded in this turn: its version and its acceptance checks (may be empty)."""

    version: str
    checks: tuple[str, ...] = ()


@dataclass
class TurnState:
    """Mutable per-turn facts; methods are thread-safe (parallel tool calls of one step).

    Attributes:
        plan: the latest plan, or ``None`` while the model has made none.
        skills: skill name -> ``LoadedSkill``, for every skill loaded in the turn.
        on_plan: called with each new plan (the gateway edits the chat's progress message); its
            exceptions are the caller's to avoid: it runs inside the ``update_plan`` call.
        checks_asked: the loop already asked the model to confirm the checklist this turn.
    """

    plan: PlanSteps | None = None
    skills: dict[str, LoadedSkill] = field(default_factory=dict)
    on_plan: Callable[[PlanSteps], None] | None = None
    checks_asked: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def set_plan(self, steps: PlanSteps) -> None:
        """Replaces the plan and tells ``on_plan``."""
        with self._lock:
            self.plan = [dict(step) for step in steps]
        if self.on_plan is not None:
            self.on_plan([dict(step) for step in steps])

    def add_skill(self, name: str, version: str, checks: tuple[str, ...]) -> None:
        """Records that the skill ``name`` at ``version`` was loaded (loading it again replaces it)."""
        with self._lock:
            self.skills[name] = LoadedSkill(version, checks)

    def checklist(self) -> list[tuple[str, str]]:
        """``(skill name, check)`` for every acceptance check of the skills loaded, in load order."""
        with self._lock:
            return [(name, check) for name, skill in self.skills.items() for check in skill.checks]

    def facts(self) -> dict[str, Any]:
        """What the turn's last message records: ``skills`` (name -> version) and ``plan``."""
        with self._lock:
            out: dict[str, Any] = {}
            if self.skills:
                out["skills"] = {name: skill.version for name, skill in self.skills.items()}
            if self.plan is not None:
                out["plan"] = [dict(step) for step in self.plan]
            return out
