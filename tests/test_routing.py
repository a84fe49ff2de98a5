"""Routes and providers below the gateway: the circuit breaker's states on a test clock, what a
provider's error means (``agent.model_errors``), requests adapted to what a server lacks, and
the route driven through the real ``openai`` client against fakes that refuse what such servers
refuse (no ``stream_options``, no parallel tool calls, no vision; an invalid tool schema)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from agent.model import ModelError, OpenAIChatModel
from agent.model_errors import named_limit, retry_after_s
from agent.providers import IMAGE_NOTE, Provider, Target, adapt_messages, split_target
from agent.routing import HealthBoard, HealthSettings, ProviderHealth, RoutedModel
from gateway.core.config import load_config
from gateway.core.errors import ConfigError
from tests.fakes import openai as oa


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


SETTINGS = HealthSettings(failures_to_open=2, open_s=30.0, rate_limit_cooldown_s=20.0, auth_recheck_s=600.0)


def test_breaker_opens_after_failures_in_a_row_skips_then_lets_one_probe_through():
    clock = Clock()
    health = ProviderHealth("p", SETTINGS, clock)
    assert health.admit() is None
    health.failed("server", detail="server (503)")
    assert health.admit() is None and health.snapshot()["state"] == "ok"  # one failure: still closed
    health.failed("timeout")
    assert health.admit() == "open" and health.snapshot()["state"] == "open"
    clock.now += 29.9
    assert health.admit() == "open"
    clock.now += 0.2
    assert health.snapshot()["state"] == "half_open"
    assert health.admit() is None  # this call is the probe
    assert health.admit() == "probing"  # a second caller meanwhile skips the provider
    health.failed("connection")  # the probe failed: open again for open_s
    assert health.admit() == "open" and health.snapshot()["state"] == "open"
    clock.now += 30.1
    assert health.admit() is None
    health.succeeded()
    assert health.snapshot()["state"] == "ok" and health.admit() is None and health.admit() is None


def test_a_success_between_failures_resets_the_count_and_a_400_on_a_probe_closes_the_circuit():
    clock = Clock()
    health = ProviderHealth("p", SETTINGS, clock)
    health.failed("server")
    health.succeeded()
    health.failed("server")
    assert health.admit() is None  # not two in a row
    health.failed("server")
    clock.now += 31
    assert health.admit() is None
    health.failed("request")  # the provider answered: the request was at fault
    assert health.snapshot()["state"] == "ok"


def test_429_cools_down_for_retry_after_or_the_default_and_is_no_breaker_failure():
    clock = Clock()
    health = ProviderHealth("p", SETTINGS, clock)
    health.failed("rate_limited", retry_after=5.0)
    assert health.admit() == "cooldown" and health.retry_in() == pytest.approx(5.0)
    clock.now += 5.0
    assert health.admit() is None and health.snapshot()["state"] == "ok"
    health.failed("rate_limited")  # no Retry-After
    assert health.snapshot()["retry_in_s"] == pytest.approx(20.0)
    clock.now += 20.0
    health.failed("rate_limited", retry_after=0.0)
    assert health.admit() is None  # Retry-After: 0 asks for no wait


def test_401_marks_the_provider_down_logged_once_and_probes_it_after_auth_recheck_s(caplog):
    clock = Clock()
    health = ProviderHealth("openai", SETTINGS, clock, key_env="OPENAI_API_KEY")
    caplog.set_level(logging.INFO, "agent.routing")
    health.failed("auth", detail="it rejected the API key (401)")
    assert health.admit() == "down"
    clock.now += 600
    assert health.admit() is None  # the probe
    health.failed("auth", detail="it rejected the API key (401)")
    assert health.admit() == "down"
    downs = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(downs) == 1 and "model provider openai is down" in downs[0].getMessage()
    assert "OPENAI_API_KEY" in downs[0].getMessage() and "gateway doctor" in downs[0].getMessage()
    clock.now += 600
    health.admit()
    health.succeeded()
    assert health.snapshot()["state"] == "ok"
    assert any("answers again" in r.getMessage() for r in caplog.records)


def test_retry_after_reads_milliseconds_seconds_and_http_dates_and_caps_them():
    assert retry_after_s({"retry-after-ms": "1500"}) == 1.5
    assert retry_after_s({"retry-after": "7"}) == 7.0
    assert retry_after_s({"retry-after": "Wed, 21 Oct 2015 07:28:10 GMT"}, now=1445412480.0) == 10.0
    assert retry_after_s({"retry-after": "99999"}) == 3600.0
    assert retry_after_s({"retry-after": "soon"}) is None and retry_after_s({}) is None


@pytest.mark.parametrize(("message", "limit"), [
    ("This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens.", 8192),
    ("prompt is too long: 210000 tokens > 200000 maximum", 200000),
    ("The input token count (1200000) exceeds the maximum number of tokens allowed (1048576).", 1048576),
    ("the request exceeds the available context size (4096 tokens), try increasing it", 4096),
])
def test_context_refusals_of_each_server_name_their_window(message, limit):
    assert named_limit(message) == limit


def test_route_entries_split_at_the_first_colon():
    assert split_target("local:qwen2.5:7b") == ("local", "qwen2.5:7b")
    for bad in ("gpt-4o", ":m", "p:"):
        with pytest.raises(ValueError):
            split_target(bad)


def test_adapting_leaves_a_request_untouched_when_nothing_is_lacking():
    messages = [{"role": "user", "content": [{"type": "text", "text": "hi"},
                                             {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}]}]
    assert adapt_messages(messages, frozenset()) is messages
    assert adapt_messages(messages, frozenset({"parallel_tool_calls"})) is messages
    shown = adapt_messages(messages, frozenset({"vision"}))
    assert shown[0]["content"][1] == {"type": "text", "text": IMAGE_NOTE} and messages[0]["content"][1]["type"] == \
        "image_url"  # the shared projection is never changed


def test_parallel_calls_become_one_call_per_message_each_followed_by_its_result():
    a = {"id": "call_a", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    b = {"id": "call_b", "type": "function", "function": {"name": "g", "arguments": "{}"}}
    messages = [{"role": "user", "content": "go"},
                {"role": "assistant", "content": "Doing both.", "tool_calls": [a, b]},
                {"role": "tool", "tool_call_id": "call_b", "content": "B"},
                {"role": "tool", "tool_call_id": "call_a", "content": "A"},
                {"role": "assistant", "content": "done"}]
    assert adapt_messages(messages, frozenset({"parallel_tool_calls"})) == [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "Doing both.", "tool_calls": [a]},
        {"role": "tool", "tool_call_id": "call_a", "content": "A"},
        {"role": "assistant", "content": None, "tool_calls": [b]},
        {"role": "tool", "tool_call_id": "call_b", "content": "B"},
        {"role": "assistant", "content": "done"}]


# -- the route through the real openai client against fakes ----------------------------------------

@pytest.fixture(scope="module")
def plain() -> Iterator[oa.FakeOpenAI]:
    """A server that lacks stream_options, parallel tool calls and vision (a local one)."""
    with oa.FakeOpenAI(api_key="sk-plain", lacks=("stream_options", "parallel_tool_calls", "vision")) as fake:
        yield fake


def route(*pairs: tuple[oa.FakeOpenAI, frozenset[str]]) -> tuple[RoutedModel, HealthBoard]:
    providers = {f"p{i}": Provider(f"p{i}", f"{fake.url}/v1", fake.api_key, lacks=lacks)
                 for i, (fake, lacks) in enumerate(pairs)}
    board = HealthBoard(providers)

    def client(target: Target, last: bool) -> OpenAIChatModel:
        return OpenAIChatModel(base_url=target.provider.base_url, api_key=target.provider.api_key, model=target.model,
                               max_retries=0, stream_options="stream_options" not in target.lacks)

    return RoutedModel("test", [Target(p, "gpt-4o-mini") for p in providers.values()], client, board), board


IMAGE = [{"role": "user", "content": [{"type": "text", "text": "what is on it?"},
                                      {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0K"}}]}]


def test_the_fake_refuses_what_a_lacking_server_refuses(plain):
    plain.reset()
    model, _ = route((plain, frozenset()))
    with pytest.raises(ModelError) as stream_options:
        model.complete([{"role": "user", "content": "hi"}], [])
    assert stream_options.value.reason == "request" and stream_options.value.status == 400
    assert plain.requests[-1]["status"] == 400 and "stream_options" in plain.requests[-1]["json"]


def test_a_target_lacking_vision_and_stream_options_gets_a_request_it_accepts(plain):
    plain.reset()
    plain.script("A cat, I am told.")
    model, _ = route((plain, frozenset({"vision", "stream_options"})))
    reply = model.complete(IMAGE, [])
    assert reply.content == "A cat, I am told." and (reply.provider, reply.model) == ("p0", "gpt-4o-mini")
    sent = plain.requests[-1]
    assert sent["status"] == 200 and "stream_options" not in sent["json"] and sent["json"]["stream"] is True
    assert sent["json"]["messages"][0]["content"][1] == {"type": "text", "text": IMAGE_NOTE}
    assert reply.usage.estimated and reply.usage.prompt_tokens > 0  # the server sent no usage


def test_an_image_refused_by_a_server_without_vision_is_the_request_s_fault_and_no_failover(plain, fake_openai):
    plain.reset()
    fake_openai.reset()
    model, board = route((plain, frozenset({"stream_options"})), (fake_openai, frozenset()))
    with pytest.raises(ModelError) as refused:
        model.complete(IMAGE, [])
    assert refused.value.reason == "request" and refused.value.provider == "p0"
    assert fake_openai.requests == [] and board.of("p0").snapshot()["state"] == "ok"


def test_an_invalid_tool_schema_is_reported_by_name_and_not_failed_over(fake_openai, plain):
    fake_openai.reset()
    plain.reset()
    tools = [{"type": "function", "function": {"name": "fine", "parameters": {"type": "object"}}},
             {"type": "function", "function": {"name": "bad name", "parameters": {"type": "object"}}}]
    model, _ = route((fake_openai, frozenset()), (plain, frozenset({"stream_options"})))
    with pytest.raises(ModelError) as refused:
        model.complete([{"role": "user", "content": "hi"}], tools)
    assert refused.value.reason == "invalid_tools" and refused.value.param == "tools[1].function.name"
    assert "'bad name'" in refused.value.user_message and plain.requests == []


def test_every_target_failing_gives_one_error_and_every_skipped_target_fails_without_a_request(fake_openai, plain):
    fake_openai.reset()
    plain.reset()
    fake_openai.script(oa.error(503, "The server is overloaded", "server_error"))
    plain.script(oa.error(429, "Rate limit reached", "requests", "rate_limit_exceeded", headers={"retry-after": "40"}))
    model, board = route((fake_openai, frozenset()), (plain, frozenset({"stream_options"})))
    with pytest.raises(ModelError) as failed:
        model.complete([{"role": "user", "content": "hi"}], [])
    assert failed.value.reason == "rate_limited" and "None of the configured models" in failed.value.user_message
    board.of("p0").failed("server")  # p0's second failure in a row: open; p1 cools down
    board.of("p0").failed("server")
    with pytest.raises(ModelError) as unavailable:
        model.complete([{"role": "user", "content": "hi"}], [])
    assert unavailable.value.reason == "unavailable" and "try again in" in unavailable.value.user_message
    assert len(fake_openai.requests) == 1 and len(plain.requests) == 1  # nothing was asked the second time


def test_max_concurrency_holds_further_calls_until_a_slot_is_free(fake_openai):
    import threading
    import time

    fake_openai.reset()
    gate = threading.Event()
    arrived: list[float] = []
    fake_openai.on_request = lambda body: arrived.append(time.monotonic())
    fake_openai.script(oa.hold(gate, "first"), "second")
    provider = Provider("p0", f"{fake_openai.url}/v1", fake_openai.api_key, max_concurrency=1)
    model = RoutedModel("test", [Target(provider, "gpt-4o-mini")],
                        lambda t, last: OpenAIChatModel(base_url=provider.base_url, api_key=provider.api_key,
                                                        model="gpt-4o-mini", max_retries=0),
                        HealthBoard({"p0": provider}))
    replies: list[str] = []
    calls = [threading.Thread(target=lambda: replies.append(model.complete([{"role": "user", "content": "hi"}],
                                                                           []).content or ""))
             for _ in range(2)]
    for thread in calls:
        thread.start()
    deadline = time.monotonic() + 10
    while not arrived and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.3)  # room for a second request to arrive, were it not held back
    released = time.monotonic()
    gate.set()
    for thread in calls:
        thread.join(10)
    assert sorted(replies) == ["first", "second"]
    assert len(arrived) == 2 and arrived[1] > released  # the second went only once the first slot was free


# -- configuration -------------------------------------------------------------------------------

PROVIDERS = [{"name": "openai", "base_url": "https://api.openai.com/v1", "api_key_env": "OPENAI_API_KEY",
              "models": {"gpt-4o-mini": {"context_window_tokens": 128000, "input": 0.15, "output": 0.6}}},
             {"name": "local", "base_url": "http://127.0.0.1:11434/v1", "lacks": ["vision"],
              "models": {"qwen2.5:7b": {"context_window_tokens": 32768}}}]


def test_without_providers_the_route_is_the_single_endpoint_as_before():
    config = load_config(None, llm={"base_url": "http://127.0.0.1:9/v1", "model": "m1"})
    assert config.llm.route_entries() == [("default", "m1")] and config.llm.route_window() == 128_000
    provider = config.llm.build_providers(lambda name: None)["default"]
    assert provider.base_url == "http://127.0.0.1:9/v1" and provider.key_missing


def test_routes_name_declared_models_and_the_primary_sets_the_window(monkeypatch):
    monkeypatch.setenv("GATEWAY__LLM__ROUTE", '["openai:gpt-4o-mini", "local:qwen2.5:7b"]')
    config = load_config(None, llm={"providers": PROVIDERS, "routes": {"local-first": {
        "models": ["local:qwen2.5:7b", "openai:gpt-4o-mini"]}}})
    assert config.llm.route_entries() == [("openai", "gpt-4o-mini"), ("local", "qwen2.5:7b")]
    assert config.llm.route_window("local-first") == 32768
    assert config.llm.provider_prices()["openai:gpt-4o-mini"].input == 0.15
    local = config.llm.build_providers(lambda name: None)["local"]
    assert not local.key_missing and local.lacks == frozenset({"vision"})


@pytest.mark.parametrize(("llm", "says"), [
    ({"providers": PROVIDERS, "route": ["local:qwen3"]}, "provider 'local' lists no model 'qwen3'"),
    ({"providers": PROVIDERS, "route": ["nope:m"]}, "names no provider"),
    ({"providers": PROVIDERS, "route": ["gpt-4o-mini"]}, "is not provider:model"),
    ({"providers": [*PROVIDERS, PROVIDERS[1]]}, "names must be unique"),
    ({"providers": PROVIDERS, "routes": {"default": {"models": ["local:qwen2.5:7b"]}}}, "that name is llm.route's"),
    ({"providers": [{**PROVIDERS[1], "lacks": ["telepathy"]}]}, "lacks"),
    ({"providers": [{**PROVIDERS[1], "models": {"m": {"input": 1.0}}}]}, "input and output prices together"),
])
def test_a_bad_route_or_provider_is_a_config_error_naming_it(llm, says):
    with pytest.raises(ConfigError) as error:
        load_config(None, llm=llm)
    assert says in str(error.value)


def test_the_example_config_s_providers_block_loads_when_uncommented(tmp_path):
    from pathlib import Path

    example = (Path(__file__).resolve().parents[1] / "deploy" / "gateway.example.toml").read_text()
    start = example.index("# route = [")
    end = example.index("# end of providers")
    block = "\n".join(line[2:] if line.startswith("# ") else line.lstrip("#")
                      for line in example[start:end].splitlines())
    path = tmp_path / "gateway.toml"
    path.write_text(example[:start] + block + "\n" + example[end:])
    llm = load_config(path).llm
    assert llm.route_entries() == [("openai", "gpt-4o-mini"), ("anthropic", "claude-sonnet-4-5"),
                                   ("local", "qwen2.5:7b")]
    assert llm.route_entries("local-first")[0] == ("local", "qwen2.5:7b")
    local = llm.build_providers(lambda name: "k")["local"]
    assert local.max_concurrency == 2 and local.info("qwen2.5:7b").lacks == frozenset({"vision"})


@pytest.mark.parametrize("body", [{"error": {"message": "upstream timed out", "type": "upstream_error", "code": 502}},
                                  {"id": "chatcmpl-1", "object": "chat.completion", "model": "gpt-4o-mini",
                                   "choices": []}])
def test_an_answer_without_a_completion_is_the_provider_s_fault_and_fails_over(fake_openai, plain, body):
    # A proxy may answer an upstream failure with status 200 and an error object, or send a
    # completion without choices. Not streamed, that raised TypeError/IndexError from the client:
    # no failover to the route's next model, the turn ran again twice and ended with an apology.
    fake_openai.reset()
    plain.reset()
    fake_openai.script(oa.raw(body))
    plain.script("answered by the fallback")
    providers = {"p0": Provider("p0", f"{fake_openai.url}/v1", fake_openai.api_key, lacks=frozenset({"stream"})),
                 "p1": Provider("p1", f"{plain.url}/v1", plain.api_key, lacks=frozenset({"stream_options"}))}

    def client(target: Target, last: bool) -> OpenAIChatModel:
        return OpenAIChatModel(base_url=target.provider.base_url, api_key=target.provider.api_key, model=target.model,
                               max_retries=0, stream="stream" not in target.lacks,
                               stream_options="stream_options" not in target.lacks)

    model = RoutedModel("test", [Target(p, "gpt-4o-mini") for p in providers.values()], client, HealthBoard(providers))
    reply = model.complete([{"role": "user", "content": "hi"}], [])
    assert (reply.content, reply.provider) == ("answered by the fallback", "p1")
    assert not fake_openai.requests[0]["json"].get("stream")  # the call that was not streamed
