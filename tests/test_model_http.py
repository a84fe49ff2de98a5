"""The streamed model call, on libcurl (``agent.model_curl``, the default where pycurl imports)
and on the SDK's HTTP client (``agent.model_http``, httpx): every test runs on both. The SDK's
retry policy and error types, and server-sent events as servers write them, against the fake
OpenAI API and a raw HTTP server on loopback (bytes as given: chunked bodies split anywhere,
connections closed early or kept open)."""

from __future__ import annotations

import gzip
import json
import os
import re
import resource
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx2
import pytest

from agent import model_http
from agent.model import ModelError, OpenAIChatModel
from tests.fakes import openai as oa

MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.fixture(autouse=True, params=["curl", "httpx"])
def http_client(request, monkeypatch) -> str:
    """Each test once per HTTP client: ``auto`` picks libcurl, or httpx where pycurl is missing."""
    import agent.model

    if request.param == "httpx":
        monkeypatch.setattr(agent.model, "curl_available", lambda: False)
    else:
        assert agent.model.curl_available()  # a dependency: its absence must fail, not skip
    return request.param


def test_the_streamed_call_goes_out_on_the_client_auto_picks(fake, http_client):
    from agent.model_curl import CurlEndpoint
    from agent.model_http import StreamingEndpoint

    fake.script("hello")
    model = _model(fake.url, retries=0)
    assert model.complete(MESSAGES, []).content == "hello"
    assert isinstance(model._shard[1], CurlEndpoint if http_client == "curl" else StreamingEndpoint)


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
    (oa.error(429, "Rate limit reached", "requests", headers={"retry-after": "121"}), "rate_limited"),
    (oa.error(429, "Rate limit reached", "requests", headers={"retry-after": "1e400"}), "rate_limited"),
])
def test_what_the_sdk_does_not_retry_is_asked_once(fake, reply, reason):
    fake.script(reply)
    with pytest.raises(ModelError) as raised:
        _model(fake.url, retries=2).complete(MESSAGES, [])
    assert raised.value.reason == reason
    assert len(fake.requests) == 1
    if reason == "context_length":
        assert raised.value.limit_tokens == 8192  # read from the SDK-shaped message
    if reason == "rate_limited" and reply.headers["retry-after"] == "121":
        assert raised.value.retry_after == 121.0


def test_x_should_retry_true_retries_a_4xx(fake):
    fake.script(oa.error(400, "try again", headers={"x-should-retry": "true", "retry-after-ms": "5"}), "ok")
    assert _model(fake.url, retries=1).complete(MESSAGES, []).content == "ok"
    assert len(fake.requests) == 2


def test_a_refused_connection_is_a_connection_error():
    with pytest.raises(ModelError) as raised:
        _model("http://127.0.0.1:9", retries=0).complete(MESSAGES, [])
    assert raised.value.reason == "connection"


def test_a_long_stream_feeds_on_text_each_growing_text_and_ends_whole(fake):
    """A reply streamed in 400 deltas: ``on_text`` sees the text so far after each delta, each a
    longer prefix of the reply (the accumulated text is appended to between calls, never rebuilt
    from the pieces, and must still be exactly the pieces joined), but never the whole reply: the
    last delta is followed by the chunk that ends the reply, so the reply is delivered whole."""
    words = " ".join(f"word{i}" for i in range(400))
    fake.script(oa.text(words, pieces=400))
    seen: list[str] = []
    reply = _model(fake.url, retries=0).complete(MESSAGES, [], on_text=seen.append)
    pieces = oa._pieces(words, 400)
    assert reply.content == words
    assert seen == ["".join(pieces[:n]) for n in range(1, len(pieces))]


def test_a_stream_cut_mid_answer_is_not_resent(fake):
    fake.script(oa.cut("one two three four five six", after_chunks=3), "never asked")
    seen: list[str] = []
    with pytest.raises(ModelError) as raised:
        _model(fake.url, retries=2).complete(MESSAGES, [], on_text=seen.append)
    # The first piece was shown (the second came and did not end the reply): "stream" to the router.
    assert raised.value.reason == "connection" and seen == [oa._pieces("one two three four five six")[0]]
    assert len(fake.requests) == 1


def test_waiting_for_the_next_piece_of_a_stream_costs_the_thread_no_cpu(fake):
    """Between pieces the calling thread sleeps in the client (``poll``), it does not poll: a
    reply written over 1.2 s costs it milliseconds of CPU, not a core for 1.2 s."""
    fake.script(oa.text("one two three four five six seven", pieces=5, piece_delay_s=0.3))
    model = _model(fake.url, retries=0)
    model.complete(MESSAGES, [])  # the connection and the client are set up
    fake.script(oa.text("one two three four five six seven", pieces=5, piece_delay_s=0.3))
    cpu = time.thread_time()
    assert model.complete(MESSAGES, []).content == "one two three four five six seven"
    assert time.thread_time() - cpu < 0.15


def test_a_call_waits_without_cpu_when_the_process_holds_over_1024_descriptors(fake):
    """A gateway with hundreds of turns in flight holds more than ``FD_SETSIZE`` (1024)
    descriptors: the connection's socket is numbered past what ``select(2)`` can watch, and the
    wait must still sleep (libcurl's sockets are watched with ``poll(2)``)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1200:
        assert hard == resource.RLIM_INFINITY or hard >= 1200, "this machine cannot open 1200 files"
        resource.setrlimit(resource.RLIMIT_NOFILE, (1200, hard))
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        model = _model(fake.url, retries=0)
        fake.script("warm")
        model.complete(MESSAGES, [])  # the connection (numbered past 1024) and the client are set up
        fake.script(oa.text("one two three four five six seven", pieces=5, piece_delay_s=0.3))
        cpu = time.thread_time()
        assert model.complete(MESSAGES, []).content == "one two three four five six seven"
        # Woken by libcurl's 1 ms timers instead of the socket, the 1.2 s cost 50 ms; asleep, 1-2 ms.
        assert time.thread_time() - cpu < 0.02
        assert len(os.listdir("/proc/self/fd")) > 1024
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


class RawServer:
    """A loopback server that answers every request with ``response`` (raw bytes: status line,
    headers, body), then closes the connection, or with ``hold_s`` keeps it open that long first.
    ``received`` holds each request's head (request line and headers) and body, as sent."""

    def __init__(self, response: bytes, hold_s: float = 0.0, tls: ssl.SSLContext | None = None) -> None:
        self.response, self.hold_s, self.tls = response, hold_s, tls
        self.received: list[tuple[bytes, bytes]] = []
        self._socket = socket.create_server(("127.0.0.1", 0))
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self._socket.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._socket.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        if self.tls is not None:
            try:
                conn = self.tls.wrap_socket(conn, server_side=True)
            except (ssl.SSLError, OSError):  # the client refused the certificate
                conn.close()
                return
        with conn:
            head = b""
            while b"\r\n\r\n" not in head:
                head += conn.recv(65536)
            length = int(re.search(rb"(?i)content-length: *(\d+)", head)[1])  # type: ignore[index]
            body = head.split(b"\r\n\r\n", 1)[1]
            while len(body) < length:
                body += conn.recv(65536)
            self.received.append((head.split(b"\r\n\r\n", 1)[0], body))
            for i in range(0, len(self.response), 7):  # events split anywhere
                conn.sendall(self.response[i:i + 7])
            time.sleep(self.hold_s)

    def close(self) -> None:
        self._socket.close()


def _sse(body: bytes, content_type: bytes = b"text/event-stream", end: bool = True, extra: bytes = b"") -> bytes:
    """An HTTP/1.1 200 with ``body`` in one chunk (and the last chunk when ``end``)."""
    return (b"HTTP/1.1 200 OK\r\nContent-Type: " + content_type + b"\r\nTransfer-Encoding: chunked\r\n" + extra
            + b"\r\n" + b"%x\r\n" % len(body) + body + b"\r\n" + (b"0\r\n\r\n" if end else b""))


@pytest.fixture
def raw() -> Iterator[Callable[..., RawServer]]:
    servers: list[RawServer] = []

    def start(response: bytes, hold_s: float = 0.0, tls: ssl.SSLContext | None = None) -> RawServer:
        servers.append(RawServer(response, hold_s, tls))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def _chunk(content: str) -> str:
    return json.dumps({"id": "c", "object": "chat.completion.chunk",
                       "choices": [{"index": 0, "delta": {"content": content}}]}, ensure_ascii=False)


def _model_at(server: RawServer, retries: int = 0, timeout_s: float = 10.0) -> OpenAIChatModel:
    return OpenAIChatModel(base_url=f"{server.url}/v1", api_key="sk-test", model="gpt-4o-mini",
                           max_retries=retries, timeout_s=timeout_s)


def test_sse_as_servers_write_it_comments_event_names_crlf_and_multiline_data(raw):
    body = (": keep-alive comment\r\n\r\n"
            f"event: message\r\ndata: {_chunk('Hel')}\r\n\r\n"
            f"data:{_chunk('lo')}\n\n"
            f"data: {_chunk(' you')}\r\r"
            'data: {"id":"c","object":"chat.completion.chunk",\ndata: "choices":[{"index":0,"delta":{},'
            '"finish_reason":"stop"}]}\n\n'
            "retry: 1000\n\n"
            "data: [DONE]\n\n").encode()
    reply = _model_at(raw(_sse(body))).complete(MESSAGES, [])
    assert reply.content == "Hello you" and reply.finish_reason == "stop"


def test_an_event_ended_by_a_cr_as_the_bodys_last_byte_is_kept(raw):
    """A CR at the end of what arrived waits for a possible LF; at the end of the body it is the
    line end it was (here the blank line that ends the event; no ``[DONE]`` follows)."""
    body = f"data: {_chunk('hello')}\r\r".encode()
    assert _model_at(raw(_sse(body))).complete(MESSAGES, []).content == "hello"


def test_text_with_unicode_line_separators_and_a_wrong_charset_arrives_whole(raw):
    """JSON may carry U+2028, U+2029 and U+0085 unescaped: they are text, not line ends; the event
    stream is UTF-8 whatever charset the response names."""
    text = "a\u2028b\u2029c\x85d café 日本"
    body = f"data: {_chunk(text)}\n\ndata: [DONE]\n\n".encode()
    server = raw(_sse(body, content_type=b"text/event-stream; charset=iso-8859-1"))
    assert _model_at(server).complete(MESSAGES, []).content == text


@pytest.mark.parametrize("ending", ["closed without the last chunk", "kept open after [DONE]"])
def test_an_answer_complete_at_done_is_kept_whatever_the_connection_does_then(raw, ending):
    body = f"data: {_chunk('hello')}\n\ndata: [DONE]\n\n".encode()
    server = raw(_sse(body, end=False), hold_s=3.0 if ending == "kept open after [DONE]" else 0.0)
    assert _model_at(server, timeout_s=1.0).complete(MESSAGES, []).content == "hello"


def test_a_stream_that_stalls_mid_answer_is_a_timeout_at_the_read_timeout_and_not_resent(raw):
    """No byte for the client's read timeout: a ``timeout`` once it passed (not when the server
    gives up), the request sent once."""
    server = raw(_sse(f"data: {_chunk('hel')}\n\n".encode(), end=False), hold_s=5.0)
    started = time.monotonic()
    with pytest.raises(ModelError) as raised:
        _model_at(server, retries=2, timeout_s=0.5).complete(MESSAGES, [])
    assert raised.value.reason == "timeout" and len(server.received) == 1
    assert time.monotonic() - started < 4.0  # the timeout, not the server's close after 5 s


def test_an_error_event_inside_the_stream_is_a_model_error(raw):
    body = (f"data: {_chunk('partial')}\n\n"
            'data: {"error":{"message":"The server had an error","type":"server_error"}}\n\n').encode()
    with pytest.raises(ModelError) as raised:
        _model_at(raw(_sse(body)), retries=2).complete(MESSAGES, [])
    assert raised.value.reason == "stream"


def test_an_event_that_is_not_json_is_a_model_error_not_a_crash(raw):
    with pytest.raises(ModelError) as raised:
        _model_at(raw(_sse(b"data: {not json\n\n"))).complete(MESSAGES, [])
    assert raised.value.reason == "stream"


@pytest.mark.parametrize(("response", "reason"), [
    (_sse(b"this is not gzip", extra=b"Content-Encoding: gzip\r\n"), "connection"),
    (b"HTTP/1.1 300 Multiple Choices\r\nContent-Length: 0\r\n\r\n", "request"),
])
def test_undecodable_bodies_and_statuses_outside_2xx_are_model_errors(raw, response, reason):
    with pytest.raises(ModelError) as raised:
        _model_at(raw(response)).complete(MESSAGES, [])
    assert raised.value.reason == reason


def test_a_retry_after_up_to_120_s_is_waited_for_as_the_sdk_does():
    asked = httpx2.Response(429, headers={"retry-after": "90"})
    assert model_http._backoff(0, asked) == 90.0 and model_http._should_retry(asked)
    assert not model_http._should_retry(httpx2.Response(429, headers={"retry-after": "121"}))
    assert 0.375 <= model_http._backoff(0, httpx2.Response(503)) <= 0.5  # 0.5 s less up to 25 %
    assert 6.0 <= model_http._backoff(5, None) <= 8.0  # doubling, at most 8 s


def _header(head: bytes, name: str) -> list[str]:
    return [line.split(":", 1)[1].strip() for line in head.decode().split("\r\n")[1:]
            if line.split(":", 1)[0].lower() == name]


def test_the_request_carries_the_sdk_clients_headers_and_the_http_clients(raw):
    """What ``http.build_request`` merged: the HTTP client's headers under the SDK client's, ``Host``,
    the body's ``Content-Length``, the attempt's ``x-stainless-retry-count``."""
    server = raw(_sse(f"data: {_chunk('hello')}\n\ndata: [DONE]\n\n".encode()))
    assert _model_at(server).complete(MESSAGES, []).content == "hello"
    (head, body), = server.received
    assert head.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
    assert _header(head, "host") == [server.url.removeprefix("http://")]
    assert _header(head, "content-length") == [str(len(body))] and json.loads(body)["stream"] is True
    assert _header(head, "authorization") == ["Bearer sk-test"]
    assert _header(head, "user-agent")[0].startswith("OpenAI/Python")  # the SDK client's, over httpx's
    assert _header(head, "accept") == ["application/json"] and _header(head, "accept-encoding")  # httpx's
    assert _header(head, "x-stainless-lang") == ["python"] and _header(head, "x-stainless-retry-count") == ["0"]


def test_cookies_the_server_set_are_sent_back_as_the_http_client_keeps_them(raw):
    """The client's cookie jar (e.g. a load balancer's affinity cookie) applies as it did through
    ``http.build_request``: stored from a response, sent with the next request."""
    server = raw(_sse(f"data: {_chunk('hello')}\n\ndata: [DONE]\n\n".encode(),
                      extra=b"Set-Cookie: __cf_bm=abc123; Path=/\r\nConnection: close\r\n"))  # it closes
    model = _model_at(server)
    assert [model.complete(MESSAGES, []).content for _ in range(2)] == ["hello", "hello"]
    (first, _), (second, _) = server.received
    assert _header(first, "cookie") == [] and _header(second, "cookie") == ["__cf_bm=abc123"]


def test_a_gzip_encoded_stream_is_decoded(raw):
    body = gzip.compress(f"data: {_chunk('hello')}\n\ndata: [DONE]\n\n".encode())
    server = raw(_sse(body, extra=b"Content-Encoding: gzip\r\n"))
    assert _model_at(server).complete(MESSAGES, []).content == "hello"


def test_the_http_clients_proxy_from_the_environment_is_used(raw, monkeypatch):
    """The request goes out through the HTTP client's transports (its proxies and mounts)."""
    for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    proxy = raw(_sse(f"data: {_chunk('hello')}\n\ndata: [DONE]\n\n".encode()))
    monkeypatch.setenv("HTTP_PROXY", proxy.url)
    monkeypatch.setenv("http_proxy", proxy.url)
    model = OpenAIChatModel(base_url="http://model.invalid/v1", api_key="sk-test", model="gpt-4o-mini",
                            max_retries=0)
    assert model.complete(MESSAGES, []).content == "hello"
    (head, _), = proxy.received
    assert head.startswith(b"POST http://model.invalid/v1/chat/completions HTTP/1.1\r\n")
    assert _header(head, "host") == ["model.invalid"]


def _certificates(folder) -> tuple[str, str, str]:
    """A CA and a certificate it signed for 127.0.0.1: ``(ca.pem, server.pem, server.key)``."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(1).not_valid_before(now - datetime.timedelta(days=1))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    server = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "server")]))
              .issuer_name(ca_name).public_key(key.public_key()).serial_number(2)
              .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=1))
              .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                             critical=False)
              .sign(ca_key, hashes.SHA256()))
    paths = (folder / "ca.pem", folder / "server.pem", folder / "server.key")
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(server.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return tuple(str(p) for p in paths)  # type: ignore[return-value]


def test_tls_is_verified_against_the_ca_file_httpx_would_load(raw, tmp_path, monkeypatch):
    """An HTTPS endpoint whose certificate no trusted CA signed is a connection error (nothing is
    sent); with that CA as ``SSL_CERT_FILE`` (as httpx reads it) the call is answered."""
    import agent.model

    ca, cert, key = _certificates(tmp_path)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server = raw(_sse(f"data: {_chunk('hello')}\n\ndata: [DONE]\n\n".encode()), tls=context)
    monkeypatch.setattr(agent.model, "_tls", None)  # the shared context is built again below
    with pytest.raises(ModelError) as raised:
        _model_at(server).complete(MESSAGES, [])
    assert raised.value.reason == "connection" and server.received == []
    monkeypatch.setenv("SSL_CERT_FILE", ca)
    monkeypatch.setattr(agent.model, "_tls", None)
    assert _model_at(server).complete(MESSAGES, []).content == "hello"
    assert len(server.received) == 1


def test_every_connection_pool_verifies_with_one_shared_tls_context():
    """The CA bundle is loaded once per process, not per pool (about 20 ms of CPU each, which the
    first turns after a start paid under the interpreter lock), and verification stays strict."""
    import ssl

    from agent.model import CLIENT_SHARDS

    models = [_model("https://model.invalid", 0) for _ in range(2)]
    contexts = set()
    for model in models:
        for _ in range(CLIENT_SHARDS):  # each new thread takes the next shard
            shard: list = []
            worker = threading.Thread(target=lambda m=model, out=shard: out.append(m._shard))
            worker.start()
            worker.join()
            client, _ = shard[0]
            contexts.add(client._client._transport._pool._ssl_context)
    assert len(contexts) == 1
    (context,) = contexts
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname


def test_an_error_whose_body_stalls_is_a_timeout_at_the_read_timeout(raw):
    """A 400 whose body stops coming: a ``timeout`` once the read timeout passed, the thread
    asleep meanwhile (not a hang until the server gives up, not a spin)."""
    server = raw(b'HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nContent-Length: 200\r\n\r\n'
                 b'{"error":', hold_s=5.0)
    started, cpu = time.monotonic(), time.thread_time()
    with pytest.raises(ModelError) as raised:
        _model_at(server, timeout_s=0.5).complete(MESSAGES, [])
    assert raised.value.reason == "timeout" and len(server.received) == 1
    assert time.monotonic() - started < 4.0 and time.thread_time() - cpu < 0.3


@pytest.mark.parametrize("status", [200, 400])
def test_a_content_encoding_httpx_does_not_know_passes_as_it_is(raw, status):
    """``Content-Encoding: utf-8`` (a misconfigured server): the body is read as it came, as httpx
    reads it; an error's message is not lost with it."""
    if status == 200:
        response = _sse(f"data: {_chunk('plain')}\n\ndata: [DONE]\n\n".encode(), extra=b"Content-Encoding: utf-8\r\n")
        assert _model_at(raw(response)).complete(MESSAGES, []).content == "plain"
        return
    body = (b'{"error":{"message":"This model\'s maximum context length is 8192 tokens",'
            b'"code":"context_length_exceeded"}}')
    server = raw(b"HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nContent-Encoding: utf-8\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    with pytest.raises(ModelError) as raised:
        _model_at(server).complete(MESSAGES, [])
    assert raised.value.status == 400 and raised.value.reason == "context_length"


def test_a_redirect_to_another_protocol_is_not_followed(raw):
    """A 307 to ``ftp://``: a connection error, and nothing connects there (httpx follows http and
    https only)."""
    target = socket.create_server(("127.0.0.1", 0))
    target.settimeout(0.5)
    port = target.getsockname()[1]
    server = raw(b"HTTP/1.1 307 Temporary Redirect\r\nLocation: ftp://127.0.0.1:%d/\r\n"
                 b"Content-Length: 0\r\n\r\n" % port)
    try:
        with pytest.raises(ModelError) as raised:
            _model_at(server).complete(MESSAGES, [])
        assert raised.value.reason == "connection"
        with pytest.raises(TimeoutError):
            target.accept()
    finally:
        target.close()


def test_an_api_key_with_a_line_break_is_never_sent(raw):
    """A key read with its newline, or one carrying a header of its own: refused before anything
    is sent (no header can be injected), as httpx refuses it."""
    server = raw(_sse(f"data: {_chunk('hello')}\n\ndata: [DONE]\n\n".encode()))
    for key in ("sk-test\n", "sk-test\r\nX-Injected: yes"):
        model = OpenAIChatModel(base_url=f"{server.url}/v1", api_key=key, model="gpt-4o-mini", max_retries=0)
        with pytest.raises(ModelError) as raised:
            model.complete(MESSAGES, [])
        assert raised.value.reason == "connection"
    assert server.received == []


def test_tls_is_verified_against_the_ca_directory_httpx_would_load(raw, tmp_path, monkeypatch):
    """``SSL_CERT_DIR`` alone (a hashed directory holding the CA): the call is answered."""
    import agent.model

    ca, cert, key = _certificates(tmp_path)
    folder = tmp_path / "cas"
    folder.mkdir()
    (folder / f"{_subject_hash(ca)}.0").write_bytes(Path(ca).read_bytes())
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server = raw(_sse(f"data: {_chunk('hello')}\n\ndata: [DONE]\n\n".encode()), tls=context)
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.setenv("SSL_CERT_DIR", str(folder))
    monkeypatch.setattr(agent.model, "_tls", None)
    assert _model_at(server).complete(MESSAGES, []).content == "hello"


def _subject_hash(ca: str) -> str:
    """OpenSSL's subject-name hash of the certificate in ``ca`` (``openssl x509 -hash``)."""
    import subprocess

    return subprocess.run(["openssl", "x509", "-hash", "-noout", "-in", ca], check=True, capture_output=True,
                          text=True).stdout.strip()


def test_a_redirect_with_an_empty_location_ends_within_the_read_timeout_without_spinning(raw):
    """A 302 whose ``Location`` is empty, its body sent, the connection kept open: libcurl does not
    follow it (the 302 is the error), httpx asks the same URL again (no answer: a timeout); either
    way the call ends within the read timeout and the thread sleeps meanwhile."""
    server = raw(b"HTTP/1.1 302 Found\r\nLocation: \r\nContent-Length: 30\r\n\r\n"
                 b"moved, but nowhere to go, sorr", hold_s=5.0)
    started, cpu = time.monotonic(), time.thread_time()
    with pytest.raises(ModelError):
        _model_at(server, timeout_s=1.0).complete(MESSAGES, [])
    assert time.monotonic() - started < 3.0 and time.thread_time() - cpu < 0.3


def test_an_error_body_that_does_not_decode_is_a_connection_error(raw):
    body = b'{"error":{"message":"not gzip at all"}}'
    server = raw(b"HTTP/1.1 400 Bad Request\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n%s"
                 % (len(body), body))
    with pytest.raises(ModelError) as raised:
        _model_at(server).complete(MESSAGES, [])
    assert raised.value.reason == "connection"


def test_a_caller_slower_than_the_read_timeout_loses_nothing_that_came(raw):
    """The first preview may take longer than the read timeout (a platform slow to answer): the
    rest of the answer, already sent, is read, as httpx reads it; the timeout counts waits for the
    socket only."""
    body = f"data: {_chunk('a')}\n\ndata: {_chunk('bc')}\n\ndata: [DONE]\n\n".encode()
    server = raw(_sse(body), hold_s=3.0)
    slow: list[str] = []

    def on_text(text: str) -> None:
        if not slow:
            slow.append(text)
            time.sleep(1.5)

    assert _model_at(server, timeout_s=1.0).complete(MESSAGES, [], on_text=on_text).content == "abc"


def test_no_proxy_entries_match_as_httpx_matches_them(raw, monkeypatch):
    """``NO_PROXY`` with a host and port, or a URL: that endpoint is called directly."""
    for name in ("ALL_PROXY", "all_proxy", "no_proxy", "HTTP_PROXY"):
        monkeypatch.delenv(name, raising=False)
    answer = _sse(f"data: {_chunk('hello')}\n\ndata: [DONE]\n\n".encode())
    proxy, server = raw(answer), raw(answer)
    monkeypatch.setenv("http_proxy", proxy.url)
    host_port = server.url.removeprefix("http://")
    for entry in (host_port, server.url, f"other.invalid, {host_port}"):
        monkeypatch.setenv("NO_PROXY", entry)
        assert _model_at(server).complete(MESSAGES, []).content == "hello"
    assert proxy.received == [] and len(server.received) == 3
