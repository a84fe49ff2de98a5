"""MCP client: a stdio server written for the test (tests/mcp_server.py) exposes its tools; the
model calls them end to end through FakeTelegram. An unreachable HTTP server is reported and
skipped without delaying start-up or the first answer; ``gateway doctor`` lists both. A server
that crashes during a call, hangs, or exits between calls gives a clear tool error (or none, when
it was already gone before the call) within its timeout, starts again on the next call, and no
server process is left behind (checked in /proc)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

from agent.mcp import tool_name
from tests.conftest import gateway_config, start_gateway
from tests.fakes import openai as oa
from tests.test_telegram_e2e import dm_update, sends_to, wait_until

SERVER = str(Path(__file__).with_name("mcp_server.py"))
TOOLS = ["calc__add", "calc__shout", "calc__pid", "calc__crash", "calc__hang"]


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
    assert status["calc"].ok and status["calc"].tools == TOOLS
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
    from gateway.app.doctor import run_doctor

    config = mcp_config(tmp_path, fake_openai, fake_telegram)
    config.tools.workspace = "shell"
    await run_doctor(config)
    out = capsys.readouterr().out
    assert f"[ok] mcp calc: 5 tools ({', '.join(TOOLS)})" in out
    assert "[FAIL] mcp down:" in out
    assert "[ok] workspace: shell" in out


# ---------------------------------------------------------------- a server that crashes, hangs, exits


def server_children() -> list[tuple[int, str]]:
    """(pid, state) of this process's children running tests/mcp_server.py, zombies included
    (an exited child nobody reaped is left behind too)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]
        if int(ppid) == os.getpid() and (b"mcp_server.py" in cmdline or state == "Z"):
            found.append((int(entry), state))
    return found


def gone(pid: int) -> bool:
    """The process no longer exists (it exited and was reaped)."""
    return not os.path.exists(f"/proc/{pid}")


def tool_answer(request: dict) -> oa.Reply:
    """``call NAME`` -> the model calls ``calc__NAME``; after the result it answers with the result's
    text (the untrusted-output wrapper and the budget note left out)."""
    last = request["messages"][-1]
    if last["role"] == "tool":
        lines = [line for line in last["content"].splitlines()
                 if line and not line.startswith(("<tool_output", "</tool_output", "[budget"))]
        return oa.text("\n".join(lines))
    name = last["content"].split("call ", 1)[1].split()[0]
    return oa.tool_calls(oa.call(f"calc__{name}", {"a": 20, "b": 22} if name == "add" else {}))


class Chat:
    """One Telegram DM with the gateway: ``ask`` sends a line and returns the reply's text."""

    def __init__(self, fake_telegram, user_id: int) -> None:
        self.fake, self.user_id, self.message_id = fake_telegram, user_id, user_id % 10_000 * 100

    async def ask(self, text: str, timeout: float = 20) -> str:
        before = len(sends_to(self.fake, self.user_id))
        self.message_id += 1
        self.fake.inject(dm_update(text, self.message_id, user_id=self.user_id))
        await wait_until(lambda: len(sends_to(self.fake, self.user_id)) > before, timeout=timeout, what=text)
        return sends_to(self.fake, self.user_id)[before].params["text"]


async def start_calc(tmp_path, fake_openai, fake_telegram, running, timeout_s: float):
    fake_openai.reset()
    fake_openai.responder = tool_answer
    config = gateway_config(tmp_path, fake_openai, fake_telegram, mcp={
        "startup_timeout_s": 10, "servers": {"calc": {"command": [sys.executable, SERVER], "timeout_s": timeout_s}}})
    return await start_gateway(config, running)


async def stop_and_check_no_server_left(gateway, running) -> None:
    running.remove(gateway)
    await gateway.stop()
    assert server_children() == []


async def test_a_server_that_crashes_during_a_call_errors_at_once_and_starts_again(
        tmp_path, fake_telegram, fake_openai, running):
    gateway = await start_calc(tmp_path, fake_openai, fake_telegram, running, timeout_s=60)
    chat = Chat(fake_telegram, 5559201)
    first = int(await chat.ask("call pid"))
    # Answered long before the server's 60 s timeout: the closed connection is the answer.
    assert await chat.ask("call crash") == (
        "Error: calc__crash failed: McpUnavailable: MCP server calc stopped while running crash (connection "
        "closed); it starts again on the next call (it may or may not have taken effect).")
    await wait_until(lambda: gone(first), what="the crashed server reaped")
    second = int(await chat.ask("call pid"))
    assert second != first and not gone(second)
    assert await chat.ask("call add") == "42"
    await stop_and_check_no_server_left(gateway, running)
    assert gone(second)


async def test_a_server_that_hangs_is_stopped_after_its_timeout_and_started_again(
        tmp_path, fake_telegram, fake_openai, running):
    gateway = await start_calc(tmp_path, fake_openai, fake_telegram, running, timeout_s=2)
    chat = Chat(fake_telegram, 5559202)
    first = int(await chat.ask("call pid"))
    assert await chat.ask("call hang") == (
        "Error: calc__hang failed: McpUnavailable: MCP server calc did not answer hang within 2 s; the server "
        "was stopped and starts again on the next call (it may or may not have taken effect).")
    await wait_until(lambda: gone(first), what="the hung server killed and reaped")
    assert await chat.ask("call add") == "42"
    second = int(await chat.ask("call pid"))
    assert second != first
    await stop_and_check_no_server_left(gateway, running)


async def test_a_server_that_exited_between_calls_is_started_again_without_an_error(
        tmp_path, fake_telegram, fake_openai, running):
    gateway = await start_calc(tmp_path, fake_openai, fake_telegram, running, timeout_s=10)
    chat = Chat(fake_telegram, 5559203)
    first = int(await chat.ask("call pid"))
    os.kill(first, signal.SIGKILL)  # killed from outside (the OOM killer, an operator), while idle
    await wait_until(lambda: gone(first), what="the killed server reaped by the gateway")
    second = int(await chat.ask("call pid"))  # a number, not an error: re-initialised before the call
    assert second != first
    await stop_and_check_no_server_left(gateway, running)


async def test_shutting_down_during_a_hung_call_stops_and_reaps_the_server():
    from agent.bridge import AsyncBridge
    from agent.mcp import McpClients, McpServerSpec

    bridge = AsyncBridge()
    bridge.start()
    clients = McpClients([McpServerSpec("calc", command=[sys.executable, SERVER], timeout_s=60)], bridge)
    tools = {tool.name: tool for tool in await clients.discover(10)}

    def on_bridge(coro):
        return asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, bridge.loop))

    pid = int(await on_bridge(tools["calc__pid"].fn()))
    hung = on_bridge(tools["calc__hang"].fn())
    await asyncio.sleep(0.3)  # let the request reach the server (the test holds either way)
    await asyncio.to_thread(bridge.stop)  # what Gateway.stop does, with the bridge's default 5 s
    assert gone(pid) and server_children() == []
    assert hung.done()


_STDERR_SCRIPT = """
import asyncio, sys
from agent.bridge import AsyncBridge
from agent.mcp import McpClients, McpServerSpec
from gateway.ops.logs import setup_logging

SECRET = sys.argv[2]
setup_logging("INFO", [SECRET])
bridge = AsyncBridge()
bridge.start()
clients = McpClients([McpServerSpec("calc", command=[sys.executable, sys.argv[1]], timeout_s=10,
                                    env={"MCP_TEST_STDERR": "token " + SECRET + " and sk-" + "a" * 30})], bridge)

async def main():
    names = [tool.name for tool in await clients.discover(10)]
    print("tools:", len(names), flush=True)

asyncio.run(main())
bridge.stop()
"""


def test_what_a_server_prints_on_stderr_is_logged_with_secrets_masked():
    """A stdio server's stderr goes through the gateway's redacting log handler, one record per
    line, not straight to the gateway's stderr: a server that echoes its token leaks nothing."""
    import subprocess

    secret = "s3cret-mcp-token-0123456789"
    done = subprocess.run([sys.executable, "-c", _STDERR_SCRIPT, SERVER, secret], capture_output=True, text=True,
                          timeout=60)
    assert "tools: 5" in done.stdout, done.stderr
    assert "MCP server calc stderr: starting with token *** and sk-***" in done.stderr
    assert secret not in done.stderr and "sk-aaaa" not in done.stderr
