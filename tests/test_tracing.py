"""Traces of a Telegram turn with two tool calls (in-memory exporter): GenAI span nesting and usage."""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.conftest import TEST_TOKEN, gateway_config, start_gateway
from tests.fakes import openai as oa
from tests.test_telegram_e2e import dm_update, echo_tool_result, wait_until

EXPORTER = InMemorySpanExporter()


def _install() -> None:
    """Adds the in-memory exporter to the process's tracer provider (installing one if needed)."""
    current = trace.get_tracer_provider()
    if not isinstance(current, TracerProvider):
        current = TracerProvider()
        trace.set_tracer_provider(current)
    current.add_span_processor(SimpleSpanProcessor(EXPORTER))


_install()


def _by_name(spans: list[ReadableSpan], prefix: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name.startswith(prefix)]


async def test_turn_with_two_tool_calls_is_one_nested_trace(tmp_path, fake_telegram, fake_openai, page_server,
                                                            running):
    EXPORTER.clear()
    fake_openai.reset()
    url = f"{page_server.url}/page"
    fake_openai.script(oa.tool_calls(oa.call("web_fetch", {"url": url}), oa.call("web_fetch", {"url": url + "?2"})))
    fake_openai.responder = echo_tool_result
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai, fake_telegram), running)

    fake_telegram.inject(dm_update("fetch two pages", 9401, user_id=5554001))
    await fake_telegram.wait_for_call("sendMessage", lambda c: int(c.params["chat_id"]) == 5554001, timeout=10)
    await wait_until(lambda: gateway.delivery.sent >= 1 and _by_name(EXPORTER.get_finished_spans(), "deliver"),
                     what="delivery span")

    spans = list(EXPORTER.get_finished_spans())
    (agent,) = _by_name(spans, "invoke_agent")
    assert agent.name == "invoke_agent assistant" and agent.parent is None
    turn = [s for s in spans if s.context.trace_id == agent.context.trace_id]
    children = {s.name for s in turn if s.parent is not None and s.parent.span_id == agent.context.span_id}
    assert children == {"load_session", "chat gpt-4o-mini", "execute_tool web_fetch", "finish_turn"}
    chats = sorted(_by_name(turn, "chat "), key=lambda s: s.start_time)
    tools = _by_name(turn, "execute_tool ")
    assert len(chats) == 2 and len(tools) == 2 and len(turn) == 7  # + load, finish, the agent

    requests = fake_openai.requests
    for span, request in zip(chats, requests, strict=True):
        attrs = span.attributes
        assert attrs["gen_ai.operation.name"] == "chat" and attrs["gen_ai.request.model"] == "gpt-4o-mini"
        assert attrs["gen_ai.usage.input_tokens"] == request["prompt_tokens"]
        assert attrs["gen_ai.usage.output_tokens"] > 0
    assert chats[0].attributes["gen_ai.response.finish_reasons"] == ("tool_calls",)
    assert chats[1].attributes["gen_ai.response.finish_reasons"] == ("stop",)
    assert all(t.attributes["gen_ai.tool.name"] == "web_fetch" and t.attributes["gateway.tool.outcome"] == "ok"
               for t in tools)
    # The tool calls ran between the two model calls.
    assert all(chats[0].end_time <= t.start_time and t.end_time <= chats[1].start_time for t in tools)
    assert agent.attributes["gen_ai.usage.input_tokens"] == sum(r["prompt_tokens"] for r in requests)
    assert agent.attributes["gateway.stop_reason"] == "stop"
    assert agent.attributes["gen_ai.conversation.id"]

    assert [s.attributes["gateway.stored"] for s in _by_name(spans, "receive telegram")] == [True]
    (deliver,) = _by_name(spans, "deliver")
    assert deliver.name == "deliver telegram" and deliver.attributes["gateway.platform"] == "telegram"

    # Content capture is off by default; no secrets anywhere.
    everything = repr([dict(s.attributes or {}) for s in spans])
    assert "gen_ai.input.messages" not in everything and "gen_ai.tool.call.arguments" not in everything
    assert "fetch two pages" not in everything and url not in everything
    assert TEST_TOKEN not in everything and "sk-test" not in everything


def test_content_capture_records_tool_arguments_and_results():
    from agent.tracing import end_tool, execute_tool, set_capture_content

    EXPORTER.clear()
    set_capture_content(True)
    try:
        with execute_tool("web_fetch", "call_1", {"url": "https://example.org"}) as span:
            end_tool(span, "error", "Error: timed out")
    finally:
        set_capture_content(False)
    (span,) = EXPORTER.get_finished_spans()
    assert span.attributes["gen_ai.tool.call.arguments"] == '{"url": "https://example.org"}'
    assert span.attributes["gen_ai.tool.call.result"] == "Error: timed out"
    assert span.status.status_code.name == "ERROR"


def test_telemetry_config_defaults_and_headers(tmp_path, fake_openai):
    from agent.tracing import capture_content
    from gateway.ops.telemetry import _headers, setup_tracing

    config = gateway_config(tmp_path, fake_openai, telemetry={"capture_content": False})
    assert config.telemetry.exporter == "none" and not config.telemetry.capture_content
    assert setup_tracing(config, "gw-test") is None and not capture_content()
    assert _headers("Authorization=Bearer abc=, x-team = ops") == {"Authorization": "Bearer abc=", "x-team": "ops"}


def test_a_failing_span_keeps_the_exception_message_off_the_trace():
    from gateway.ops.telemetry import span

    EXPORTER.clear()
    try:
        with span("finish_turn"):
            raise RuntimeError("INSERT ... parameters: ('my secret diary entry',)")
    except RuntimeError:
        pass
    (failed,) = EXPORTER.get_finished_spans()
    assert failed.attributes["error.type"] == "RuntimeError" and not failed.events
    assert "diary" not in repr(failed.to_json())
