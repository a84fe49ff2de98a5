"""The plan ``/status`` shows is read back from the transcript: the newest turn's latest accepted
``update_plan`` call (pure function over stored rows)."""

from __future__ import annotations

import json

from agent.plan import render_plan
from gateway.delivery.progress import latest_plan, plan_key
from gateway.store.sql import StoredMessage


def row(turn: str, role: str, content: str | None = None, calls: list | None = None, call_id: str | None = None):
    return StoredMessage(0, turn, role, content, calls, call_id, None, None)


def plan_call(call_id: str, *statuses: str) -> dict:
    steps = [{"step": f"step {i}", "status": s} for i, s in enumerate(statuses, 1)]
    return {"id": call_id, "type": "function", "function": {"name": "update_plan",
                                                            "arguments": json.dumps({"steps": steps})}}


def test_latest_plan_is_the_newest_accepted_call_of_the_newest_turn():
    window = [
        row("in1", "user", "old task"),
        row("in1", "assistant", calls=[plan_call("a", "done")]), row("in1", "tool", "Plan (1/1 done)", call_id="a"),
        row("in2", "user", "new task"),
        row("in2", "assistant", calls=[plan_call("b", "in_progress", "pending")]),
        row("in2", "tool", "Plan (0/2 done)", call_id="b"),
        row("in2", "assistant", calls=[plan_call("c", "in_progress", "in_progress")]),
        row("in2", "tool", "Error: update_plan failed: ValueError: at most one step may be in_progress", call_id="c"),
    ]
    assert latest_plan(window) == [{"step": "step 1", "status": "in_progress"},
                                   {"step": "step 2", "status": "pending"}]
    assert latest_plan([*window, row("in3", "user", "a simple question")]) is None  # that turn made none
    assert render_plan(latest_plan(window)) == "Plan (0/2 done)\n⏳ step 1\n▫️ step 2"


def test_the_plan_row_key_is_derived_from_the_reply_key():
    assert plan_key("in12-0123456789ab:0") == "in12-0123456789ab:plan"
