"""MCP client: a stdio server written for the test (tests/mcp_server.py) exposes two tools; the
model calls one end to end through FakeTelegram. An unreachable HTTP server is reported and
skipped without delaying start-up or the first answer; ``gateway doctor`` lists both."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from agent.mcp import tool_name
from tests.conftest import gateway_config, start_gateway
from tests.fakes import openai as oa
from tests.test_telegram_e2e import dm_update, sends_to, wait_until

SERVER = str(Path(__file__).with_name("mcp_server.py"))


def mcp_config(tmp_path, fake_openai, fake_telegram):
    return gateway_config(tmp_path, fake_openai, fake_telegram, mcp={
        "startup_timeout_s": 5,
        "servers": {"calc": {"command": [sys.executable, SERVER]},
                    "down": {"url": "http://127.0.0.1:9/mcp"}}})


def test_names_fit_the_model_api_rule():
    assert tool_name("github", "create_issue") == "github__create_issue"
    assert tool_name("my server", "do.it") == "my_server__do_it"
    long = tool_name("s" * 40, "t" * 40)
    assert len(long) == 64 and long != tool_name("s" * 40, "t" * 41)


async def test_mcp_tool_discovered_and_called_end_to_end(tmp_path, fake_telegram, fake_openai, running):
    fake_openai.reset()

    def respond(req: dict) -> oa.Reply:
        last = req["messages"][-1]
        if last["role"] == "tool":
            return oa.text("the sum is " + last["content"].split("\n")[1])
        return oa.tool_calls(oa.call("calc__add", {"a": 20, "b": 22}))

    fake_openai.responder = respond
    started = time.monotonic()
    gateway = await start_gateway(mcp_config(tmp_path, fake_openai, fake_telegram), running)
    assert time.monotonic() - started < 8
    status = {s.name: s for s in gateway.mcp.status}
    assert status["calc"].ok and status["calc"].tools == ["calc__add", "calc__shout"]
    assert not status["down"].ok  # reported and skipped
    assert gateway.tools.get("calc__add").side_effect == "external"
    assert gateway.tools.get("calc__shout").side_effect == "read"

    fake_telegram.inject(dm_update("add 20 and 22", 9601, user_id=5559101))
    await wait_until(lambda: len(sends_to(fake_telegram, 5559101)) == 1, what="reply")
    assert sends_to(fake_telegram, 5559101)[0].params["text"] == "the sum is 42"
    names = [t["function"]["name"] for t in fake_openai.requests[0]["json"]["tools"]]
    assert "calc__add" in names and "calc__shout" in names


async def test_mcp_arguments_are_checked_against_the_servers_schema(tmp_path, fake_telegram, fake_openai, running):
    fake_openai.reset()

    def respond(req: dict) -> oa.Reply:
        last = req["messages"][-1]
        if last["role"] == "tool":
            return oa.text(last["content"].split("\n")[0])
        return oa.tool_calls(oa.call("calc__add", {"a": "twenty"}))

    fake_openai.responder = respond
    await start_gateway(mcp_config(tmp_path, fake_openai, fake_telegram), running)
    fake_telegram.inject(dm_update("add", 9602, user_id=5559102))
    await wait_until(lambda: len(sends_to(fake_telegram, 5559102)) == 1, what="reply")
    text = sends_to(fake_telegram, 5559102)[0].params["text"]
    assert text.startswith("Error: invalid arguments for calc__add, nothing was run:")
    assert "'b' is a required property" in text and "'twenty' is not of type 'integer'" in text


async def test_doctor_lists_mcp_servers_and_the_sandbox(tmp_path, fake_telegram, fake_openai, capsys):
    from gateway.doctor import run_doctor

    config = mcp_config(tmp_path, fake_openai, fake_telegram)
    config.tools.workspace = "shell"
    await run_doctor(config)
    out = capsys.readouterr().out
    assert "[ok] mcp calc: 2 tools (calc__add, calc__shout)" in out
    assert "[FAIL] mcp down:" in out
    assert "[ok] workspace: shell" in out
