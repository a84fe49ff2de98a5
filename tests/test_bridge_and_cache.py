"""Async tools from many worker threads share the one bridge loop; the agent cache reuses
instances by signature."""

from __future__ import annotations

import asyncio
import sys
import threading

import pytest

from agent.bridge import AsyncBridge
from agent.budget import Limits
from agent.cache import AgentCache, AgentSpec
from agent.context import RunContext
from agent.loop import run_turn
from agent.model import OpenAIChatModel
from agent.tools import Tool, ToolRegistry
from agent.web import WebFetcher
from tests.fakes import openai as oa


def test_async_tools_from_many_worker_threads_run_on_the_one_bridge_loop(fake_openai, page_server, caplog):
    fake_openai.reset()
    problems: list[str] = []
    old_hook, old_thread_hook = sys.unraisablehook, threading.excepthook
    sys.unraisablehook = lambda u: problems.append(f"{u.exc_type.__name__}: {u.exc_value}")
    threading.excepthook = lambda a: problems.append(f"{a.exc_type.__name__}: {a.exc_value}")
    bridge = AsyncBridge()
    bridge.start()
    seen: list[tuple[int, str, str]] = []

    async def where(ctx: RunContext) -> str:
        await asyncio.sleep(0.01)
        seen.append((id(asyncio.get_running_loop()), threading.current_thread().name, ctx.session_id))
        return "here"

    tools = ToolRegistry()
    tools.add(Tool("where", "Where am I?", {"type": "object", "properties": {}}, fn=where, is_async=True,
                   takes_context=True))
    tools.add(WebFetcher(bridge, allow_private=True).tool())
    url = f"{page_server.url}/page"

    def respond(req):
        if req["messages"][-1]["role"] == "tool":
            return oa.text("done")
        return oa.tool_calls(oa.call("where", {}), oa.call("web_fetch", {"url": url}))

    fake_openai.responder = respond
    model = OpenAIChatModel(base_url=f"{fake_openai.url}/v1", api_key="sk-test", model="gpt-4o-mini", max_retries=0)
    outcomes: dict[int, str] = {}

    def worker(n: int) -> None:
        outcome = run_turn(system_prompt="s", history=[{"role": "user", "content": f"go {n}"}], model=model,
                           tools=tools, bridge=bridge, limits=Limits(), record=lambda *a: None,
                           context=RunContext(session_id=f"session-{n}"))
        outcomes[n] = outcome.reply

    try:
        threads = [threading.Thread(target=worker, args=(n,), name=f"turn-{n}") for n in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert outcomes == {n: "done" for n in range(8)}
        assert {loop for loop, _, _ in seen} == {id(bridge.loop)}
        assert {name for _, name, _ in seen} == {"async-bridge"}
        assert sorted(s for _, _, s in seen) == sorted(f"session-{n}" for n in range(8))
        fetched = [m for r in fake_openai.requests for m in r["json"]["messages"][-2:]
                   if m["role"] == "tool" and "amber-falcon-42" in m["content"]]
        assert len(fetched) == 8  # one aiohttp session, on the bridge loop, served every thread
    finally:
        bridge.stop()
        sys.unraisablehook, threading.excepthook = old_hook, old_thread_hook
    assert problems == []
    assert "Event loop is closed" not in caplog.text and "Unclosed client session" not in caplog.text


def test_bridge_run_from_the_bridge_loop_is_refused():
    bridge = AsyncBridge()
    bridge.start()
    try:
        async def nested() -> None:
            bridge.run(asyncio.sleep(0), 1)

        with pytest.raises(RuntimeError, match="from the bridge loop"):
            bridge.run(nested(), 5)
    finally:
        bridge.stop()


def test_agent_cache_reuses_by_signature_and_rebuilds_on_change():
    catalog = ToolRegistry()
    for name in ("a", "b", "c"):
        catalog.add(Tool(name, name, {"type": "object", "properties": {}}, fn=lambda: "x"))
    built: list[AgentSpec] = []

    class StubModel:
        def __init__(self, spec: AgentSpec) -> None:
            self.model = spec.model
            built.append(spec)

        def complete(self, messages, tools, on_text=None):  # pragma: no cover - not called here
            raise AssertionError

    cache = AgentCache(catalog, StubModel)
    spec = AgentSpec(model="m", base_url="http://x/v1", api_key="sk-one", toolset=("b", "a"))
    first = cache.get(spec)
    assert cache.get(AgentSpec(model="m", base_url="http://x/v1/", api_key="sk-one", toolset=("a", "b"))) is first
    assert sorted(first.tools.tools) == ["a", "b"]
    assert cache.get(AgentSpec(model="m", base_url="http://x/v1", api_key="sk-two", toolset=("a", "b"))) is not first
    assert cache.get(AgentSpec(model="m", base_url="http://x/v1", api_key="sk-one", toolset=("a",))) is not first
    assert cache.get(AgentSpec(model="m2", base_url="http://x/v1", api_key="sk-one", toolset=("a", "b"))) is not first
    assert cache.builds == 4 and len(built) == 4
    assert "sk-one" not in repr(spec) and "sk-one" not in spec.signature()
    # The same toolset renders the same schema bytes (prompt cache) whichever agent mounts it.
    assert catalog.subset(["a", "b"]) is first.tools
