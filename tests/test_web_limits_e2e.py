"""What a stranger who can load the chat page can hold of the gateway, end to end on the real
server with raw sockets (found by a review; each test failed on the code before):

- uploads sent together count against the hour's quota together, and a browser, an address and
  the whole process have few uploads under way at once (each is held in memory until whole);
- a body may take ``http.body_max_s`` at most, however steadily it trickles;
- a download nobody reads holds neither the file in the connection's buffer nor the connection
  (``SEND_STALL_S``);
- odd input gets a 4xx, never a 500 or a logged traceback; model-invented tool names do not each
  become a metrics series.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time

import aiohttp

import adapters.web.adapter as web_adapter
from tests.conftest import gateway_config, start_gateway
from tests.fakes import openai as oa
from tests.helpers import wait_until
from tests.web_client import WebClient


def base_of(gateway) -> str:
    return f"http://127.0.0.1:{gateway.http_port}"


def cookie_header(client: WebClient) -> str:
    return "; ".join(f"{c.key}={c.value}" for c in client.http.cookie_jar)


async def cookie_of(gateway) -> str:
    client = WebClient(base_of(gateway))
    try:
        await client.open()
        return cookie_header(client)
    finally:
        await client.close()


def upload_head(cookie: str, size: int) -> bytes:
    return (b"POST /web/files HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nX-File-Name: a.txt\r\n"
            b"X-Requested-With: gateway-web\r\nCookie: %s\r\nContent-Length: %d\r\n\r\n" % (cookie.encode(), size))


def status_of(sock: socket.socket) -> bytes:
    sock.settimeout(10)
    return sock.recv(64).split(b"\r\n")[0]


async def test_uploads_sent_together_count_together(tmp_path, fake_openai, running):
    """One upload an hour: of five sent at once by one browser, one is stored (all five were)."""
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai, web={
        "uploads_per_hour": 1, "upload_mb_per_hour": 1.0}), running)
    cookie = await cookie_of(gateway)
    size = 400_000

    def five_at_once() -> list[bytes]:
        socks = [socket.create_connection(("127.0.0.1", gateway.http_port)) for _ in range(5)]
        for n, sock in enumerate(socks):
            sock.sendall(upload_head(cookie, size) + bytes([65 + n]) * (size - 1))  # all but the last byte
        time.sleep(0.5)
        for sock in socks:
            sock.sendall(b"z")
        answers = [status_of(sock) for sock in socks]
        for sock in socks:
            sock.close()
        return answers

    answers = await asyncio.to_thread(five_at_once)
    assert answers.count(b"HTTP/1.1 200 OK") == 1, answers
    assert answers.count(b"HTTP/1.1 429 Too Many Requests") == 4, answers


async def test_one_browser_has_two_uploads_under_way_at_most(tmp_path, fake_openai, running):
    """Ten 8 MB uploads held open by one browser: two are being received, eight are refused at once
    (ten were held in memory, 80 MB, for as long as their bodies trickled)."""
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai), running)
    cookie = await cookie_of(gateway)
    size = 8_000_000

    def hold() -> tuple[list[socket.socket], list[bytes]]:
        socks = [socket.create_connection(("127.0.0.1", gateway.http_port)) for _ in range(10)]
        for sock in socks:
            sock.sendall(upload_head(cookie, size) + b"q" * 100_000)
        refused = []
        for sock in socks:
            sock.settimeout(1)
            try:
                refused.append(sock.recv(64).split(b"\r\n")[0])
            except TimeoutError:
                pass  # being received
        return socks, refused

    socks, refused = await asyncio.to_thread(hold)
    try:
        assert refused == [b"HTTP/1.1 429 Too Many Requests"] * 8, refused
    finally:
        for sock in socks:
            sock.close()


async def test_a_body_may_take_body_max_s_however_steady(tmp_path, fake_openai, running):
    """body_timeout_s 1 and 100 bytes/s: 10 KB received would buy 101 s (20 MB: 11 hours);
    body_max_s 3 closes it after 3 s."""
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai, http={
        "body_timeout_s": 1, "body_min_rate": 100, "body_max_s": 3, "idle_timeout_s": 2}), running)
    cookie = await cookie_of(gateway)

    def held_for() -> tuple[float | None, bytes]:
        with socket.create_connection(("127.0.0.1", gateway.http_port)) as sock:
            sock.sendall(upload_head(cookie, 20_000) + b"x" * 10_000)
            started, answer = time.monotonic(), b""
            sock.settimeout(8)
            try:
                while chunk := sock.recv(4096):
                    answer += chunk
            except TimeoutError:
                return None, answer
            return time.monotonic() - started, answer

    held, answer = await asyncio.to_thread(held_for)
    assert held is not None and 2.5 < held < 6, held
    assert answer.startswith(b"HTTP/1.1 408"), answer[:40]


async def test_a_download_nobody_reads_is_cut(tmp_path, fake_openai, running, monkeypatch):
    """Four GETs of a 6 MB upload that never read: no more than a chunk each waits in its
    connection's buffer (each held the whole file), and each connection is closed once its reader
    took nothing for SEND_STALL_S (they stayed open past every timeout)."""
    monkeypatch.setattr(web_adapter, "SEND_STALL_S", 1.5)
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai, http={"idle_timeout_s": 1}), running)
    client = WebClient(base_of(gateway))
    try:
        await client.open()
        status, answer = await client.upload(bytes(range(256)) * (6 * 4096), "application/pdf", "big.pdf")
        assert status == 200
        sha, ticket = answer["file"]["sha256"], answer["file"]["ticket"]
        cookie = cookie_header(client)
    finally:
        await client.close()
    socks = []
    for _ in range(4):
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", gateway.http_port))
        sock.sendall(b"GET /web/files/%s?t=%s HTTP/1.1\r\nHost: x\r\nCookie: %s\r\n\r\n"
                     % (sha.encode(), ticket.encode(), cookie.encode()))
        socks.append(sock)
    try:
        await asyncio.sleep(0.7)
        held = sum(h.transport.get_write_buffer_size() for h in gateway._runner.server.connections
                   if h.transport is not None)
        assert held < 2_000_000, f"{held / 1e6:.1f} MB held for readers that read nothing"
        await wait_until(lambda: not gateway._runner.server.connections, timeout=6, what="the stalled downloads cut")
    finally:
        for sock in socks:
            sock.close()


async def test_odd_input_gets_a_4xx_and_no_traceback(tmp_path, fake_openai, running, caplog):
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai), running)
    client = WebClient(base_of(gateway))
    try:
        await client.open()
        await client.say("hello")  # the user has a conversation to read
        caplog.set_level(logging.ERROR)
        # punycode is a codec but no text encoding: a plain UnicodeError (was 500)
        async with client.http.post(f"{client.base}/web/messages", data=b'{"id": "abcdefgh", "text": "hi"}',
                                    headers={"X-Requested-With": "gateway-web",
                                             "Content-Type": "application/json; charset=punycode"}) as response:
            assert response.status == 400, response.status
        # past SQLite's integers: was a 200 cut short and an ERROR traceback
        async with client.http.get(f"{client.base}/web/events?after={10 ** 20}") as response:
            status = response.status
            try:
                await asyncio.wait_for(response.read(), 5)
            except aiohttp.ClientPayloadError:
                pass
        errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert status == 400 and not errors, (status, [r.getMessage() for r in errors])
    finally:
        await client.close()


async def test_tool_names_the_model_makes_up_are_one_metrics_series(tmp_path, fake_openai, running):
    fake_openai.reset()
    names = [f"made_up_{n}_{'x' * 40}" for n in range(30)]
    fake_openai.script(oa.tool_calls(*[oa.call(name, {}) for name in names]), oa.text("done"))
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai), running)
    client = WebClient(base_of(gateway))
    try:
        await client.open()
        await client.say("call my tools")
        await wait_until(lambda: gateway.delivery.sent == 1, timeout=20, what="reply")
        async with client.http.get(f"{client.base}/metrics") as response:
            metrics = await response.text()
        series = [line for line in metrics.splitlines() if line.startswith("gateway_tool_calls_total{")]
        assert len(series) == 1 and 'tool="unknown"' in series[0] and series[0].endswith(" 30.0"), series
    finally:
        await client.close()
