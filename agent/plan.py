"""The plan station: ``update_plan(steps)`` keeps the task's plan in the turn's state.

The model sends the whole plan each time (steps with ``pending`` / ``in_progress`` / ``done``);
the host keeps it in ``TurnState.plan`` (the gateway shows it as one chat message edited in
place) and the call and its result stay in the transcript. ``render_plan`` is the one text form
of a plan, used in the chat, in ``/status`` and in the tool result.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from agent.context import RunContext
from agent.tools import Tool, tool
from agent.turn_state import PlanSteps

MAX_STEPS = 20
MARKS = {"done": "✅", "in_progress": "⏳", "pending": "▫️"}
"""How a step's status shows in the chat."""

DESCRIPTION = (
    "Record or update your plan for a multi-step task (three or more distinct steps, e.g. research "
    "then write then check). Send the whole plan each time with every step's status: pending, "
    "in_progress (at most one) or done; update it as steps complete. The user sees it as a progress "
    "message. Do not use it for a simple question or a one-step answer: just answer."
)


class PlanStep(BaseModel):
    """One step of the plan."""

    model_config = ConfigDict(extra="forbid")

    step: Annotated[str, Field(min_length=1, max_length=200, description="What this step does, in a few words.")]
    status: Literal["pending", "in_progress", "done"]


def render_plan(steps: PlanSteps, title: str = "Plan") -> str:
    """``Plan (1/3 done)`` then one line per step: ``✅ Fetch the page`` / ``⏳ ...`` / ``▫️ ...``."""
    done = sum(1 for s in steps if s.get("status") == "done")
    lines = [f"{title} ({done}/{len(steps)} done)"]
    lines += [f"{MARKS.get(s.get('status', 'pending'), MARKS['pending'])} {s.get('step', '')}" for s in steps]
    return "\n".join(lines)


def update_plan(ctx: RunContext, steps: list[PlanStep]) -> str:
    """Record or update the plan of a multi-step task.

    Args:
        steps: the whole plan, in order, each step with its status.
    """
    if not steps or len(steps) > MAX_STEPS:
        raise ValueError(f"a plan has 1 to {MAX_STEPS} steps; got {len(steps)}")
    if sum(1 for s in steps if s.status == "in_progress") > 1:
        raise ValueError("at most one step may be in_progress; mark finished steps done")
    plan = [{"step": s.step, "status": s.status} for s in steps]
    if ctx.state is not None:
        ctx.state.set_plan(plan)
    return render_plan(plan)


def update_plan_tool() -> Tool:
    """The ``update_plan`` Tool (its result is host text, not untrusted output)."""
    built: Tool = tool(update_plan, takes_context=True, side_effect="none", idempotent=True,
                       description=DESCRIPTION)
    return dataclasses.replace(built, trusted_output=True, retries=0)
