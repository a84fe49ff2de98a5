"""The agent loop with the real openai client against the fake chat-completions server."""

from __future__ import annotations

import asyncio
import json

import pytest

from agent.bridge import AsyncBridge
from agent.context import RunContext
from agent.errors import CallSuspended
from agent.loop import Limits, cap_text, run_turn
from agent.model import ModelError, OpenAIChatModel
from agent.tools import Tool, ToolRegistry
from tests.fakes import openai as oa


@pytest.fixture
def model(fake_openai):
    fake_openai.reset()
    return OpenAIChatModel(base_url=f"{fake_openai.url}/v1", api_key="sk-test", model="gpt-4o-mini", max_retries=0)


@pytest.fixture(scope="module")
def bridge():
    b = AsyncBridge()
    b.start()
    yield b
    b.stop()


def registry() -> ToolRegistry:
    tools = ToolRegistry()
    tools.add(Tool("add", "Add two integers.", {"type": "object", "properties": {"a": {"type": "integer"},
              "b": {"type": "integer"}}, "required": ["a", "b"]}, fn=lambda a, b: str(a + b), idempotent=True))
    tools.add(Tool("send_mail", "Send an email.", {"type": "object", "properties": {}},
                   fn=lambda: "sent", side_effect="external"))

    async def slow(seconds: float) -> str:
        await asyncio.sleep(seconds)
        return "slept"

    tools.add(Tool("sleep", "Sleep.", {"type": "object", "properties": {"seconds": {"type": "number"}}},
                   fn=slow, is_async=True, timeout_s=0.2))
    return tools


def run(model, tools, history, bridge=None, **limits):
    recorded: list[dict] = []
    outcome = run_turn(system_prompt="sys", history=history, model=model, tools=tools, bridge=bridge,
                       limits=Limits(**limits), record=lambda m, u, meta: recorded.append(m))
    return outcome, recorded


def test_parallel_tool_calls_each_get_exactly_one_answer(model, fake_openai):
    c1, c2 = oa.call("add", {"a": 1, "b": 2}), oa.call("add", {"a": 40, "b": 2})
    fake_openai.script(oa.tool_calls(c1, c2), oa.text("3 and 42"))
    outcome, recorded = run(model, registry(), [{"role": "user", "content": "sums"}])
    assert outcome.reply == "3 and 42" and outcome.steps == 2
    assert [(m["role"], m.get("tool_call_id")) for m in recorded[1:3]] == [("tool", c1.id), ("tool", c2.id)]
    assert [m["content"].split("\n")[1] for m in recorded[1:3]] == ["3", "42"]
    assert recorded[1]["content"].startswith('<tool_output tool="add" trust="untrusted">')
    assert "[budget: 89 of 90 model calls left" in recorded[2]["content"]  # the newest message of the step
    assert all(r["status"] == 200 for r in fake_openai.requests)  # the fake would 400 on a bad sequence


def test_invalid_json_arguments_go_back_as_a_tool_error(model, fake_openai):
    bad = oa.call("add", '{"a": 1, "b": ')
    fake_openai.script(oa.tool_calls(bad), oa.text("sorry"))
    outcome, recorded = run(model, registry(), [{"role": "user", "content": "x"}])
    tool_msg = recorded[1]
    assert tool_msg["tool_call_id"] == bad.id
    assert tool_msg["content"].startswith("Error: the arguments are not valid JSON")
    sent = fake_openai.requests[1]["json"]["messages"][-1]
    assert sent == {"role": "tool", "tool_call_id": bad.id, "content": tool_msg["content"]}
    assert outcome.reply == "sorry"


def test_unknown_tool_non_object_args_and_timeouts_are_model_visible(model, fake_openai, bridge):
    calls = [oa.call("nope", {}), oa.call("add", "[1, 2]"), oa.call("sleep", {"seconds": 5})]
    fake_openai.script(oa.tool_calls(*calls), oa.text("done"))
    _, recorded = run(model, registry(), [{"role": "user", "content": "x"}], bridge=bridge)
    contents = [m["content"] for m in recorded if m["role"] == "tool"]
    assert "no tool named 'nope'" in contents[0]
    assert contents[1] == "Error: the arguments must be a JSON object."
    assert "timed out" in contents[2]


def test_iteration_budget_ends_the_turn_with_a_clear_reply(model, fake_openai):
    fake_openai.responder = lambda req: oa.tool_calls(oa.call("add", {"a": len(req["messages"]), "b": 1}))
    outcome, _ = run(model, registry(), [{"role": "user", "content": "loop"}], iteration_budget=3)
    assert outcome.stop_reason == "iteration_budget" and outcome.steps == 3
    assert "iteration budget" in outcome.reply and len(fake_openai.requests) == 3


def test_resumed_turn_reruns_only_missing_idempotent_calls(model, fake_openai):
    done, missing = oa.call("add", {"a": 1, "b": 1}), oa.call("add", {"a": 2, "b": 2})
    args = {c.id: json.dumps(a) for c, a in ((done, {"a": 1, "b": 1}), (missing, {"a": 2, "b": 2}))}
    history = [
        {"role": "user", "content": "two sums"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": c.id, "type": "function", "function": {"name": "add", "arguments": args[c.id]}}
            for c in (done, missing)
        ]},
        {"role": "tool", "tool_call_id": done.id, "content": "2"},
    ]
    fake_openai.script(oa.text("2 and 4"))
    outcome, recorded = run(model, registry(), history)
    assert recorded[0] == {"role": "tool", "tool_call_id": missing.id,
                           "content": '<tool_output tool="add" trust="untrusted">\n4\n</tool_output>'}
    assert outcome.reply == "2 and 4" and len(fake_openai.requests) == 1


def test_model_errors_are_raised_with_a_safe_user_message(model, fake_openai):
    fake_openai.script(oa.error(500, "boom", type="server_error"))
    with pytest.raises(ModelError) as info:
        run(model, registry(), [{"role": "user", "content": "x"}])
    assert "500" in info.value.user_message and "sk-test" not in str(info.value)


def test_tool_results_are_capped_head_and_tail():
    capped = cap_text("a" * 100 + "b" * 100, 50)
    assert capped.startswith("a" * 25) and capped.endswith("b" * 25) and "of 200" in capped


def test_tool_schemas_render_in_a_stable_order():
    a, b = registry(), ToolRegistry()
    for name in reversed(sorted(a.tools)):
        b.add(a.tools[name])
    assert json.dumps(a.schemas()) == json.dumps(b.schemas())


def test_resumed_turn_does_not_rerun_a_side_effecting_call(model, fake_openai):
    mail = oa.call("send_mail", {})
    history = [
        {"role": "user", "content": "mail it"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": mail.id, "type": "function", "function": {"name": "send_mail", "arguments": "{}"}}]},
    ]
    fake_openai.script(oa.text("I could not confirm the mail was sent."))
    _, recorded = run(model, registry(), history)
    assert recorded[0]["tool_call_id"] == mail.id and "interrupted" in recorded[0]["content"]


def test_should_stop_ends_the_turn_at_the_next_step(model, fake_openai):
    fake_openai.responder = lambda req: oa.tool_calls(oa.call("add", {"a": len(req["messages"]), "b": 1}))
    checks: list[int] = []

    def should_stop() -> bool:
        checks.append(1)
        return len(checks) > 2

    recorded: list[dict] = []
    outcome = run_turn(system_prompt="s", history=[{"role": "user", "content": "go"}], model=model,
                       tools=registry(), bridge=None, limits=Limits(), record=lambda m, u, meta: recorded.append(m),
                       should_stop=should_stop)
    assert outcome.stop_reason == "cancelled" and outcome.steps == 2 and len(fake_openai.requests) == 2


def test_streamed_calls_reuse_one_connection_and_keep_every_chunk(model, fake_openai):
    """A streamed call reads its body to the end, so the next call goes out on the same HTTP/1.1
    connection (no new TCP/TLS handshake per model call) and no chunk is lost on the way."""
    c1 = oa.call("add", {"a": 2, "b": 3})
    fake_openai.script(oa.tool_calls(c1, content="Adding."), oa.text("The sum is 5.", pieces=4))
    streamed: list[str] = []
    outcome = run_turn(system_prompt="sys", history=[{"role": "user", "content": "2+3?"}], model=model,
                       tools=registry(), bridge=None, limits=Limits(), record=lambda m, u, meta: None,
                       on_text=streamed.append)
    assert outcome.reply == "The sum is 5." and outcome.steps == 2
    assert streamed[-1] == "".join(oa._pieces("The sum is 5.", 4)[:3])  # the whole reply is never a preview
    assert outcome.usage[0].prompt_tokens > 0
    peers = [r["peer"] for r in fake_openai.requests]
    assert len(peers) == 2 and peers[0] == peers[1]


def test_a_call_suspended_for_a_restart_gets_no_result_and_is_asked_again_on_resume(model, fake_openai):
    """A call waiting for a person's decision when the gateway stops (``CallSuspended``) is left
    unanswered while its sibling's result is kept; the resumed turn asks about it again (the
    approver sees ``ctx.resumed``) and runs it once approved, instead of answering it 'interrupted'."""
    total, mail = oa.call("add", {"a": 2, "b": 3}), oa.call("send_mail", {})
    fake_openai.script(oa.tool_calls(total, mail))
    asked: list[tuple[str, bool]] = []

    def stopping(ctx, tool, args):
        if tool.side_effect == "external":
            asked.append((ctx.call_id, ctx.resumed))
            raise CallSuspended("ab12cd")
        return None

    recorded: list[dict] = []
    outcome = run_turn(system_prompt="s", history=[{"role": "user", "content": "sum, then mail it"}], model=model,
                       tools=registry(), bridge=None, limits=Limits(), record=lambda m, u, meta: recorded.append(m),
                       context=RunContext(approver=stopping))
    assert outcome.stop_reason == "cancelled" and len(fake_openai.requests) == 1
    assert [(m["role"], m.get("tool_call_id")) for m in recorded] == [("assistant", None), ("tool", total.id)]

    def approved(ctx, tool, args):
        asked.append((ctx.call_id, ctx.resumed))
        return None

    fake_openai.script(oa.text("5, and the mail is sent"))
    resumed: list[dict] = []
    outcome = run_turn(system_prompt="s", history=[{"role": "user", "content": "sum, then mail it"}, *recorded],
                       model=model, tools=registry(), bridge=None, limits=Limits(),
                       record=lambda m, u, meta: resumed.append(m),
                       context=RunContext(approver=approved, awaiting=lambda call_id: call_id == mail.id))
    assert asked == [(mail.id, False), (mail.id, True)]
    assert resumed[0]["tool_call_id"] == mail.id and "sent" in resumed[0]["content"]
    assert outcome.reply == "5, and the mail is sent"


def test_an_empty_draft_before_the_checklist_is_sent_back_as_the_api_takes_it(model, fake_openai):
    # A skill's checklist makes the model's first answer a draft sent back with the checklist
    # request; an empty draft went back as content null, which the API refuses: the turn failed.
    from agent.turn_state import TurnState

    state = TurnState()
    state.add_skill("report", "1", ("every figure has a source",))
    fake_openai.script(oa.text(""), oa.text("final answer"))
    recorded: list[dict] = []
    outcome = run_turn(system_prompt="sys", history=[{"role": "user", "content": "report"}], model=model,
                       tools=registry(), bridge=None, limits=Limits(), record=lambda m, u, meta: recorded.append(m),
                       context=RunContext(state=state))
    assert outcome.reply == "final answer"
    assert [r["status"] for r in fake_openai.requests] == [200, 200]
    assert recorded[0] == {"role": "assistant", "content": ""}


def test_parallel_calls_sent_under_one_id_are_each_answered_once(fake_openai):
    # Models have been seen to give two parallel calls the same id (gpt-4.1-nano, Kimi behind some
    # proxies). Not streamed, the ids were kept: two results under one tool_call_id, which the API
    # refuses; the turn failed, and the stored calls failed every later turn of the session.
    fake_openai.reset()
    model = OpenAIChatModel(base_url=f"{fake_openai.url}/v1", api_key="sk-test", model="gpt-4o-mini",
                            max_retries=0, stream=False)
    c1, c2 = oa.call("add", {"a": 1, "b": 2}, id="call_same"), oa.call("add", {"a": 40, "b": 2}, id="call_same")
    fake_openai.script(oa.tool_calls(c1, c2), oa.text("3 and 42"))
    outcome, recorded = run(model, registry(), [{"role": "user", "content": "sums"}])
    assert outcome.reply == "3 and 42"
    assert [r["status"] for r in fake_openai.requests] == [200, 200]
    ids = [call["id"] for call in recorded[0]["tool_calls"]]
    assert ids[0] == "call_same" and len(set(ids)) == 2
    assert [m["tool_call_id"] for m in recorded[1:3]] == ids
    assert [m["content"].split("\n")[1] for m in recorded[1:3]] == ["3", "42"]


def _completion(message: dict) -> dict:
    return {"id": "chatcmpl-raw", "object": "chat.completion", "created": 0, "model": "gpt-4o-mini",
            "choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}}


@pytest.mark.parametrize("function", [{"name": None, "arguments": "{}"}, {"name": "add", "arguments": 42}])
def test_a_tool_call_without_a_name_or_text_arguments_is_the_providers_fault(fake_openai, function):
    """Stored as it came, such a call made every later request of the session invalid (found by a
    review); now the route fails over as for any broken answer."""
    fake_openai.reset()
    model = OpenAIChatModel(base_url=f"{fake_openai.url}/v1", api_key="sk-test", model="gpt-4o-mini",
                            max_retries=0, stream=False)
    fake_openai.script(oa.raw(_completion({"content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": function}]})))
    with pytest.raises(ModelError) as raised:
        run(model, registry(), [{"role": "user", "content": "sum"}])
    assert raised.value.reason == "stream"


def test_tool_arguments_sent_as_an_object_are_passed_on_as_json_text(fake_openai):
    fake_openai.reset()
    model = OpenAIChatModel(base_url=f"{fake_openai.url}/v1", api_key="sk-test", model="gpt-4o-mini",
                            max_retries=0, stream=False)
    fake_openai.script(oa.raw(_completion({"content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}]})),
        oa.text("5"))
    outcome, recorded = run(model, registry(), [{"role": "user", "content": "sum"}])
    assert recorded[0]["tool_calls"][0]["function"]["arguments"] == '{"a": 2, "b": 3}'
    assert recorded[1]["content"].split("\n")[1] == "5" and outcome.reply == "5"


@pytest.mark.parametrize("stream", [False, True])
def test_a_refusal_is_the_reply_not_no_answer(fake_openai, stream):
    """OpenAI sends a refusal in ``message.refusal`` (streamed: ``delta.refusal``) with no content:
    the user got "(no answer)" (found by a review)."""
    fake_openai.reset()
    model = OpenAIChatModel(base_url=f"{fake_openai.url}/v1", api_key="sk-test", model="gpt-4o-mini",
                            max_retries=0, stream=stream)
    said = "I can't help with that request."
    if stream:
        fake_openai.script(oa.raw({"choices": [{"index": 0, "delta": {"role": "assistant", "refusal": said},
                                                "finish_reason": "stop"}]}))
    else:
        fake_openai.script(oa.raw(_completion({"content": None, "refusal": said})))
    outcome, _ = run(model, registry(), [{"role": "user", "content": "do something bad"}])
    assert outcome.reply == said
