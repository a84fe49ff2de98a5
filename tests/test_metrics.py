"""``/metrics`` after an end-to-end Telegram turn with two tool calls; ``/readyz``."""

from __future__ import annotations

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import gateway_config, start_gateway
from tests.fakes import openai as oa
from tests.test_telegram_e2e import dm_update, echo_tool_result, wait_until


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """``(sample name, sorted labels) -> value`` of a Prometheus text exposition."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


async def test_metrics_after_a_turn_with_two_tool_calls(tmp_path, fake_telegram, fake_openai, page_server, running):
    fake_openai.reset()
    url = f"{page_server.url}/page"
    fake_openai.script(oa.tool_calls(oa.call("web_fetch", {"url": url}), oa.call("web_fetch", {"url": url + "?b"})))
    fake_openai.responder = echo_tool_result
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai, fake_telegram), running)
    base = f"http://127.0.0.1:{gateway.http_port}"
    async with aiohttp.ClientSession() as http, http.get(f"{base}/readyz") as resp:
        assert resp.status == 200

    update = dm_update("two pages please", 9301, user_id=5553001)
    update["update_id"] = 880001
    fake_telegram.inject(update)
    fake_telegram.inject(update)  # a redelivery: stored once
    await fake_telegram.wait_for_call("sendMessage", lambda c: int(c.params["chat_id"]) == 5553001, timeout=10)
    await wait_until(lambda: gateway.delivery.sent >= 1 and gateway.duplicates >= 1, what="delivery + duplicate")

    async with aiohttp.ClientSession() as http, http.get(f"{base}/metrics") as resp:
        assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/plain")
        values = samples(await resp.text())

    def value(name: str, **labels: str) -> float:
        return values.get((name, tuple(sorted(labels.items()))), 0.0)

    requests = fake_openai.requests
    assert len(requests) == 2
    prompt = sum(r["prompt_tokens"] for r in requests)
    assert value("gateway_inbound_messages_total", platform="telegram") == 1
    assert value("gateway_inbound_duplicates_total", platform="telegram") == 1
    assert value("gateway_turns_total", outcome="done", stop_reason="stop") == 1
    assert value("gateway_tool_calls_total", tool="web_fetch", outcome="ok") == 2
    assert value("gateway_model_call_duration_seconds_count", model="gpt-4o-mini", outcome="ok") == 2
    assert value("gateway_model_tokens_total", model="gpt-4o-mini", kind="input") == prompt
    assert value("gateway_model_tokens_total", model="gpt-4o-mini", kind="output") > 0
    cost = value("gateway_model_cost_usd_total", model="gpt-4o-mini")
    output = value("gateway_model_tokens_total", model="gpt-4o-mini", kind="output")
    cached = value("gateway_model_tokens_total", model="gpt-4o-mini", kind="cached_input")
    assert abs(cost - ((prompt - cached) * 0.15 + cached * 0.075 + output * 0.60) / 1e6) < 1e-12
    assert value("gateway_turn_duration_seconds_count") == 1
    assert value("gateway_delivery_sends_total", platform="telegram") == 1
    assert value("gateway_inbox_pending") == 0
    assert value("gateway_deliveries_unconfirmed") == 0
    assert ("gateway_active_leases", ()) in values


async def test_readyz_reports_not_ready_after_stop(tmp_path, fake_openai, running):
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai), running)
    assert await gateway._ready()
    gateway.started = False  # as during shutdown: adapters no longer started
    assert not await gateway._ready()
