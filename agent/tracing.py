"""OpenTelemetry spans of the agent, after the GenAI semantic conventions (API only, no SDK).

Spans: ``invoke_agent {name}`` (a turn, or a sub-agent's task), ``chat {model}`` (one model call)
and ``execute_tool {name}`` (one tool call). Without a configured tracer provider every call is a
no-op. Message content, tool arguments and results are recorded only when content capture is on
(``set_capture_content``; off by default: chats and tool output may hold personal data).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

if TYPE_CHECKING:
    from agent.model import ModelReply

tracer = trace.get_tracer("agent-gateway.agent")
PROVIDER = "openai"
"""``gen_ai.provider.name``: the wire protocol (any OpenAI-compatible server)."""

_settings = {"capture_content": False}


def set_capture_content(enabled: bool) -> None:
    """Turns recording of messages, tool arguments and tool results on or off (process-wide)."""
    _settings["capture_content"] = enabled


def capture_content() -> bool:
    return _settings["capture_content"]


@contextmanager
def invoke_agent(name: str, *, model: str, conversation_id: str = "", turn_id: str = "") -> Iterator[Span]:
    """The span of one agent run (a chat turn, or a sub-agent's task)."""
    attributes: dict[str, Any] = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": name,
                                  "gen_ai.provider.name": PROVIDER, "gen_ai.request.model": model}
    if conversation_id:
        attributes["gen_ai.conversation.id"] = conversation_id
    if turn_id:
        attributes["gateway.turn.id"] = turn_id
    with _span(f"invoke_agent {name}", SpanKind.INTERNAL, attributes) as span:
        yield span


def end_agent(span: Span, *, stop_reason: str, steps: int, input_tokens: int, output_tokens: int,
              cost_usd: float) -> None:
    """Records how an agent run ended on its span."""
    span.set_attributes({"gateway.stop_reason": stop_reason, "gateway.steps": steps,
                         "gen_ai.usage.input_tokens": input_tokens, "gen_ai.usage.output_tokens": output_tokens,
                         "gateway.cost_usd": round(cost_usd, 8)})


def tracing_on() -> bool:
    """Whether a tracer provider is installed (``trace.set_tracer_provider``): spans then record."""
    return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


@contextmanager
def chat(model: str, messages: list[dict[str, Any]]) -> Iterator[Span]:
    """The span of one model call; ``end_chat`` fills in the response."""
    attributes: dict[str, Any] = {"gen_ai.operation.name": "chat", "gen_ai.provider.name": PROVIDER,
                                  "gen_ai.request.model": model}
    if capture_content():
        attributes["gen_ai.input.messages"] = json.dumps(messages, ensure_ascii=False, default=str)
    with _span(f"chat {model}", SpanKind.CLIENT, attributes) as span:
        yield span


@contextmanager
def _span(name: str, kind: SpanKind, attributes: dict[str, Any]) -> Iterator[Span]:
    """A current span that records a failure by the exception's type only (see ``_failed``).
    Without a tracer provider (OpenTelemetry's global proxy is all there is) the span would be a
    no-op: the invalid span is yielded without touching the context (about 20 µs per span saved)."""
    if not tracing_on():
        yield trace.INVALID_SPAN
        return
    with tracer.start_as_current_span(name, kind=kind, attributes=attributes,
                                      record_exception=False, set_status_on_exception=False) as span:
        try:
            yield span
        except BaseException as exc:
            _failed(span, exc)
            raise


def _failed(span: Span, exc: BaseException) -> None:
    """Marks ``span`` failed with the exception's type only (its message may hold content)."""
    span.set_attribute("error.type", type(exc).__name__)
    span.set_status(Status(StatusCode.ERROR, type(exc).__name__))


def end_chat(span: Span, reply: ModelReply, cost_usd: float) -> None:
    """Records the model's answer: finish reason and token usage (content only with capture on),
    and who answered when a route chose (``gateway.provider``, ``gen_ai.response.model``)."""
    usage = reply.usage
    span.set_attributes({"gen_ai.response.finish_reasons": [reply.finish_reason],
                         "gen_ai.usage.input_tokens": usage.prompt_tokens,
                         "gen_ai.usage.output_tokens": usage.completion_tokens,
                         "gen_ai.usage.cache_read.input_tokens": usage.cached_tokens,
                         "gateway.cost_usd": round(cost_usd, 8)})
    if reply.provider is not None:
        span.set_attribute("gateway.provider", reply.provider)
    if reply.model is not None:
        span.set_attribute("gen_ai.response.model", reply.model)
    if usage.estimated:
        span.set_attribute("gateway.usage_estimated", True)
    if capture_content():
        message: dict[str, Any] = {"role": "assistant", "content": reply.content}
        if reply.tool_calls:
            message["tool_calls"] = reply.tool_calls
        span.set_attribute("gen_ai.output.messages", json.dumps([message], ensure_ascii=False))


def failover_event(provider: str, model: str, reason: str) -> None:
    """Adds a ``failover`` event to the current span (the ``chat`` span of the call being routed):
    the target passed over and why (``rate_limited``, ``cooldown``, ``server``, ...)."""
    trace.get_current_span().add_event("failover", {"gateway.provider": provider, "gen_ai.request.model": model,
                                                    "gateway.failover.reason": reason})


@contextmanager
def execute_tool(name: str, call_id: str, arguments: Any) -> Iterator[Span]:
    """The span of one tool call; ``end_tool`` records its outcome."""
    attributes: dict[str, Any] = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name,
                                  "gen_ai.tool.call.id": call_id, "gen_ai.tool.type": "function"}
    if capture_content():
        attributes["gen_ai.tool.call.arguments"] = json.dumps(arguments, ensure_ascii=False, default=str)
    with _span(f"execute_tool {name}", SpanKind.INTERNAL, attributes) as span:
        yield span


def end_tool(span: Span, status: str, result: str) -> None:
    """``status``: ``ok``, ``error`` or ``rejected`` (the model gets the error text either way)."""
    span.set_attribute("gateway.tool.outcome", status)
    if status != "ok":
        span.set_attribute("error.type", f"tool_{status}")
        span.set_status(Status(StatusCode.ERROR, f"tool {status}"))
    if capture_content():
        span.set_attribute("gen_ai.tool.call.result", result)
