"""The streamed model call on the SDK's HTTP client (``agent.model_http``): the SDK's retry policy
and error types, and server-sent events as servers write them, against the fake OpenAI API and a
raw SSE server on loopback."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator

import pytest
from aiohttp import web

from agent.model import ModelError, OpenAIChatModel
from tests.fakes import openai as oa

MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.fixture
def fake(fake_openai):
    fake_openai.reset()
    yield fake_openai
    fake_openai.reset()


def _model(url: str, retries: int) -> OpenAIChatModel:
    return OpenAIChatModel(base_url=f"{url}/v1", api_key="sk-test", model="gpt-4o-mini", max_retries=retries)


def _fast(status: int, **headers: str) -> oa.ErrorReply:
    return oa.error(status, f"error {status}", "server_error", headers={"retry-after-ms": "5", **headers})


def test_retryable_statuses_are_retried_with_the_same_body_then_answered(fake):
    fake.script(_fast(429), _fast(503), "hello")
    reply = _model(fake.url, retries=2).complete(MESSAGES, [])
    assert reply.content == "hello"
    sent = fake.requests
    assert [r["status"] for r in sent] == [429, 503, 200]
    assert sent[0]["json"] == sent[2]["json"] and sent[0]["json"]["stream"] is True
    headers = [{k.lower(): v for k, v in r["headers"].items()} for r in sent]
    assert [h.get("x-stainless-retry-count") for h in headers] == ["0", "1", "2"]
    assert headers[0]["authorization"] == "Bearer sk-test"


def test_retries_stop_at_max_retries_and_the_last_error_is_reported(fake):
    fake.script(_fast(500), _fast(500), _fast(502))
    with pytest.raises(ModelError) as raised:
        _model(fake.url, retries=2).complete(MESSAGES, [])
    assert raised.value.reason == "server" and raised.value.status == 502
    assert len(fake.requests) == 3


@pytest.mark.parametrize(("reply", "reason"), [
    (oa.error(400, "This model's maximum context length is 8192 tokens", code="context_length_exceeded"),
     "context_length"),
    (oa.error(401, "Incorrect API key provided", code="invalid_api_key"), "auth"),
    (_fast(500, **{"x-should-retry": "false"}), "server"),
    (oa.error(429, "Rate limit reached", "requests", headers={"retry-after": "120"}), "rate_limited"),
])
def test_what_the_sdk_does_not_retry_is_asked_once(fake, reply, reason):
    fake.script(reply)
    with pytest.raises(ModelError) as raised:
        _model(fake.url, retries=2).complete(MESSAGES, [])
    assert raised.value.reason == reason
    assert len(fake.requests) == 1
    if reason == "context_length":
        assert raised.value.limit_tokens == 8192  # read from the SDK-shaped message
    if reason == "rate_limited":
        assert raised.value.retry_after == 120.0


def test_x_should_retry_true_retries_a_4xx(fake):
    fake.script(oa.error(400, "try again", headers={"x-should-retry": "true", "retry-after-ms": "5"}), "ok")
    assert _model(fake.url, retries=1).complete(MESSAGES, []).content == "ok"
    assert len(fake.requests) == 2


def test_a_refused_connection_is_a_connection_error():
    with pytest.raises(ModelError) as raised:
        _model("http://127.0.0.1:9", retries=0).complete(MESSAGES, [])
    assert raised.value.reason == "connection"


def test_a_stream_cut_mid_answer_is_not_resent(fake):
    fake.script(oa.cut("one two three four five six", after_chunks=2), "never asked")
    seen: list[str] = []
    with pytest.raises(ModelError) as raised:
        _model(fake.url, retries=2).complete(MESSAGES, [], on_text=seen.append)
    assert raised.value.reason == "connection" and seen  # text had arrived; the router calls it "stream"
    assert len(fake.requests) == 1


class RawSSE:
    """A server that answers every POST with ``body`` as ``text/event-stream`` (chunked)."""

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.url = ""
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None

    def __enter__(self) -> RawSSE:
        threading.Thread(target=self._serve, daemon=True).start()
        assert self._ready.wait(5)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._loop.stop)

    def _serve(self) -> None:
        self._loop = asyncio.new_event_loop()

        async def answer(request: web.Request) -> web.StreamResponse:
            await request.read()
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            for piece in (self.body[i:i + 7] for i in range(0, len(self.body), 7)):  # events split anywhere
                await response.write(piece)
            await response.write_eof()
            return response

        async def start() -> None:
            app = web.Application()
            app.router.add_post("/v1/chat/completions", answer)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
            self._ready.set()

        self._loop.run_until_complete(start())
        self._loop.run_forever()


def _chunk(content: str) -> str:
    return json.dumps({"id": "c", "object": "chat.completion.chunk",
                       "choices": [{"index": 0, "delta": {"content": content}}]})


@pytest.fixture
def raw_sse() -> Iterator[type[RawSSE]]:
    yield RawSSE


def test_sse_as_servers_write_it_comments_event_names_crlf_and_multiline_data(raw_sse):
    body = (": keep-alive comment\r\n\r\n"
            f"event: message\r\ndata: {_chunk('Hel')}\r\n\r\n"
            f"data:{_chunk('lo')}\n\n"
            'data: {"id":"c","object":"chat.completion.chunk",\ndata: "choices":[{"index":0,"delta":{},'
            '"finish_reason":"stop"}]}\n\n'
            "retry: 1000\n\n"
            "data: [DONE]\n\n").encode()
    with raw_sse(body) as server:
        reply = _model(server.url, retries=0).complete(MESSAGES, [])
    assert reply.content == "Hello" and reply.finish_reason == "stop"


def test_an_error_event_inside_the_stream_is_a_model_error(raw_sse):
    body = (f"data: {_chunk('partial')}\n\n"
            'data: {"error":{"message":"The server had an error","type":"server_error"}}\n\n').encode()
    with raw_sse(body) as server, pytest.raises(ModelError) as raised:
        _model(server.url, retries=2).complete(MESSAGES, [])
    assert raised.value.reason == "stream"


def test_an_event_that_is_not_json_is_a_model_error_not_a_crash(raw_sse):
    with raw_sse(b"data: {not json\n\n") as server, pytest.raises(ModelError) as raised:
        _model(server.url, retries=0).complete(MESSAGES, [])
    assert raised.value.reason == "stream"
