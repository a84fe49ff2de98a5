"""Providers and routes end to end: a real gateway with a route over several fake OpenAI-compatible
servers (each with its own key), Telegram through python-telegram-bot against its fake.

A 429 on the primary is answered by the fallback and the cooldown holds for the next turn (the
trace, the transcript and ``/metrics`` name who answered); a "context too long" 400 is compressed
and retried once on the same model, never failed over; a 401 marks the provider down (logged once,
on the Health page, and ``gateway doctor`` says so); a stream cut after 3 chunks ends as one reply,
the fallback's, in the preview's place; the circuit opens and half-opens; a fallback that lacks
parallel tool calls and ``stream_options`` gets a request it accepts."""

from __future__ import annotations

import itertools
import logging
import os
import re
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from sqlalchemy import select

from gateway.bus.compression import SUMMARY_HEADER, SUMMARY_PROMPT
from gateway.delivery.streaming import PREVIEW_SUFFIX
from gateway.store.models import MessageRow, SummaryRow
from tests.conftest import gateway_config, start_gateway
from tests.fakes import openai as oa
from tests.helpers import wait_until
from tests.test_telegram_e2e import dm_update, sends_to
from tests.test_web_admin import ADMIN, Operator

os.environ["GATEWAY_TEST_PRIMARY_KEY"] = "sk-primary-0001"
os.environ["GATEWAY_TEST_BACKUP_KEY"] = "sk-backup-0002"
os.environ["GATEWAY_TEST_WRONG_KEY"] = "sk-wrong-key-0003"

EXPORTER = InMemorySpanExporter()
_provider = trace.get_tracer_provider()
if not isinstance(_provider, TracerProvider):
    _provider = TracerProvider()
    trace.set_tracer_provider(_provider)
_provider.add_span_processor(SimpleSpanProcessor(EXPORTER))


@pytest.fixture(scope="module")
def primary() -> Iterator[oa.FakeOpenAI]:
    with oa.FakeOpenAI(api_key="sk-primary-0001", models=("gpt-4o",)) as fake:
        yield fake


@pytest.fixture(scope="module")
def backup() -> Iterator[oa.FakeOpenAI]:
    with oa.FakeOpenAI(api_key="sk-backup-0002", models=("qwen2.5:7b",)) as fake:
        yield fake


@pytest.fixture(autouse=True)
def fresh(primary, backup, fake_telegram) -> None:
    primary.reset()
    backup.reset()
    primary.context_window = None
    backup.lacks = frozenset()
    EXPORTER.clear()


def providers(primary, backup, *, primary_key: str = "GATEWAY_TEST_PRIMARY_KEY",
              backup_lacks: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"providers": [
        {"name": "primary", "base_url": f"{primary.url}/v1", "api_key_env": primary_key,
         "models": {"gpt-4o": {"context_window_tokens": 128_000, "input": 2.5, "cached_input": 1.25, "output": 10}}},
        {"name": "backup", "base_url": f"{backup.url}/v1", "api_key_env": "GATEWAY_TEST_BACKUP_KEY",
         "lacks": list(backup_lacks), "models": {"qwen2.5:7b": {"context_window_tokens": 32_768}}}],
        "route": ["primary:gpt-4o", "backup:qwen2.5:7b"]}


def config(tmp_path, primary, backup, fake_telegram, llm: dict[str, Any] | None = None, **sections):
    return gateway_config(tmp_path, primary, fake_telegram, llm={**providers(primary, backup), **(llm or {})},
                          **sections)


MESSAGE_IDS = itertools.count(20_000, 50)  # apart: the bot's own messages take the ids after a user's


async def say(fake_telegram, chat: int, text: str) -> str:
    """Sends a DM and returns the text of the bot's newest message in that chat once it changed."""
    before = [m["text"] for m in fake_telegram.sent_messages(chat)]
    fake_telegram.inject(dm_update(text, next(MESSAGE_IDS), user_id=chat))
    await wait_until(lambda: [m["text"] for m in fake_telegram.sent_messages(chat)] != before
                     and not fake_telegram.sent_messages(chat)[-1]["text"].endswith(PREVIEW_SUFFIX),
                     timeout=20, what=f"the answer to {text!r}")
    return fake_telegram.sent_messages(chat)[-1]["text"]


def assistant_meta(gateway) -> list[dict[str, Any]]:
    with gateway.engine.connect() as conn:
        return [row.meta or {} for row in conn.execute(
            select(MessageRow.meta).where(MessageRow.role == "assistant").order_by(MessageRow.id)).all()]


async def metrics_of(gateway) -> str:
    return (await gateway._metrics()).decode()


async def test_429_on_the_primary_is_answered_by_the_fallback_and_the_cooldown_holds_for_the_next_turn(
        tmp_path, primary, backup, fake_telegram, running):
    primary.script(oa.error(429, "Rate limit reached for gpt-4o in organization org-x on requests per min (RPM)",
                            "requests", "rate_limit_exceeded", headers={"retry-after": "60"}))
    backup.script("first answer, from the backup", "second answer, from the backup")
    gateway = await start_gateway(config(tmp_path, primary, backup, fake_telegram), running)

    assert await say(fake_telegram, 5557001, "hello") == "first answer, from the backup"
    assert await say(fake_telegram, 5557001, "again") == "second answer, from the backup"
    assert [r["status"] for r in primary.requests] == [429]  # the cooldown held: not asked the second time
    assert [r["status"] for r in backup.requests] == [200, 200]
    assert gateway.provider_health.of("primary").snapshot()["state"] == "cooldown"

    chats = sorted((s for s in EXPORTER.get_finished_spans() if s.name.startswith("chat ")), key=lambda s: s.start_time)
    assert len(chats) == 2
    for span, why in zip(chats, ["rate_limited", "cooldown"], strict=True):
        assert span.name == "chat gpt-4o" and span.attributes["gen_ai.request.model"] == "gpt-4o"
        assert span.attributes["gateway.provider"] == "backup"
        assert span.attributes["gen_ai.response.model"] == "qwen2.5:7b"
        (event,) = [e for e in span.events if e.name == "failover"]
        assert dict(event.attributes) == {"gateway.provider": "primary", "gen_ai.request.model": "gpt-4o",
                                          "gateway.failover.reason": why}
    assert [(m["provider"], m["model"]) for m in assistant_meta(gateway)] == [("backup", "qwen2.5:7b")] * 2

    text = await metrics_of(gateway)
    assert 'gateway_provider_requests_total{model="gpt-4o",provider="primary"} 1.0' in text
    assert 'gateway_provider_requests_total{model="qwen2.5:7b",provider="backup"} 2.0' in text
    assert 'gateway_provider_failures_total{model="gpt-4o",provider="primary",reason="rate_limited"} 1.0' in text
    assert 'gateway_provider_failovers_total{model="gpt-4o",provider="primary",reason="rate_limited"} 1.0' in text
    assert 'gateway_provider_failovers_total{model="gpt-4o",provider="primary",reason="cooldown"} 1.0' in text
    answered = sum(r["usage"]["prompt_tokens"] for r in backup.requests)
    assert f'gateway_provider_tokens_total{{kind="input",model="qwen2.5:7b",provider="backup"}} {answered}.0' in text
    assert 'gateway_provider_available{provider="primary"} 0.0' in text
    assert 'gateway_provider_available{provider="backup"} 1.0' in text
    assert 'gateway_model_tokens_total{kind="input",model="qwen2.5:7b"}' in text  # counted as the model that answered


def summariser(request: dict[str, Any]) -> str:
    if request["messages"][0]["content"].startswith(SUMMARY_PROMPT[:40]):
        return "The user sent two long notes about the harbour project."
    return f"noted ({len(request['messages'])} messages)"


async def test_a_context_too_long_400_is_compressed_and_retried_once_on_the_same_model_not_failed_over(
        tmp_path, primary, backup, fake_telegram, running):
    primary.context_window = 1200  # the server's real window; the config claims 128k, so no early summary
    primary.responder = summariser
    gateway = await start_gateway(config(tmp_path, primary, backup, fake_telegram, agent={"toolset": []},
                                         skills={"enabled": False}, memory={"enabled": False}), running)
    note = "The harbour project needs new cranes, more berths and a longer pier. " * 22  # ~390 tokens
    for n in range(3):
        answer = await say(fake_telegram, 5557101, f"note {n}: {note}")
    assert answer.startswith("noted") and backup.requests == []  # never failed over
    statuses = [r["status"] for r in primary.requests]
    assert statuses == [200, 200, 400, 200, 200]
    refused, summary_call, retried = (r["json"]["messages"] for r in primary.requests[2:])
    assert summary_call[0]["content"].startswith(SUMMARY_PROMPT[:40])
    assert retried[1]["content"].startswith(SUMMARY_HEADER) and "note 2:" in retried[-1]["content"]
    assert len(retried) < len(refused) and primary.requests[4]["prompt_tokens"] <= 1200
    with gateway.engine.connect() as conn:
        assert conn.execute(select(SummaryRow.text)).scalars().all() == [
            "The user sent two long notes about the harbour project."]
    text = await metrics_of(gateway)
    assert 'gateway_provider_failures_total{model="gpt-4o",provider="primary",reason="context_length"} 1.0' in text
    assert "gateway_provider_failovers_total{" not in text


async def test_a_401_marks_the_provider_down_the_fallback_serves_and_doctor_and_the_health_page_say_so(
        tmp_path, primary, backup, fake_telegram, running, caplog, capsys):
    from gateway.app.doctor import run_doctor

    backup.script("answered by the backup", "still the backup")
    cfg = config(tmp_path, primary, backup, fake_telegram, llm=providers(primary, backup,
                                                                         primary_key="GATEWAY_TEST_WRONG_KEY"),
                 web=ADMIN)
    gateway = await start_gateway(cfg, running)
    assert await say(fake_telegram, 5557201, "hi") == "answered by the backup"
    assert await say(fake_telegram, 5557201, "hi again") == "still the backup"
    assert [r["status"] for r in primary.requests] == [401]  # down: not asked again
    snapshot = gateway.provider_health.of("primary").snapshot()
    assert snapshot["state"] == "down" and "rejected the API key (401)" in snapshot["why"]
    downs = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR and "is down" in r.getMessage()]
    assert len(downs) == 1 and "GATEWAY_TEST_WRONG_KEY" in downs[0]  # logged once for two turns

    operator = Operator(f"http://127.0.0.1:{gateway.http_port}")
    try:
        await operator.login()
        status, health, _ = await operator.get("/admin/health")
        _, sessions, _ = await operator.get("/admin/sessions")
        session_id = re.search(r'href="/admin/sessions/([0-9a-f]{32})"', sessions).group(1)
        _, transcript, _ = await operator.get(f"/admin/sessions/{session_id}")
    finally:
        await operator.http.close()
    assert status == 200
    row = re.search(r"<tr><td>primary</td>.*?</tr>", health, re.DOTALL).group(0)
    assert ">down<" in row and "rejected the API key (401)" in row
    assert re.search(r"<tr><td>backup</td>.*?>ok<", health, re.DOTALL)
    assert transcript.count("via backup:qwen2.5:7b") == 2  # each answer says who gave it

    capsys.readouterr()
    assert await run_doctor(cfg) == 1
    out = capsys.readouterr().out
    assert re.search(r"\[FAIL\] model provider primary: .* rejected the API key in GATEWAY_TEST_WRONG_KEY \(401\)",
                     out), out
    assert "[ok] model provider backup:" in out and "model qwen2.5:7b listed" in out
    assert "[ok] route default: primary:gpt-4o → backup:qwen2.5:7b" in out


async def test_a_stream_cut_after_4_chunks_ends_as_one_answer_the_fallback_s_in_the_preview_s_place(
        tmp_path, primary, backup, fake_telegram, running):
    partial = "Draft from the primary that never ends " * 4
    # role, then 3 pieces 0.3 s apart: the first two are shown (a piece is told once the next came)
    primary.script(oa.cut(oa.text(partial, pieces=8, piece_delay_s=0.3), after_chunks=4))
    final = "The backup's whole answer. " + " ".join(f"Point {i} holds." for i in range(12))
    backup.script(oa.text(final, pieces=6, piece_delay_s=0.1))
    agent = {"stream_first_after_s": 0.2, "stream_edit_interval_s": {"telegram": 0.3}}
    await start_gateway(config(tmp_path, primary, backup, fake_telegram, agent=agent), running)
    chat = 5557301
    assert await say(fake_telegram, chat, "write it out") == final
    assert [r["status"] for r in primary.requests] == ["cut"] and [r["status"] for r in backup.requests] == [200]

    sends = sends_to(fake_telegram, chat)
    assert len(sends) == 1  # the preview, sent once; the answer arrived as its edit, never as a second message
    assert sends[0].params["text"].endswith(PREVIEW_SUFFIX)
    assert sends[0].params["text"].startswith(partial[:10])  # it showed the primary's partial text first
    assert [m["text"] for m in fake_telegram.sent_messages(chat)] == [final]
    edits = [c.params["text"] for c in fake_telegram.calls("editMessageText") if int(c.params["chat_id"]) == chat]
    assert edits[-1] == final and not any(partial[:20] in t and "backup" in t for t in edits)


async def test_the_circuit_opens_after_failures_in_a_row_and_half_opens_for_one_probe(
        tmp_path, primary, backup, fake_telegram, running):
    primary.script(oa.error(500, "The server had an error while processing your request.", "server_error"),
                   oa.error(502, "Bad gateway", "server_error"), "the primary is back", "primary again")
    backup.script("backup 1", "backup 2", "backup 3")
    llm = {"breaker_failures": 2, "breaker_open_s": 1.0}
    gateway = await start_gateway(config(tmp_path, primary, backup, fake_telegram, llm=llm), running)
    chat = 5557401
    assert await say(fake_telegram, chat, "one") == "backup 1"
    assert await say(fake_telegram, chat, "two") == "backup 2"  # second failure in a row: open
    assert gateway.provider_health.of("primary").snapshot()["state"] == "open"
    assert await say(fake_telegram, chat, "three") == "backup 3"
    assert len(primary.requests) == 2  # open: skipped
    await wait_until(lambda: gateway.provider_health.of("primary").snapshot()["state"] == "half_open",
                     what="the circuit to half-open")
    assert await say(fake_telegram, chat, "four") == "the primary is back"  # the probe succeeded
    assert gateway.provider_health.of("primary").snapshot()["state"] == "ok"
    assert await say(fake_telegram, chat, "five") == "primary again"
    assert len(primary.requests) == 4 and len(backup.requests) == 3
    text = await metrics_of(gateway)
    assert 'gateway_provider_failovers_total{model="gpt-4o",provider="primary",reason="open"} 1.0' in text


async def test_a_fallback_without_parallel_tool_calls_or_stream_options_gets_the_primary_s_calls_one_by_one(
        tmp_path, primary, backup, fake_telegram, page_server, running):
    backup.lacks = frozenset({"parallel_tool_calls", "stream_options"})
    first = oa.call("web_fetch", {"url": f"{page_server.url}/page?1"})
    second = oa.call("web_fetch", {"url": f"{page_server.url}/page?2"})
    primary.script(oa.tool_calls(first, second), oa.error(503, "The engine is currently overloaded", "server_error"))
    backup.script("Both pages say amber-falcon-42.")
    llm = providers(primary, backup, backup_lacks=("parallel_tool_calls", "stream_options"))
    gateway = await start_gateway(config(tmp_path, primary, backup, fake_telegram, llm=llm), running)
    assert await say(fake_telegram, 5557501, "fetch both pages") == "Both pages say amber-falcon-42."
    (sent,) = backup.requests
    assert sent["status"] == 200 and "stream_options" not in sent["json"]
    shape = [(m["role"], [c["id"] for c in m.get("tool_calls") or ()] or m.get("tool_call_id"))
             for m in sent["json"]["messages"][1:]]
    assert shape == [("user", None), ("assistant", [first.id]), ("tool", first.id), ("assistant", [second.id]),
                     ("tool", second.id)]
    last = assistant_meta(gateway)[-1]
    assert last["provider"] == "backup" and last["usage_estimated"] is True  # the server sent no usage
    with gateway.engine.connect() as conn:
        tokens = conn.execute(select(MessageRow.prompt_tokens).where(MessageRow.role == "assistant")
                              .order_by(MessageRow.id.desc())).scalars().first()
    assert tokens and tokens > 0


async def test_a_config_without_providers_is_one_route_to_llm_base_url(tmp_path, fake_telegram, fake_openai,
                                                                        running):
    fake_openai.reset()
    fake_openai.script("from the one endpoint")
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai, fake_telegram), running)
    assert await say(fake_telegram, 5557601, "hi") == "from the one endpoint"
    assert gateway.agent_spec.route == ("default:gpt-4o-mini",)
    assert assistant_meta(gateway)[-1]["provider"] == "default"
