"""Sub-agents: ``delegate`` runs child loops from the task's wallet (real openai client, fake model)."""

from __future__ import annotations

import re
import threading

import pytest

from agent.budget import Limits
from agent.delegate import CHILD_PROMPT, delegate_tool
from agent.loop import run_turn
from agent.model import OpenAIChatModel
from agent.tools import Tool, ToolRegistry
from tests.fakes import openai as oa


@pytest.fixture
def model(fake_openai):
    fake_openai.reset()
    return OpenAIChatModel(base_url=f"{fake_openai.url}/v1", api_key="sk-test", model="gpt-4o-mini", max_retries=0)


def toolset(threads: set[str]) -> ToolRegistry:
    def add(a: int) -> str:
        threads.add(threading.current_thread().name)
        return str(a + 1)

    tools = ToolRegistry()
    tools.add(Tool("add", "Add one.", {"type": "object", "properties": {"a": {"type": "integer"}}}, fn=add))
    tools.add(delegate_tool())
    return tools


class Script:
    """Parent: 59 cheap steps, then 3 delegates in one step, then the answer. Children: A uses 2
    calls, B never finishes (runs out), C answers at once."""

    def __init__(self, parent_steps: int = 60) -> None:
        self.parent_steps = parent_steps
        self.parent = 0
        self.children: dict[str, int] = {"A": 0, "B": 0, "C": 0}
        self.child_budgets: dict[str, str] = {}

    def __call__(self, req):
        messages = req["messages"]
        if messages[0]["content"] == CHILD_PROMPT:
            task = messages[1]["content"]
            name = task.split()[1].rstrip(":")
            self.children[name] += 1
            self.child_budgets[name] = re.search(r"\[budget for this task: (\d+) model calls\]", task).group(1)
            tool_names = sorted(t["function"]["name"] for t in req["tools"])
            assert tool_names == ["add"]  # only the toolset asked for; never delegate
            if name == "A":
                return oa.tool_calls(oa.call("add", {"a": 1})) if self.children["A"] == 1 else oa.text("A: 2")
            if name == "B":
                return oa.tool_calls(oa.call("add", {"a": self.children["B"]}))
            return oa.text("C: done")
        self.parent += 1
        if self.parent < self.parent_steps:
            return oa.tool_calls(oa.call("add", {"a": self.parent}))
        if self.parent == self.parent_steps:
            return oa.tool_calls(*(oa.call("delegate", {"task": f"task {n}: work", "toolset": ["add"]})
                                   for n in "ABC"))
        return oa.text("all children reported")


def test_three_parallel_children_share_what_is_left_fairly(model, fake_openai):
    script = Script()
    fake_openai.responder = script
    threads: set[str] = set()
    recorded: list[dict] = []
    outcome = run_turn(system_prompt="parent", history=[{"role": "user", "content": "big job"}], model=model,
                       tools=toolset(threads), bridge=None, limits=Limits(iteration_budget=90),
                       record=lambda m, u, meta: recorded.append(m))
    # Parent used 60 of 90: 30 left, 1 kept back for its answer, 29 // 3 = 9 each (minimum 5, cap 50).
    assert script.child_budgets == {"A": "9", "B": "9", "C": "9"}
    assert script.children == {"A": 2, "B": 9, "C": 1}
    total = len(fake_openai.requests)
    assert total == 60 + 12 + 1 <= 90
    results = [m for m in recorded if m["role"] == "tool"][-3:]
    assert "A: 2" in results[0]["content"]
    assert "budget exhausted (iteration_budget) after 9 model calls" in results[1]["content"]
    assert "C: done" in results[2]["content"]
    # Unused iterations returned: 90 - 60 - (2 + 9 + 1) = 18 left, told to the parent model.
    assert "[budget: 18 of 90 model calls left" in results[2]["content"]
    assert outcome.reply == "all children reported" and outcome.steps == 61
    assert all(r["status"] == 200 for r in fake_openai.requests)


def test_no_child_starts_when_less_than_the_minimum_is_left(model, fake_openai):
    script = Script(parent_steps=16)
    fake_openai.responder = script
    recorded: list[dict] = []
    outcome = run_turn(system_prompt="parent", history=[{"role": "user", "content": "big job"}], model=model,
                       tools=toolset(set()), bridge=None, limits=Limits(iteration_budget=20),
                       record=lambda m, u, meta: recorded.append(m))
    # 4 left, 1 kept: 3 < the minimum of 5, so no child starts and none is starved.
    results = [m for m in recorded if m["role"] == "tool"][-3:]
    assert all("\nbudget exhausted: not started" in r["content"] for r in results)
    assert script.children == {"A": 0, "B": 0, "C": 0}
    assert outcome.reply == "all children reported" and len(fake_openai.requests) == 17
