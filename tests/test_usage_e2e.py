"""Usage accounting end to end: the fake model reports known token figures (cached prompt tokens
included) in each of the shapes servers stream them in; the gateway counts each step once, and
``/status``, the admin session page and ``/metrics`` show exactly those figures and their cost."""

from __future__ import annotations

import re

import pytest

from tests.conftest import gateway_config, start_gateway
from tests.fakes import openai as oa
from tests.helpers import wait_until
from tests.test_web_admin import ADMIN, Operator
from tests.web_client import WebClient

PRICE = {"input": 10.0, "cached_input": 1.0, "output": 100.0}  # USD per 1M tokens, round numbers
STEP_1 = oa.usage(1500, 20, cached_tokens=1000)  # $ (500*10 + 1000*1 + 20*100) / 1M = 0.008
STEP_2 = oa.usage(1700, 50, cached_tokens=1500)  # $ (200*10 + 1500*1 + 50*100) / 1M = 0.0085
TURN_COST = "$0.0165"


def base_of(gateway) -> str:
    return f"http://127.0.0.1:{gateway.http_port}"


@pytest.mark.parametrize("shape", oa.USAGE_SHAPES)
async def test_reported_usage_is_counted_once_per_step_and_shown_as_reported(
        shape, tmp_path, fake_openai, page_server, running):
    fake_openai.reset()
    fake_openai.script(
        oa.tool_calls(oa.call("web_fetch", {"url": f"{page_server.url}/page"}), usage=STEP_1, usage_shape=shape),
        oa.text("The codename is amber-falcon-42.", pieces=6, usage=STEP_2, usage_shape=shape))
    config = gateway_config(tmp_path, fake_openai, web=ADMIN, agent={"prices": {"gpt-4o-mini": PRICE}})
    gateway = await start_gateway(config, running)
    base = base_of(gateway)
    page, operator = WebClient(base), Operator(base)
    try:
        await page.open()
        page.listen()
        await page.say("what is the codename on that page?")
        await wait_until(lambda: page.of("row", lambda e: e["role"] == "assistant" and "amber" in e["text"]),
                         timeout=20, what="the answer")
        reported = [r["usage"] for r in fake_openai.requests]
        assert [(u["prompt_tokens"], u["completion_tokens"], u["prompt_tokens_details"]["cached_tokens"])
                for u in reported] == [(1500, 20, 1000), (1700, 50, 1500)]
        assert fake_openai.requests[0]["json"]["stream_options"] == {"include_usage": True}

        await page.say("/status")
        await wait_until(lambda: any("Tokens used" in e["text"] for e in page.of("reply")), what="/status")
        status = next(e["text"] for e in page.of("reply") if "Tokens used" in e["text"])
        assert "Tokens used: 3200 in (2500 of them cached), 70 out" in status, status
        assert f"Cost so far: {TURN_COST}" in status, status

        await operator.login()
        _, sessions, _ = await operator.get("/admin/sessions")
        session_id = re.search(r'href="/admin/sessions/([0-9a-f]{32})"', sessions).group(1)
        _, transcript, _ = await operator.get(f"/admin/sessions/{session_id}")
        turn = re.search(r"<h2>Turn .*?<small>(.*?)</small></h2>", transcript, re.DOTALL).group(1)
        assert " ".join(turn.split()) == f"3200 in (2500 cached) / 70 out tokens · {TURN_COST}"
        assert "1500 in (1000 cached) / 20 out" in transcript and "1700 in (1500 cached) / 50 out" in transcript
        assert f"{TURN_COST}" in sessions

        async with page.http.get(f"{base}/metrics") as response:
            metrics = await response.text()
        for kind, figure in (("input", 3200), ("output", 70), ("cached_input", 2500)):
            assert f'gateway_model_tokens_total{{kind="{kind}",model="gpt-4o-mini"}} {figure}.0' in metrics
        assert 'gateway_model_cost_usd_total{model="gpt-4o-mini"} 0.0165' in metrics
    finally:
        await page.close()
        await operator.http.close()
