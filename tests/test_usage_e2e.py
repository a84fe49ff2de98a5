"""Usage accounting end to end: the fake model reports known token figures (cached prompt tokens
included) in each of the shapes servers stream them in; the gateway counts each step once, and
``/status``, the admin session page and ``/metrics`` show exactly those figures and their cost."""

from __future__ import annotations

import re
from datetime import UTC, datetime

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


async def test_admin_usage_page_charts_cost_per_day_and_turns_per_platform(tmp_path, fake_openai, running):
    fake_openai.reset()
    fake_openai.responder = lambda request: oa.text("fine", usage=STEP_2)  # $0.0085 each
    config = gateway_config(tmp_path, fake_openai, web=ADMIN, agent={"prices": {"gpt-4o-mini": PRICE}})
    gateway = await start_gateway(config, running)
    base = base_of(gateway)
    page, operator = WebClient(base), Operator(base)
    try:
        status, _, response = await operator.get("/admin/usage")  # not logged in: to the login page
        assert status == 302 and response.headers["Location"].startswith("/admin/login")
        await page.open()
        page.listen()
        for number in range(2):
            await page.say(f"question {number}")
            await wait_until(lambda n=number: len([e for e in page.of("row") if e["role"] == "assistant"]) == n + 1,
                             timeout=20, what="the answer")
        await operator.login()
        status, html, _ = await operator.get("/admin/usage")
        assert status == 200
        today = datetime.now(UTC).date().isoformat()
        cost_chart = re.search(r'<figure class="chart" id="cost-chart">(.*?)</figure>', html, re.DOTALL).group(1)
        assert cost_chart.startswith("<svg") and f"<title>{today}: $0.0170</title>" in cost_chart
        assert cost_chart.count("<rect") == 30  # one bar a day, the last 30 days
        turns_chart = re.search(r'<figure class="chart" id="turns-chart">(.*?)</figure>', html, re.DOTALL).group(1)
        assert f"<title>{today} web: 2</title>" in turns_chart and ">web</text>" in turns_chart
        assert "<script" not in html
        assert re.search(r"<td>default</td><td><code>gpt-4o-mini</code></td><td>2</td><td>3400</td><td>3000</td>"
                         r"<td>100</td><td>\$0\.0170</td>", html), html

        async with page.http.get(f"{base}/metrics") as response:
            metrics = await response.text()
        assert 'gateway_provider_cost_usd_total{model="gpt-4o-mini",provider="default"} 0.017' in metrics
        assert 'gateway_provider_tokens_total{kind="cached_input",model="gpt-4o-mini",provider="default"} 3000.0' \
            in metrics
    finally:
        await page.close()
        await operator.http.close()
