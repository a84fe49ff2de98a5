"""Usage across a failover: one turn's first step answered by the primary provider, its second by
the fallback after the primary's 500; each call is counted once under the provider and model that
answered it, at that model's price, in ``usage``, ``/usage`` and the per-provider counters."""

from __future__ import annotations

import os

from sqlalchemy import select

from gateway.store.models import UsageRow
from tests.conftest import gateway_config, start_gateway
from tests.fakes import openai as oa
from tests.helpers import wait_until
from tests.test_limits_e2e import command, texts
from tests.test_telegram_e2e import dm_update

os.environ["GATEWAY_TEST_PRIMARY_KEY"] = "sk-primary-0001"
os.environ["GATEWAY_TEST_BACKUP_KEY"] = "sk-backup-0002"


async def test_a_fallback_call_is_counted_under_the_provider_that_answered(tmp_path, fake_telegram, running):
    with oa.FakeOpenAI(api_key="sk-primary-0001", models=("gpt-4o",)) as primary, \
            oa.FakeOpenAI(api_key="sk-backup-0002", models=("qwen2.5:7b",)) as backup:
        primary.script(
            oa.tool_calls(oa.call("update_plan", {"steps": [{"step": "answer", "status": "in_progress"}]}),
                          usage=oa.usage(2000, 45, cached_tokens=1000)),
            oa.error(500, "The server had an error while processing your request.", "server_error"))
        backup.script(oa.text("Answered by the backup.", usage=oa.usage(2100, 30)))
        llm = {"providers": [
            {"name": "primary", "base_url": f"{primary.url}/v1", "api_key_env": "GATEWAY_TEST_PRIMARY_KEY",
             "models": {"gpt-4o": {"input": 2.5, "cached_input": 1.25, "output": 10}}},
            {"name": "backup", "base_url": f"{backup.url}/v1", "api_key_env": "GATEWAY_TEST_BACKUP_KEY",
             "models": {"qwen2.5:7b": {"input": 0.1, "output": 0.2}}}],
            "route": ["primary:gpt-4o", "backup:qwen2.5:7b"]}
        gateway = await start_gateway(gateway_config(tmp_path, primary, fake_telegram, llm=llm), running)
        chat = 5571041
        fake_telegram.inject(dm_update("hello", 501, user_id=chat))
        await wait_until(lambda: "Answered by the backup." in texts(fake_telegram, chat), timeout=20,
                         what="the fallback's answer")  # after the plan message update_plan posts
        assert [r["status"] for r in primary.requests] == [200, 500] and len(backup.requests) == 1
        with gateway.engine.connect() as conn:
            rows = conn.execute(select(UsageRow.provider, UsageRow.model, UsageRow.prompt_tokens,
                                       UsageRow.cached_tokens, UsageRow.completion_tokens, UsageRow.cost_usd)
                                .order_by(UsageRow.id)).all()
        # primary: (1000*2.5 + 1000*1.25 + 45*10) / 1M = $0.0042; backup: (2100*0.1 + 30*0.2) / 1M = $0.000216
        assert [tuple(r) for r in rows] == [("primary", "gpt-4o", 2000, 1000, 45, 0.0042),
                                            ("backup", "qwen2.5:7b", 2100, 0, 30, 0.000216)]
        fake_telegram.inject(command("/usage", 502, chat))
        await wait_until(lambda: any(t.startswith("Your usage") for t in texts(fake_telegram, chat)), timeout=15,
                         what="/usage")
        shown = next(t for t in texts(fake_telegram, chat) if t.startswith("Your usage"))
        assert "• gpt-4o (primary): $0.0042 · 2000 in (1000 cached), 45 out" in shown, shown
        assert "• qwen2.5:7b (backup): $0.0002 · 2100 in (0 cached), 30 out" in shown, shown
        assert "$0.0044 · 4100 tokens in (1000 of them cached), 75 out · 2 model calls" in shown, shown
        metrics = (await gateway._metrics()).decode()
        assert 'gateway_provider_cost_usd_total{model="gpt-4o",provider="primary"} 0.0042' in metrics
        assert 'gateway_provider_cost_usd_total{model="qwen2.5:7b",provider="backup"} 0.000216' in metrics
