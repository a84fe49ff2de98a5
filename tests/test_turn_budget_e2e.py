"""A budget ending a turn through the whole gateway: one clear reply, the stop reason and the cost
in the transcript, the budget told to the model in the user message."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from gateway.store.models import MessageRow
from tests.conftest import gateway_config, start_gateway
from tests.fakes import openai as oa
from tests.helpers import wait_until
from tests.test_telegram_e2e import dm_update, sends_to


async def test_iteration_budget_ends_the_turn_with_one_clear_reply(tmp_path, fake_telegram, fake_openai, page_server,
                                                                   running):
    fake_openai.reset()
    fake_openai.responder = lambda req: oa.tool_calls(
        oa.call("web_fetch", {"url": f"{page_server.url}/page?i={len(req['messages'])}"}))
    config = gateway_config(tmp_path, fake_openai, fake_telegram, agent={"iteration_budget": 3})
    gateway = await start_gateway(config, running)
    chat = 5554001
    fake_telegram.inject(dm_update("research forever", 9901, user_id=chat))
    await wait_until(lambda: len(fake_telegram.sent_messages(chat)) == 1, what="stop reply")
    await wait_until(lambda: gateway.store.count_inbox("done") == 1, what="turn done")

    (send,) = sends_to(fake_telegram, chat)
    assert send.params["text"].startswith("⚠️ I stopped before finishing: I reached the iteration budget (3 model "
                                          "calls) for this task. So far I made 3 model calls and ran web_fetch ×3.")
    assert len(fake_openai.requests) == 3
    first_user = fake_openai.requests[0]["json"]["messages"][1]["content"]
    assert "[budget for this task: 3 model calls, 2,000,000 tokens, $1.00, 600 s]" in first_user
    assert "budget" not in fake_openai.requests[0]["json"]["messages"][0]["content"]

    with gateway.engine.connect() as conn:
        rows = conn.execute(select(MessageRow.role, MessageRow.content, MessageRow.meta).order_by(MessageRow.id)).all()
    assert [r.role for r in rows] == ["user"] + ["assistant", "tool"] * 3 + ["assistant"]
    assert rows[-1].content == send.params["text"]
    assert rows[-1].meta["stop_reason"] == "iteration_budget" and rows[-1].meta["task_model_calls"] == 3
    costs = [r.meta["cost_usd"] for r in rows if r.role == "assistant" and "cost_usd" in (r.meta or {})]
    assert len(costs) == 3 and all(c > 0 for c in costs)  # gpt-4o-mini is in the built-in price table
    assert rows[-1].meta["turn_cost_usd"] == pytest.approx(sum(costs), abs=1e-7)
