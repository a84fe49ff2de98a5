"""What only the libcurl call has (``agent.model_curl``): its transfers pooled, so the descriptors
held follow the calls in flight and not the threads that ever called; libcurl's own trust store
left out. Against the fake OpenAI API on loopback."""

from __future__ import annotations

import os
import threading
import time

import pytest

from agent import model_curl
from agent.model import CLIENT_SHARDS, OpenAIChatModel
from tests.fakes import openai as oa

MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.fixture
def fake(fake_openai):
    fake_openai.reset()
    yield fake_openai
    fake_openai.reset()


def _model(url: str) -> OpenAIChatModel:
    return OpenAIChatModel(base_url=f"{url}/v1", api_key="sk-test", model="gpt-4o-mini", max_retries=0,
                           http_client="curl")


def _descriptors(at_most: int | None = None) -> int:
    """Descriptors open in this process; with ``at_most``, once that few or after 3 s (the fake's
    ends of connections the client closed are closed a moment later)."""
    deadline = time.monotonic() + 3.0
    while True:
        count = len(os.listdir("/proc/self/fd"))
        if at_most is None or count <= at_most or time.monotonic() > deadline:
            return count
        time.sleep(0.05)


def _calls_at_once(model: OpenAIChatModel, count: int) -> list[str]:
    """``count`` calls, each on a thread of its own that ends with it."""
    replies: list[str] = []
    threads = [threading.Thread(target=lambda: replies.append(model.complete(MESSAGES, []).content))
               for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return replies


def test_descriptors_follow_the_calls_in_flight_not_the_threads_that_called(fake, monkeypatch):
    """30 calls at once on 30 threads that then end, twice: afterwards the endpoint holds its idle
    transfers' descriptors, not 30 threads' worth; the second wave reuses them."""
    monkeypatch.setattr(model_curl, "IDLE_TRANSFERS_KEPT", 4)
    model = _model(fake.url)
    for _ in range(60):
        fake.script(oa.text("hello there", pieces=2, piece_delay_s=0.2))
    before = _descriptors()
    assert _calls_at_once(model, 30) == ["hello there"] * 30
    # Four each: the multi handle's two, the connection, and its other end (the fake is in this process).
    bound = before + 4 * 4 + 3  # 30 transfers kept would be 120
    assert _descriptors(at_most=bound) <= bound
    assert _calls_at_once(model, 30) == ["hello there"] * 30
    assert _descriptors(at_most=bound) <= bound
    (endpoint,) = {shard[1] for shard in model._shards if shard is not None}
    assert len(endpoint._idle) == 4


def test_every_shard_calls_through_one_endpoint_and_its_pool(fake):
    model = _model(fake.url)
    for _ in range(CLIENT_SHARDS):
        fake.script("hi")
    assert _calls_at_once(model, CLIENT_SHARDS) == ["hi"] * CLIENT_SHARDS
    assert sum(shard is not None for shard in model._shards) == CLIENT_SHARDS
    assert len({id(shard[1]) for shard in model._shards if shard is not None}) == 1


def test_with_ssl_cert_dir_alone_libcurl_trusts_that_directory_and_no_bundle_of_its_own(monkeypatch, tmp_path):
    """httpx trusts ``SSL_CERT_DIR`` alone when it is set; libcurl would add the CA file it was
    built with. Read from libcurl's own verbose log of the handshake's set-up."""
    import pycurl

    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.setenv("SSL_CERT_DIR", str(tmp_path))
    endpoint = _model("https://127.0.0.1:9")._shard[1]
    transfer = endpoint._open()
    log: list[bytes] = []
    transfer.easy.setopt(pycurl.VERBOSE, 1)
    transfer.easy.setopt(pycurl.DEBUGFUNCTION, lambda kind, message: log.append(message))
    transfer.easy.setopt(pycurl.URL, "https://127.0.0.1:9/")  # refused: the set-up is logged before
    transfer.easy.setopt(pycurl.CONNECTTIMEOUT_MS, 500)
    with pytest.raises(pycurl.error):
        transfer.easy.perform()
    transfer.close()
    text = b"".join(log).decode()
    assert "CAfile" not in text
