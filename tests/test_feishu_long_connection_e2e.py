"""The Feishu long connection end to end (lark-oapi's ws client against the fake's
``/callback/ws/endpoint`` and ``/ws``): each connect attempt is bounded, failed attempts are retried
with growing delays, a dropped connection is re-opened, and neither start-up nor shutdown waits for
Feishu."""

from __future__ import annotations

import itertools
import threading

from aiohttp import web

from adapters.feishu.adapter import FeishuAdapter
from adapters.feishu.long_connection import LongConnection
from gateway.app.gateway import Gateway
from tests.conftest import FEISHU_APP, gateway_config
from tests.fakes import openai as oa
from tests.fakes.feishu import post_text
from tests.helpers import wait_until

TIMEOUT_S, INITIAL_S, MAX_S = 0.5, 0.2, 2.0


async def start(tmp_path, fake_openai, fake_feishu, running) -> tuple[Gateway, FeishuAdapter]:
    adapter = FeishuAdapter(app_id=FEISHU_APP["app_id"], app_secret=FEISHU_APP["app_secret"], mode="websocket",
                            domain=fake_feishu.url, ws_connect_timeout_s=TIMEOUT_S, ws_backoff_initial_s=INITIAL_S,
                            ws_backoff_max_s=MAX_S)
    gateway = Gateway(gateway_config(tmp_path, fake_openai), [adapter])
    await gateway.start()
    running.append(gateway)
    return gateway, adapter


def endpoint_calls(fake) -> list:
    return fake.calls("ws_endpoint")


def ws_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "feishu-ws" and t.is_alive()]


async def test_failed_connects_back_off_then_a_drop_reconnects(tmp_path, fake_feishu, fake_openai, running, caplog):
    fake_openai.reset()
    fake_openai.responder = lambda req: oa.text("over the long connection")
    fake_feishu.reset()
    fake_feishu.ws_endpoint_hangs = 1  # the first attempt gets no answer at all: it must time out
    fake_feishu.fail_next("ws_endpoint", 200, 1, "system busy")
    fake_feishu.fail_next("ws_endpoint", 500, 1000040343, "internal error")
    fake_feishu.fail_next("ws_endpoint", 503, 1, "system busy")
    gateway, _ = await start(tmp_path, fake_openai, fake_feishu, running)

    await fake_feishu.wait_ws_connected(timeout=20)
    calls = endpoint_calls(fake_feishu)
    assert len(calls) == 5  # four failed attempts, then the one that connected
    gaps = [b.time - a.time for a, b in itertools.pairwise(calls)]
    assert gaps[0] >= TIMEOUT_S + INITIAL_S  # the hung attempt was cut at the timeout, then waited
    for n, gap in enumerate(gaps):  # growing delays: initial * 2**n (plus jitter), capped
        assert gap >= min(INITIAL_S * 2 ** n, MAX_S), gaps
    failures = [r.getMessage() for r in caplog.records if "long connection attempt" in r.getMessage()]
    assert len(failures) == 4 and "timed out" in failures[0] and "code 1000040343" in failures[2]

    chat = "oc_backoff0000000000000000000000001"
    assert (await fake_feishu.ws_push(fake_feishu.text_event("hello", chat_id=chat)))["code"] == 200
    call = await fake_feishu.wait_for_call("create", lambda c: c.body["receive_id"] == chat)
    assert post_text(call.content) == "over the long connection"

    # Feishu closes the connection (a host restarting): a new one is opened at once, events flow again.
    fake_feishu.drop_ws()
    await wait_until(lambda: len(endpoint_calls(fake_feishu)) == 6 and fake_feishu._ws, timeout=10,
                     what="reconnect after the drop")
    again = "oc_backoff0000000000000000000000002"
    assert (await fake_feishu.ws_push(fake_feishu.text_event("still there?", chat_id=again)))["code"] == 200
    await fake_feishu.wait_for_call("create", lambda c: c.body["receive_id"] == again)
    assert gateway.store.count_inbox("done") + gateway.store.count_inbox("pending") == 2


async def test_an_unreachable_feishu_blocks_neither_start_up_nor_shutdown(tmp_path, fake_feishu, fake_openai,
                                                                         running):
    fake_feishu.reset()
    fake_feishu.ws_endpoint_hangs = 10**6  # Feishu never answers
    try:
        gateway, adapter = await start(tmp_path, fake_openai, fake_feishu, running)
        assert ws_threads() and not adapter.long_connection.connected.is_set()  # started, not connected
        await wait_until(lambda: len(endpoint_calls(fake_feishu)) >= 2, what="a timed-out attempt retried")
        await gateway.stop()
        running.remove(gateway)
        assert ws_threads() == []  # the pending attempt was abandoned and the thread ended
    finally:
        fake_feishu.ws_endpoint_hangs = 0


async def test_the_app_secret_follows_no_redirect():
    """The endpoint bootstrap POSTs the app secret; a 307 from ``feishu.domain`` made aiohttp send
    the same body to whatever host it named (found by a review). A redirect is a failed attempt."""
    received: list[bytes] = []
    redirected: list[str] = []

    async def elsewhere(request: web.Request) -> web.Response:
        received.append(await request.read())
        return web.json_response({"code": 0, "data": {"URL": "ws://127.0.0.2:1/ws"}})

    async def moved(request: web.Request) -> web.Response:
        redirected.append(request.path)
        raise web.HTTPTemporaryRedirect(f"http://127.0.0.2:{other_port}{request.path}")

    other, other_port = await _serve(elsewhere, "127.0.0.2")
    origin, origin_port = await _serve(moved, "127.0.0.1")
    connection = LongConnection(app_id="cli_x", app_secret="APP-SECRET-123456", domain=f"http://127.0.0.1:{origin_port}",
                                on_payload=lambda payload: None, connect_timeout_s=1.0, backoff_initial_s=0.1,
                                backoff_max_s=0.2)
    try:
        connection.start()
        await wait_until(lambda: len(redirected) >= 2, timeout=10, what="two attempts")
        assert received == [] and not connection.connected.is_set()
    finally:
        await connection.stop()
        await other.cleanup()
        await origin.cleanup()


async def _serve(handler, host: str) -> tuple[web.AppRunner, int]:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, 0)
    await site.start()
    return runner, site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
