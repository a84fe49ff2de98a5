"""Tool contract: schemas from typed signatures, validation before execution (errors reach the
model), stable rendering, toolsets, redaction of tool results."""

from __future__ import annotations

from typing import Annotated, Literal

import pytest
from pydantic import Field

from agent.loop import Limits, run_turn
from agent.model import OpenAIChatModel
from agent.redact import Redactor
from agent.tools import Tool, ToolRegistry, tool
from gateway.app.gateway import expand_toolset
from tests.fakes import openai as oa


def schedule(city: str, days: Annotated[int, Field(ge=1, le=14)], unit: Literal["c", "f"] = "c") -> str:
    """Weather forecast for a city.

    Args:
        city: the city name.
        days: how many days ahead.
        unit: temperature unit.
    """
    return f"{city}: sunny for {days} days ({unit})"


def test_schema_is_generated_from_the_signature_and_docstring():
    t = tool(schedule, side_effect="read", idempotent=True)
    assert t.name == "schedule" and t.description == "Weather forecast for a city."
    assert t.parameters == {
        "type": "object", "additionalProperties": False, "required": ["city", "days"],
        "properties": {
            "city": {"type": "string", "description": "the city name."},
            "days": {"type": "integer", "minimum": 1, "maximum": 14, "description": "how many days ahead."},
            "unit": {"type": "string", "enum": ["c", "f"], "default": "c", "description": "temperature unit."},
        },
    }


def test_untyped_parameters_and_bad_names_are_refused():
    with pytest.raises(TypeError):
        tool(lambda x: x, name="untyped")
    with pytest.raises(ValueError):
        Tool("bad name!", "d", {"type": "object"}, fn=lambda: "")


def test_rendering_is_stable_whatever_the_registration_order():
    a, b = ToolRegistry(), ToolRegistry()
    t1, t2 = tool(schedule), Tool("alpha", "d", {"type": "object", "properties": {}}, fn=lambda: "")
    a.add(t1)
    a.add(t2)
    b.add(t2)
    b.add(t1)
    assert a.signature() == b.signature()
    assert [s["function"]["name"] for s in a.schemas()] == ["alpha", "schedule"]
    assert a.subset(["schedule"]).schemas() is a.subset(["schedule", "unknown"]).schemas()


def test_toolsets_expand_to_their_tools():
    toolsets = {"files": ["read_file", "list_files"], "web": ["web_fetch"]}
    assert expand_toolset(["files", "delegate"], toolsets) == ["delegate", "list_files", "read_file"]


def test_wrong_type_and_missing_argument_are_not_executed_and_the_model_is_told(fake_openai):
    fake_openai.reset()
    ran: list[tuple] = []

    def forecast(city: str, days: int) -> str:
        """Forecast."""
        ran.append((city, days))
        return "sunny"

    tools = ToolRegistry()
    tools.add(tool(forecast))
    wrong, missing, good = (oa.call("forecast", {"city": "Oslo", "days": "many"}),
                            oa.call("forecast", {"city": "Oslo"}), oa.call("forecast", {"city": "Oslo", "days": "3"}))
    fake_openai.script(oa.tool_calls(wrong, missing, good), oa.text("ok"))
    model = OpenAIChatModel(base_url=f"{fake_openai.url}/v1", api_key="sk-test", model="gpt-4o-mini", max_retries=0)
    run_turn(system_prompt="s", history=[{"role": "user", "content": "weather"}], model=model, tools=tools,
             bridge=None, limits=Limits(), record=lambda *a: None)
    assert ran == [("Oslo", 3)]  # only the valid call ran ("3" coerced to 3)
    sent = {m["tool_call_id"]: m["content"] for m in fake_openai.requests[1]["json"]["messages"] if m["role"] == "tool"}
    assert "invalid arguments for forecast, nothing was run: days: Input should be a valid integer" in sent[wrong.id]
    assert "days: Field required" in sent[missing.id]
    assert "sunny" in sent[good.id]


def test_redactor_removes_configured_secrets_and_token_shapes():
    redact = Redactor(["hunter2-secret-value"])
    text = ("key hunter2-secret-value, url https://api.telegram.org/bot123456:AAAbbbCCCdddEEEfffGGGhhh/getMe, "
            "xoxb-1234-5678-abcdef, xapp-1-A0-123-abc, sk-proj-abcdefghijklmnopqrstuvwx")
    cleaned = redact(text)
    for leaked in ("hunter2-secret-value", "AAAbbbCCC", "xoxb-1234", "xapp-1-A0", "sk-proj-abc"):
        assert leaked not in cleaned


def test_redactor_removes_the_password_of_a_url_and_keeps_other_at_signs():
    redact = Redactor()
    assert redact("GET https://bob:s3cr3t-pw@tg-proxy.example.com/bot/getMe") == \
        "GET https://bob:***@tg-proxy.example.com/bot/getMe"
    assert redact("postgresql+psycopg://gw:p%40ss@db:5432/gateway") == "postgresql+psycopg://gw:***@db:5432/gateway"
    for kept in ("http://example.com/a@b", "mailto:me@example.org", "meet 10:30@home", "https://bob@host/x"):
        assert redact(kept) == kept


def test_a_secret_across_the_cut_of_a_long_tool_result_is_redacted_not_halved(fake_openai):
    """A tool result is redacted before it is shortened to ``tool_result_max_chars``: a secret that
    straddled the cut used to reach the model as a half no exact-value redaction could match."""
    from agent.context import RunContext

    secret = "s3cret-value-" + "q" * 40
    limits = Limits(tool_result_max_chars=1000)
    head = "a" * (limits.tool_result_max_chars // 2 - 20)

    def dump() -> str:
        """A long debug dump."""
        return head + secret + "b" * 5000

    def broken() -> str:
        """Fails with the secret in its error."""
        raise RuntimeError("x" * 280 + secret)

    fake_openai.reset()
    tools = ToolRegistry()
    tools.add(tool(dump))
    tools.add(tool(broken))
    fake_openai.script(oa.tool_calls(oa.call("dump", {}), oa.call("broken", {})), oa.text("ok"))
    model = OpenAIChatModel(base_url=f"{fake_openai.url}/v1", api_key="sk-test", model="gpt-4o-mini", max_retries=0)
    run_turn(system_prompt="s", history=[{"role": "user", "content": "dump"}], model=model, tools=tools,
             bridge=None, limits=limits, record=lambda *a: None, context=RunContext(redact=Redactor([secret])))
    results = [m["content"] for m in fake_openai.requests[1]["json"]["messages"] if m["role"] == "tool"]
    assert len(results) == 2 and "characters omitted" in results[0] and "***" in results[0]
    for result in results:
        assert "s3cret-value" not in result and "q" * 10 not in result, result[480:560]
