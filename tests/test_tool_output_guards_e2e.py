"""What a person approves is what runs, and what a tool returns is redacted in every kind of run:
an approval prompt never cuts a call's arguments (a command padded with blanks past the cut hid
its tail from the approver; now blanks are shown as a count and a call too long to show is denied
without asking), and a scheduled report's tool results are redacted as a chat turn's are (a page
echoing the bot token reached the model in a push run)."""

from __future__ import annotations

import re
from typing import Any

from aiohttp import web

from tests.conftest import TEST_TOKEN, PageServer, gateway_config, start_gateway
from tests.fakes import openai as oa
from tests.helpers import wait_until
from tests.test_approvals_e2e import texts
from tests.test_jobs_e2e import MONDAY_9_SHANGHAI, ask
from tests.test_jobs_e2e import texts as job_texts
from tests.test_telegram_e2e import dm_update

USER = 5559201


def _tool_results(fake_openai) -> list[str]:
    return [m["content"] for r in fake_openai.requests if r["json"] for m in r["json"].get("messages", [])
            if m["role"] == "tool"]


async def test_an_approval_prompt_shows_padding_as_a_count_and_a_call_too_long_to_show_is_denied(
        tmp_path, fake_telegram, fake_openai, running):
    padded = "echo 'rendering your chart...'" + " " * 620 + "; cat /proc/self/environ | base64 -w0"
    calls = iter([{"command": padded}, {"command": "echo " + "x" * 2500}])

    def responder(request: dict[str, Any]) -> oa.Reply:
        last = request["messages"][-1]
        if last["role"] == "tool":
            return oa.text("RESULT " + last["content"][:300])
        return oa.tool_calls(oa.call("run_shell", next(calls)))

    fake_openai.reset()
    fake_openai.responder = responder
    config = gateway_config(tmp_path, fake_openai, fake_telegram, access={"allowed_users": [f"telegram:{USER}"]},
                            tools={"workspace": "shell", "workspace_root": str(tmp_path / "ws")},
                            approvals={"require_for": ["write", "external"], "timeout_s": 20})
    await start_gateway(config, running)
    fake_telegram.inject(dm_update("draw me a chart", 9201, user_id=USER))
    await wait_until(lambda: any("/approve" in t for t in texts(fake_telegram, USER)), what="the approval prompt")
    prompt = next(t for t in texts(fake_telegram, USER) if "/approve" in t)
    assert "⟨620 blanks⟩" in prompt and "base64 -w0" in prompt and "…" not in prompt  # the whole command shown

    fake_telegram.inject(dm_update("now the long one", 9202, user_id=USER))  # queued behind the first turn
    deny = re.search(r"/approve (\w+)", prompt)
    assert deny is not None
    fake_telegram.inject(dm_update(f"/deny {deny.group(1)}", 9203, user_id=USER))
    await wait_until(lambda: any("too long for a person to check" in r for r in _tool_results(fake_openai)),
                     what="the long call denied", timeout=30)
    assert sum("/approve" in t for t in texts(fake_telegram, USER)) == 1  # nobody was asked about the long one


class _TokenPage(PageServer):
    """A page that echoes the bot token (a debug dump, an MCP server's error page)."""

    def build_app(self) -> web.Application:
        async def page(_: web.Request) -> web.Response:
            return web.Response(text=f"debug dump: token={TEST_TOKEN} end", content_type="text/plain")

        app = web.Application()
        app.add_routes([web.get("/page", page)])
        return app


async def test_a_scheduled_reports_tool_results_are_redacted_as_a_chat_turns_are(tmp_path, fake_telegram,
                                                                                 fake_openai, running):
    with _TokenPage() as site:
        def responder(request: dict[str, Any]) -> oa.Reply:
            if request["messages"][-1]["role"] == "tool":
                return oa.text("report done")
            return oa.tool_calls(oa.call("web_fetch", {"url": f"{site.url}/page"}))

        fake_openai.reset()
        fake_openai.responder = responder
        config = gateway_config(tmp_path, fake_openai, fake_telegram, scheduler={"reload_interval_s": 0.3})
        gateway = await start_gateway(config, running)
        user = 5559202
        fake_telegram.inject(dm_update("fetch it", 9210, user_id=user))
        await wait_until(lambda: "report done" in job_texts(fake_telegram, user), what="the chat turn's reply")
        created = await ask(fake_telegram, '/schedule "0 9 * * 1-5" Asia/Shanghai daily dump', 9211, user_id=user)
        job = re.search(r"Scheduled report (\w+)", created)
        assert job is not None
        await gateway.pushes.fire(job.group(1), MONDAY_9_SHANGHAI)
        await wait_until(lambda: job_texts(fake_telegram, user).count("report done") >= 2, what="the report",
                         timeout=20)
        results = [r for r in _tool_results(fake_openai) if "debug dump" in r]
        assert len(results) >= 2 and all(TEST_TOKEN not in r and "token=***" in r for r in results), results
