"""Approvals end to end through FakeTelegram: the model calls a write tool, the chat gets an
approval prompt, /approve runs it, /deny and the timeout refuse it (the model is told), only the
requester may decide, and /stop during a pending approval cancels cleanly. Also: configured
secrets never reach the fake model."""

from __future__ import annotations

import asyncio
import re

from sqlalchemy import select

from gateway.store.models import InboxRow, MessageRow, SessionRow
from tests.conftest import TEST_TOKEN, gateway_config, start_gateway
from tests.fakes import openai as oa
from tests.test_telegram_e2e import dm_update, sends_to, wait_until


def command(text: str, message_id: int, user_id: int) -> dict:
    update = dm_update(text, message_id, user_id=user_id)
    update["message"]["entities"] = [{"type": "bot_command", "offset": 0, "length": len(text.split()[0])}]
    return update


def texts(fake, chat_id: int) -> list[str]:
    return [c.params["text"] for c in sends_to(fake, chat_id)]


def write_then_report(req: dict) -> oa.Reply:
    last = req["messages"][-1]
    if last["role"] == "tool":
        return oa.text("tool said: " + last["content"].split("\n")[1 if last["content"].startswith("<") else 0])
    return oa.tool_calls(oa.call("write_file", {"path": "plan.txt", "content": "step 1"}))


REQUESTERS = [f"telegram:{5559001 + i}" for i in range(9)]
"""The users whose turns ask for approval: approved users (open access refuses strangers those tools)."""


def config(tmp_path, fake_openai, fake_telegram, timeout_s: float = 10.0):
    return gateway_config(tmp_path, fake_openai, fake_telegram, access={"allowed_users": REQUESTERS},
                          tools={"workspace": "write", "workspace_root": str(tmp_path / "ws")},
                          approvals={"require_for": ["write", "external"], "timeout_s": timeout_s})


async def prompt_id(fake, chat_id: int) -> str:
    await wait_until(lambda: any("Approval needed" in t for t in texts(fake, chat_id)), what="approval prompt")
    prompt = next(t for t in texts(fake, chat_id) if "Approval needed" in t)
    assert "write_file" in prompt and "plan.txt" in prompt
    return re.search(r"/approve (\w+)", prompt).group(1)


async def test_approve_runs_the_tool_and_the_turn_finishes(tmp_path, fake_telegram, fake_openai, running):
    fake_openai.reset()
    fake_openai.responder = write_then_report
    await start_gateway(config(tmp_path, fake_openai, fake_telegram), running)
    fake_telegram.inject(dm_update("make a plan", 9101, user_id=5559001))
    approval = await prompt_id(fake_telegram, 5559001)
    assert not list((tmp_path / "ws").rglob("plan.txt"))  # nothing ran yet

    fake_telegram.inject(command(f"/approve {approval}", 9102, user_id=5559002))  # someone else: refused
    await wait_until(lambda: any("Only the person" in t for t in texts(fake_telegram, 5559002)), what="refusal")

    fake_telegram.inject(command(f"/approve {approval}", 9103, user_id=5559001))
    await wait_until(lambda: any(t.startswith("tool said") for t in texts(fake_telegram, 5559001)), what="reply")
    sent = texts(fake_telegram, 5559001)
    assert "Approved: running write_file." in sent
    assert sent[-1] == "tool said: Wrote 6 bytes to plan.txt."
    assert [p.read_text() for p in (tmp_path / "ws").rglob("plan.txt")] == ["step 1"]


async def test_deny_tells_the_model_and_nothing_runs(tmp_path, fake_telegram, fake_openai, running):
    fake_openai.reset()
    fake_openai.responder = write_then_report
    await start_gateway(config(tmp_path, fake_openai, fake_telegram), running)
    fake_telegram.inject(dm_update("make a plan", 9201, user_id=5559003))
    approval = await prompt_id(fake_telegram, 5559003)
    fake_telegram.inject(command(f"/deny {approval}", 9202, user_id=5559003))
    await wait_until(lambda: any(t.startswith("tool said") for t in texts(fake_telegram, 5559003)), what="reply")
    assert texts(fake_telegram, 5559003)[-1].startswith("tool said: Denied: the user refused")
    assert not list((tmp_path / "ws").rglob("plan.txt"))
    fake_telegram.inject(command(f"/approve {approval}", 9203, user_id=5559003))  # too late
    await wait_until(lambda: "already closed" in texts(fake_telegram, 5559003)[-1], what="closed")


async def test_timeout_denies(tmp_path, fake_telegram, fake_openai, running):
    fake_openai.reset()
    fake_openai.responder = write_then_report
    await start_gateway(config(tmp_path, fake_openai, fake_telegram, timeout_s=1.0), running)
    fake_telegram.inject(dm_update("make a plan", 9301, user_id=5559004))
    await prompt_id(fake_telegram, 5559004)
    await wait_until(lambda: any(t.startswith("tool said") for t in texts(fake_telegram, 5559004)), what="reply")
    assert texts(fake_telegram, 5559004)[-1].startswith("tool said: Denied: nobody approved write_file within 1 s")
    assert not list((tmp_path / "ws").rglob("plan.txt"))


async def test_stop_during_a_pending_approval_cancels_cleanly(tmp_path, fake_telegram, fake_openai, running):
    fake_openai.reset()
    fake_openai.responder = write_then_report
    gateway = await start_gateway(config(tmp_path, fake_openai, fake_telegram), running)
    fake_telegram.inject(dm_update("make a plan", 9401, user_id=5559005))
    approval = await prompt_id(fake_telegram, 5559005)
    fake_telegram.inject(command("/stop", 9402, user_id=5559005))
    await wait_until(lambda: "Stopped." in texts(fake_telegram, 5559005), what="stopped")
    await wait_until(lambda: gateway.approvals.status(approval) == "cancelled", what="approval cancelled")
    await asyncio.sleep(0.5)
    assert not any(t.startswith("tool said") for t in texts(fake_telegram, 5559005))
    assert not list((tmp_path / "ws").rglob("plan.txt"))


async def test_a_restart_keeps_a_pending_approval_and_its_button(tmp_path, fake_telegram, fake_openai, running):
    """A graceful stop (a deploy) while a call waits for approval: the request stays open, the
    resumed turn waits on it (no second prompt, no new model call), and the old button still
    works. Before, every restart cancelled it and the model answered 'Cancelled' (found by a review)."""
    fake_openai.reset()
    fake_openai.responder = write_then_report
    user = 5559009
    first = await start_gateway(config(tmp_path, fake_openai, fake_telegram, timeout_s=60), running)
    fake_telegram.inject(dm_update("make a plan", 9901, user_id=user))
    approval = await prompt_id(fake_telegram, user)
    await first.stop()
    assert first.approvals.status(approval) == "pending"
    assert len(fake_openai.requests) == 1 and not any(t.startswith("tool said") for t in texts(fake_telegram, user))

    second = await start_gateway(config(tmp_path, fake_openai, fake_telegram, timeout_s=60), running)
    await asyncio.sleep(1.0)  # the turn is resumed and waits on the same request
    assert len(fake_openai.requests) == 1 and second.approvals.status(approval) == "pending"
    assert not list((tmp_path / "ws").rglob("plan.txt"))
    fake_telegram.inject(command(f"/approve {approval}", 9902, user_id=user))
    await wait_until(lambda: any(t.startswith("tool said") for t in texts(fake_telegram, user)), what="reply")
    sent = texts(fake_telegram, user)
    assert sum("Approval needed" in t for t in sent) == 1
    assert sent[-1] == "tool said: Wrote 6 bytes to plan.txt."
    assert [p.read_text() for p in (tmp_path / "ws").rglob("plan.txt")] == ["step 1"]
    resumed = fake_openai.requests[1]["json"]["messages"]
    assert [m["role"] for m in resumed] == ["system", "user", "assistant", "tool"]


async def test_secrets_never_reach_the_model(tmp_path, fake_telegram, fake_openai, running, monkeypatch):
    fake_openai.reset()
    monkeypatch.setenv("GATEWAY_TEST_MCP_HEADER", "mcp-header-secret-987654")

    def respond(req: dict) -> oa.Reply:
        if req["messages"][-1]["role"] == "tool":
            return oa.text("read it")
        return oa.delay(0.5, oa.tool_calls(oa.call("read_file", {"path": "leak.txt"})))  # time to plant it

    fake_openai.responder = respond
    cfg = config(tmp_path, fake_openai, fake_telegram)
    cfg.mcp.servers.clear()
    from gateway.core.config import McpServerConfig

    cfg.mcp.servers["down"] = McpServerConfig(url="http://127.0.0.1:9/mcp",
                                              headers_env={"Authorization": "GATEWAY_TEST_MCP_HEADER"})
    cfg.mcp.startup_timeout_s = 2
    gateway = await start_gateway(cfg, running)
    workspace = tmp_path / "ws"
    # A tool result that contains secrets: a file in the session's workspace (written by the session).
    fake_telegram.inject(dm_update(f"my token is {TEST_TOKEN} and sk-test-please", 9501, user_id=5559006))
    await wait_until(lambda: len(fake_openai.requests) >= 1, what="first model call")
    with gateway.engine.connect() as conn:
        session_id = conn.execute(select(SessionRow.id)).scalar_one()
    session_dir = workspace / session_id
    session_dir.mkdir(parents=True, exist_ok=True)
    (session_dir / "leak.txt").write_text(f"token={TEST_TOKEN} header=mcp-header-secret-987654 slack=xoxb-fake-0001")
    await wait_until(lambda: "read it" in texts(fake_telegram, 5559006), what="reply")
    bodies = [str(r["json"]) for r in fake_openai.requests]
    for secret in (TEST_TOKEN, "mcp-header-secret-987654", "xoxb-fake-0001"):
        assert all(secret not in body for body in bodies), secret
    assert "***" in bodies[-1]
    assert any(s.name == "down" and not s.ok for s in gateway.mcp.status)
    # Nor is a pasted secret stored: not in the transcript, not even in the inbox's copy.
    with gateway.engine.connect() as conn:
        stored = [str(row) for row in conn.execute(select(InboxRow.payload)).scalars()]
        stored += [str(row) for row in conn.execute(select(MessageRow.content)).scalars()]
    assert any("my token is ***" in row for row in stored)
    assert all(TEST_TOKEN not in row and "sk-test-please" not in row for row in stored)


async def test_no_secret_in_any_log_record_at_debug(tmp_path, fake_telegram, fake_openai, running, caplog):
    """The whole approve flow (platform calls carry the bot token in their URLs) at DEBUG, through
    the filter every production handler carries."""
    import logging

    from gateway.ops.logs import RedactSecrets

    fake_openai.reset()
    fake_openai.responder = write_then_report
    cfg = config(tmp_path, fake_openai, fake_telegram)
    caplog.handler.addFilter(RedactSecrets(cfg.secret_values()))
    caplog.set_level(logging.DEBUG)
    try:
        await start_gateway(cfg, running)
        fake_telegram.inject(dm_update(f"plan, token {TEST_TOKEN}", 9701, user_id=5559007))
        approval = await prompt_id(fake_telegram, 5559007)
        fake_telegram.inject(command(f"/approve {approval}", 9702, user_id=5559007))
        await wait_until(lambda: any(t.startswith("tool said") for t in texts(fake_telegram, 5559007)), what="reply")
    finally:
        records = list(caplog.records)
        caplog.handler.filters.clear()
    assert records
    secrets = [s for s in cfg.secret_values() if len(s) >= 6]
    assert TEST_TOKEN in secrets
    for record in records:
        text = record.getMessage() + (record.exc_text or "")
        assert not any(s in text for s in secrets), text[:200]


def test_policy_flags_dangerous_shell_commands_even_when_write_is_free():
    from agent.tools import Tool
    from gateway.core.config import ApprovalsConfig
    from gateway.tools.approvals import ApprovalPolicy

    patterns = tuple(re.compile(p) for p in ApprovalsConfig().dangerous_shell_patterns)
    policy = ApprovalPolicy(require_for=frozenset({"external"}), dangerous_shell=patterns)
    shell = Tool("run_shell", "d", {"type": "object"}, fn=lambda command: "", side_effect="write")
    assert not policy.needs(shell, {"command": "ls -la"})
    assert policy.needs(shell, {"command": "rm -rf build"})
    assert policy.needs(shell, {"command": "curl http://x"})
    forced = Tool("t", "d", {"type": "object"}, fn=lambda: "", side_effect="none", needs_approval=True)
    assert policy.needs(forced, {})


def button_press(fake, chat_id: int, presser: int, data: str, query_id: str) -> dict:
    from tests.conftest import fixture

    update = fixture("telegram", "callback_query.json")
    update.pop("update_id")
    query = update["callback_query"]
    query["id"], query["data"] = query_id, data
    query["from"]["id"] = presser
    query["message"]["chat"]["id"] = chat_id
    return update


async def test_telegram_buttons_approve_and_a_strangers_press_is_refused(tmp_path, fake_telegram, fake_openai,
                                                                        running):
    fake_openai.reset()
    fake_openai.responder = write_then_report
    await start_gateway(config(tmp_path, fake_openai, fake_telegram), running)
    fake_telegram.inject(dm_update("make a plan", 9801, user_id=5559008))
    approval = await prompt_id(fake_telegram, 5559008)
    prompt = next(c for c in sends_to(fake_telegram, 5559008) if "Approval needed" in c.params["text"])
    keyboard = prompt.params["reply_markup"]
    keyboard = keyboard if isinstance(keyboard, dict) else __import__("json").loads(keyboard)
    buttons = keyboard["inline_keyboard"][0]
    assert [(b["text"], b["callback_data"]) for b in buttons] == [
        ("✅ Approve", f"/approve {approval}"), ("❌ Deny", f"/deny {approval}")]

    fake_telegram.inject(button_press(fake_telegram, 5559008, 5559099, f"/approve {approval}", "q-stranger"))
    await wait_until(lambda: any("Only the person" in t for t in texts(fake_telegram, 5559008)), what="refusal")
    assert not list((tmp_path / "ws").rglob("plan.txt"))

    fake_telegram.inject(button_press(fake_telegram, 5559008, 5559008, f"/approve {approval}", "q-owner"))
    await wait_until(lambda: any(t.startswith("tool said") for t in texts(fake_telegram, 5559008)), what="reply")
    assert texts(fake_telegram, 5559008)[-1] == "tool said: Wrote 6 bytes to plan.txt."
    assert len(fake_telegram.calls("answerCallbackQuery")) >= 2
