"""Compression end to end: 300 turns through ``TurnRunner`` with a real SQLite store and the real
openai client against the fake chat-completions server, in a 2,000-token context window."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest

from agent.bridge import AsyncBridge
from agent.budget import Limits
from agent.cache import AgentCache, AgentSpec
from agent.model import OpenAIChatModel
from agent.tools import Tool, ToolRegistry
from gateway.bus.compression import SUMMARY_HEADER, SUMMARY_PROMPT
from gateway.bus.turns import TurnRunner
from gateway.core.types import ChatAddress, InboundMessage, Sender
from gateway.core.window import WindowPolicy
from gateway.store.db import create_db_engine, upgrade
from gateway.store.sql import Store
from tests.fakes import openai as oa

WINDOW = 2_000
SYSTEM = "You are a test assistant. Keep answers short."
FACT = re.compile(r"FACT-\d+=[A-Z]+")
SUMMARY_MARK = SUMMARY_PROMPT[:40]


def fact_of(turn: int) -> str | None:
    """The earliest turns and every 50th carry a fact the model must not forget."""
    words = {1: "APPLE", 2: "BANANA", 3: "CHERRY"}
    if turn in words:
        return f"FACT-{turn}={words[turn]}"
    return f"FACT-{turn}=ZEBRA" if turn % 50 == 0 else None


def is_summary(body: dict[str, Any]) -> bool:
    return str(body["messages"][0].get("content", "")).startswith(SUMMARY_MARK)


def responder(body: dict[str, Any]) -> oa.Reply | str:
    """The scripted model: summaries carry forward every fact they are shown; a user message
    asking for a lookup gets a tool call first; everything else a short answer."""
    if is_summary(body):
        facts = sorted(set(FACT.findall(body["messages"][1]["content"])), key=lambda f: int(f[5:f.index("=")]))
        return "Facts so far: " + " ".join(facts) + ". The user chatted about the weather in between."
    last = body["messages"][-1]
    if last["role"] == "user" and "[lookup]" in last["content"]:
        return oa.tool_calls(oa.call("lookup", {"q": "weather"}), oa.call("lookup", {"q": "time"}))
    return "Noted. The weather today is mild, with a light breeze from the west and some clouds later on."


@pytest.fixture
def rig(tmp_path, fake_openai):
    fake_openai.reset()
    engine = create_db_engine(f"sqlite:///{tmp_path / 'c.db'}")
    upgrade(engine)
    store = Store(engine)
    tools = ToolRegistry()
    tools.add(Tool("lookup", "Look something up.", {"type": "object", "properties": {"q": {"type": "string"}}},
                   fn=lambda q: f"result for {q}: sunny, 21 degrees, wind 3 m/s", idempotent=True))
    agents = AgentCache(tools, lambda spec: OpenAIChatModel(base_url=spec.base_url, api_key=spec.api_key,
                                                            model=spec.model, max_retries=0, stream=False))
    bridge = AsyncBridge()
    bridge.start()
    policy = WindowPolicy(context_window_tokens=WINDOW)
    runner = TurnRunner(store=store, agents=agents, bridge=bridge, limits=Limits(), history_window=120,
                        system_prompt=SYSTEM, window=policy,
                        spec=AgentSpec("gpt-4o-mini", f"{fake_openai.url}/v1", "sk-test", ("lookup",)))
    yield store, runner, policy
    bridge.stop()
    engine.dispose()


def say(store: Store, runner: TurnRunner, n: int, text: str) -> None:
    msg = InboundMessage(ChatAddress("telegram", "1", "42"), f"m{n}", "dm", Sender("42", "ann"), text)
    assert store.insert_inbound(msg, "dm:u1")
    batch = store.next_pending("dm:u1")
    assert runner.run(batch, 0) == "done"


def turn_text(turn: int) -> str:
    fact = fact_of(turn)
    lookup = " [lookup]" if turn % 7 == 0 else ""
    body = f"Turn {turn}: tell me something about the weather, I am curious about it today.{lookup}"
    return f"Remember this: {fact}. {body}" if fact else body


def test_300_turns_fit_the_window_keep_early_facts_and_stop_growing(rig, fake_openai):
    store, runner, policy = rig
    fake_openai.responder = responder
    started = time.monotonic()
    first_request: dict[int, dict[str, Any]] = {}
    for turn in range(1, 301):
        before = len(fake_openai.requests)
        say(store, runner, turn, turn_text(turn))
        mains = [r for r in fake_openai.requests[before:] if not is_summary(r["json"])]
        first_request[turn] = mains[0]
    elapsed = time.monotonic() - started

    requests = fake_openai.requests
    assert all(r["status"] == 200 for r in requests), [r["status"] for r in requests if r["status"] != 200]
    assert max(r["prompt_tokens"] for r in requests) <= policy.hard_limit < WINDOW
    summaries = [r for r in requests if is_summary(r["json"])]
    assert len(summaries) >= 5

    tokens = {turn: first_request[turn]["prompt_tokens"] for turn in first_request}
    print(f"\ninput tokens per turn: turn 10={tokens[10]}, turn 100={tokens[100]}, turn 300={tokens[300]}; "
          f"max turns 1-100={max(tokens[t] for t in range(1, 101))}, "
          f"max turns 101-300={max(tokens[t] for t in range(101, 301))}; "
          f"{len(summaries)} summary calls, {len(requests)} requests, {elapsed:.1f}s")
    engaged = next(t for t in range(2, 301) if tokens[t] < tokens[t - 1])  # the first compression
    assert engaged < 60
    ceiling = max(tokens[t] for t in range(1, engaged + 20))
    later = max(tokens[t] for t in range(engaged + 20, 301))
    assert later <= ceiling * 1.05  # no growth once it engaged (the summary gains a fact every 50 turns)
    assert max(tokens[t] for t in range(engaged, 301)) <= policy.compress_at

    last = first_request[300]["json"]["messages"]
    assert last[0] == {"role": "system", "content": SYSTEM}  # the system prompt's bytes never change
    assert all(r["json"]["messages"][0]["content"] == SYSTEM for r in requests if not is_summary(r["json"]))
    assert last[1]["role"] == "user" and last[1]["content"].startswith(SUMMARY_HEADER)
    for fact in ("FACT-1=APPLE", "FACT-2=BANANA", "FACT-3=CHERRY", "FACT-50=ZEBRA", "FACT-250=ZEBRA"):
        assert fact in last[1]["content"]
    assert "Turn 300" in last[-1]["content"]

    session_id = store.current_session_id("dm:u1")
    assert session_id is not None
    summary = store.latest_summary(session_id)
    assert summary is not None and "FACT-1=APPLE" in summary.text
    with store.engine.connect() as conn:  # the summary calls' usage is kept with each summary
        costs = conn.exec_driver_sql("SELECT prompt_tokens, completion_tokens FROM summaries").all()
    assert len(costs) == len(summaries) and all(p > 0 and c > 0 for p, c in costs)
    with store.engine.connect() as conn:  # and counted once each in usage, for the turn's chat
        counted = conn.exec_driver_sql("SELECT prompt_tokens, completion_tokens, chat_key FROM usage "
                                       "WHERE call_key LIKE 'summary:%'").all()
    assert sorted((p, c) for p, c, _ in counted) == sorted(tuple(c) for c in costs)
    assert {chat for _, _, chat in counted} == {"telegram:1:42"}
    transcript = store.transcript(session_id)
    assert sum(1 for m in transcript if m.role == "user") == 300  # the transcript keeps everything


def test_a_failing_summary_call_does_not_fail_the_turn(rig, fake_openai):
    store, runner, policy = rig

    def failing(body: dict[str, Any]) -> oa.Reply | str:
        return oa.error(500, "The server had an error", "server_error") if is_summary(body) else responder(body)

    fake_openai.responder = failing
    for turn in range(1, 61):
        say(store, runner, turn, turn_text(turn))
    requests = fake_openai.requests
    mains = [r for r in requests if not is_summary(r["json"])]
    assert any(r["status"] == 500 for r in requests if is_summary(r["json"]))
    assert all(r["status"] == 200 for r in mains)
    assert max(r["prompt_tokens"] for r in mains) <= policy.hard_limit
    assert max(r["prompt_tokens"] for r in mains if r["json"]["messages"][-1]["role"] == "user") <= policy.compress_at
    assert sum(is_summary(r["json"]) for r in requests) == 1  # a failure is not retried every turn
    session_id = store.current_session_id("dm:u1")
    assert session_id is not None and store.latest_summary(session_id) is None
