"""Self-test of tests/fakes/openai.py against the real ``openai`` client."""

from __future__ import annotations

import json
import threading
import time

import openai
import pytest

from tests.fakes.openai import FakeOpenAI, call, delay, error, text, tool_calls

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
MODEL = "gpt-4o-mini"


@pytest.fixture(scope="module")
def fake():
    with FakeOpenAI(api_key="sk-test") as server:
        yield server


@pytest.fixture(autouse=True)
def _clean(fake, monkeypatch):
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    fake.reset()


@pytest.fixture
def client(fake):
    return openai.OpenAI(base_url=f"{fake.url}/v1", api_key="sk-test", max_retries=0, timeout=5)


def user(content="hi"):
    return {"role": "user", "content": content}


def assistant_calls(*ids):
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": i, "type": "function", "function": {"name": "get_weather", "arguments": "{}"}} for i in ids]}


def tool_msg(call_id, content="sunny"):
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def test_text_reply(fake, client):
    fake.script(text("hello there"))
    resp = client.chat.completions.create(model=MODEL, messages=[user()])
    assert resp.choices[0].message.content == "hello there"
    assert resp.choices[0].finish_reason == "stop"
    assert resp.model == MODEL and resp.id.startswith("chatcmpl-")
    assert resp.usage.prompt_tokens > 0 and resp.usage.prompt_tokens_details.cached_tokens == 0
    rec = fake.last_request
    assert rec["json"]["messages"] == [user()] and rec["headers"]["authorization"] == "Bearer sk-test"
    assert rec["status"] == 200 and fake.wait_for_requests(1)


def test_parallel_tool_calls_and_follow_up(fake, client):
    a, b = call("get_weather", {"city": "Oslo"}, id="call_a"), call("get_weather", '{"city": "Rome"}')
    fake.script(tool_calls(a, b), text("both sunny"))
    resp = client.chat.completions.create(model=MODEL, messages=[user()], tools=TOOLS)
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    got = [(c.id, c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls]
    assert got == [("call_a", "get_weather", {"city": "Oslo"}), (b.id, "get_weather", {"city": "Rome"})]
    follow = [user(), assistant_calls("call_a", b.id), tool_msg(b.id), tool_msg("call_a")]
    resp = client.chat.completions.create(model=MODEL, messages=follow, tools=TOOLS)
    assert resp.choices[0].message.content == "both sunny"


def test_orphan_tool_message_is_rejected(fake, client):
    fake.script(text("never sent"))
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model=MODEL, messages=[user(), tool_msg("call_x")])
    assert "must be a response to a preceeding message with 'tool_calls'" in exc.value.message
    assert exc.value.body["param"] == "messages.[1].role"
    with pytest.raises(openai.BadRequestError):  # a user message between call and answer breaks it
        client.chat.completions.create(
            model=MODEL, messages=[user(), assistant_calls("c1"), user(), tool_msg("c1")])
    assert fake.pending == 1


def test_missing_tool_answer_is_rejected_without_eating_script(fake, client):
    fake.script(text("kept"))
    msgs = [user(), assistant_calls("call_1", "call_2"), tool_msg("call_1"), user("next")]
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model=MODEL, messages=msgs)
    assert "did not have response messages: call_2" in exc.value.message
    assert fake.pending == 1 and fake.last_request["status"] == 400
    resp = client.chat.completions.create(model=MODEL, messages=[user()])
    assert resp.choices[0].message.content == "kept"


@pytest.mark.parametrize("bad_id", [None, "", "absent"])
def test_a_tool_call_without_id_is_rejected_like_the_real_api(fake, client, bad_id):
    fake.script(text("kept"))
    calls = assistant_calls("call_1", "call_2")
    if bad_id == "absent":
        del calls["tool_calls"][1]["id"]
    else:
        calls["tool_calls"][1]["id"] = bad_id
    msgs = [user(), calls, tool_msg("call_1"), tool_msg(str(bad_id))]
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model=MODEL, messages=msgs)
    assert exc.value.status_code == 400
    assert exc.value.body == {"message": "Missing required parameter: 'messages[1].tool_calls[1].id'.",
                              "type": "invalid_request_error", "param": "messages[1].tool_calls[1].id",
                              "code": "missing_required_parameter"}
    assert fake.pending == 1  # nothing consumed


def test_a_tool_call_without_function_name_is_rejected(fake, client):
    calls = assistant_calls("call_1")
    calls["tool_calls"][0]["function"] = {"arguments": "{}"}
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model=MODEL, messages=[user(), calls, tool_msg("call_1")])
    assert exc.value.body["param"] == "messages[1].tool_calls[0].function.name"


def test_an_assistant_message_with_null_content_needs_tool_calls(fake, client):
    fake.script(text("kept"))
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model=MODEL, messages=[user(), {"role": "assistant", "content": None}, user()])
    assert exc.value.body["message"] == "Invalid value for 'content': expected a string, got null."
    assert exc.value.body["param"] == "messages.[1].content"
    resp = client.chat.completions.create(model=MODEL, messages=[user(), {"role": "assistant", "content": ""}, user()])
    assert resp.choices[0].message.content == "kept"


def test_a_call_answered_twice_is_rejected_like_the_real_api(fake, client):
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model=MODEL, messages=[user(), assistant_calls("c1", "c1"), tool_msg("c1"),
                                                              tool_msg("c1")])
    assert exc.value.body["message"] == ("Invalid parameter: Duplicate value for 'tool_call_id' of 'c1', "
                                         "in messages[2] and messages[3].")


@pytest.mark.parametrize("shape", ["shared", "one_chunk"])
def test_streaming_tool_calls_under_one_index(fake, client, shape):
    fake.script(tool_calls(call("get_weather", {"city": "Oslo"}, id="c1"),
                           call("lookup", {"q": "x" * 20}, id="c2"), index_shape=shape))
    pieces = []
    for chunk in client.chat.completions.create(model=MODEL, messages=[user()], stream=True):
        for ch in chunk.choices:
            pieces.append([(tc.index, tc.id, tc.function.arguments) for tc in ch.delta.tool_calls or []])
    pieces = [p for p in pieces if p]
    assert {index for p in pieces for index, _, _ in p} == {0}
    if shape == "one_chunk":
        assert pieces == [[(0, "c1", '{"city": "Oslo"}'), (0, "c2", json.dumps({"q": "x" * 20}))]]
    else:
        ids = [tc_id for p in pieces for _, tc_id, _ in p if tc_id]
        assert ids == ["c1", "c2"] and all(len(p) == 1 for p in pieces) and len(pieces) > 4


def test_schema_validation(fake, client):
    bad_tools = [{"type": "function", "function": {"name": "bad name"}}]
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=[user()], tools=bad_tools)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=[{"content": "no role"}])
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=[])


def test_auth_errors_and_models(fake):
    bad = openai.OpenAI(base_url=f"{fake.url}/v1", api_key="sk-wrong-key", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as exc:
        bad.chat.completions.create(model=MODEL, messages=[user()])
    assert exc.value.code == "invalid_api_key" and "Incorrect API key provided" in exc.value.message
    good = openai.OpenAI(base_url=f"{fake.url}/v1", api_key="sk-test")
    assert [m.id for m in good.models.list()] == [MODEL]


def test_scripted_http_errors(fake, client):
    fake.script(error(429, "Rate limit reached", "requests", "rate_limit_exceeded",
                      headers={"retry-after": "0"}), error(500, "boom", "server_error"))
    with pytest.raises(openai.RateLimitError) as exc:
        client.chat.completions.create(model=MODEL, messages=[user()])
    assert exc.value.response.headers["retry-after"] == "0"
    with pytest.raises(openai.InternalServerError):
        client.chat.completions.create(model=MODEL, messages=[user()])


def test_streaming_text(fake, client):
    fake.script(text("streamed words arrive in pieces"))
    stream = client.chat.completions.create(model=MODEL, messages=[user()], stream=True,
                                            stream_options={"include_usage": True})
    parts, finish, usage = [], None, None
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for ch in chunk.choices:
            parts.append(ch.delta.content or "")
            finish = ch.finish_reason or finish
    assert "".join(parts) == "streamed words arrive in pieces" and len(parts) > 2
    assert finish == "stop" and usage.total_tokens > 0


def test_streaming_tool_calls(fake, client):
    fake.script(tool_calls(call("get_weather", {"city": "Oslo"}, id="c1"),
                           call("lookup", {"q": "x" * 20}, id="c2")))
    calls: dict[int, dict] = {}
    finish = None
    for chunk in client.chat.completions.create(model=MODEL, messages=[user()], stream=True):
        ch = chunk.choices[0]
        finish = ch.finish_reason or finish
        for tc in ch.delta.tool_calls or []:
            slot = calls.setdefault(tc.index, {"id": None, "name": "", "args": ""})
            slot["id"] = tc.id or slot["id"]
            slot["name"] += tc.function.name or ""
            slot["args"] += tc.function.arguments or ""
    assert finish == "tool_calls"
    assert [(c["id"], c["name"], json.loads(c["args"])) for c in calls.values()] == [
        ("c1", "get_weather", {"city": "Oslo"}), ("c2", "lookup", {"q": "x" * 20})]


def test_delays_are_concurrent(fake, client):
    fake.script(delay(0.6, "a"), delay(0.6, "b"))
    out: list[str] = []

    def ask():
        out.append(client.chat.completions.create(model=MODEL, messages=[user()]).choices[0].message.content)

    start = time.monotonic()
    threads = [threading.Thread(target=ask) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    elapsed = time.monotonic() - start
    assert sorted(out) == ["a", "b"] and 0.55 < elapsed < 1.1


def test_responder_used_when_queue_empty(fake, client):
    fake.responder = lambda req: text(f"echo: {req['messages'][-1]['content']}")
    fake.script("scripted first")
    contents = [client.chat.completions.create(model=MODEL, messages=[user(w)]).choices[0].message.content
                for w in ("one", "two")]
    assert contents == ["scripted first", "echo: two"]
    fake.reset()
    assert client.chat.completions.create(model=MODEL, messages=[user()]).choices[0].message.content == (
        "(no scripted reply)")


def test_prompt_cache_emulation(fake, client):
    system = {"role": "system", "content": "rules " * 1500}
    first = client.chat.completions.create(model=MODEL, messages=[system, user("a")])
    second = client.chat.completions.create(model=MODEL, messages=[system, user("b")])
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached >= 1024 and cached % 128 == 0 and cached <= second.usage.prompt_tokens
    assert fake.last_request["cached_tokens"] == cached and 0 < fake.cache_hit_ratio() < 1


async def test_async_client(fake):
    fake.script(text("async ok"))
    aclient = openai.AsyncOpenAI(base_url=f"{fake.url}/v1", api_key="sk-test", max_retries=0)
    resp = await aclient.chat.completions.create(model=MODEL, messages=[user()])
    assert resp.choices[0].message.content == "async ok"
    await aclient.close()


def test_the_model_client_posts_json_the_api_reads(fake):
    """``agent.model`` posts its own JSON bytes (orjson): non-ASCII as UTF-8, and what orjson refuses
    (a lone surrogate from a tool result, an integer beyond 64 bits) still as valid JSON, with the
    rest of the body encoded the same way (the session's prefix keeps its bytes)."""
    from agent.model import OpenAIChatModel, request_json

    model = OpenAIChatModel(base_url=f"{fake.url}/v1", api_key="sk-test", model=MODEL, max_retries=0)
    fake.script(text("ok"))
    system = {"role": "system", "content": "你是助手"}
    odd = {"role": "user", "content": "bad \ud800 half"}
    assert model.complete([system, odd], []).content == "ok"
    assert fake.last_request["json"]["messages"] == [system, odd]
    assert fake.last_request["headers"]["content-type"] == "application/json"
    plain, fallback = request_json({"messages": [system]}), request_json({"messages": [system, odd], "n": 2**70})
    assert fallback.startswith(plain[:-2]) and "你是助手".encode() in plain
    assert json.loads(fallback) == {"messages": [system, odd], "n": 2**70}
