"""Per-client limits on the HTTP surface, against a running gateway: a connection that sends no
whole request is closed after ``http.idle_timeout_s`` (aiohttp's default, an hour, let idle
sockets use up the process's file descriptors and every endpoint went dark); one address may hold
``web.streams_per_address`` chat pages and upload four browsers' quota however many identities it
makes; behind a trusted proxy the client is the address the proxy forwarded; a request body
trickled too slowly is cut; wrong ``/link`` codes from many identities never close ``/link`` for the
others (its codes are too long to guess)."""

from __future__ import annotations

import asyncio
import socket
import time

import aiohttp
import pytest

from tests.conftest import gateway_config, start_gateway
from tests.web_client import WebClient


def base_of(gateway) -> str:
    return f"http://127.0.0.1:{gateway.http_port}"


def _closed_within(port: int, send: bytes, seconds: float) -> float | None:
    """Opens a connection, sends ``send``, and returns after how long the server closed it (or
    ``None`` if it was still open after ``seconds``)."""
    with socket.create_connection(("127.0.0.1", port), timeout=seconds) as sock:
        started = time.monotonic()
        if send:
            sock.sendall(send)
        try:
            while sock.recv(4096):
                pass
        except TimeoutError:
            return None
        return time.monotonic() - started


async def test_a_connection_without_a_whole_request_is_closed_after_the_idle_timeout(tmp_path, fake_openai,
                                                                                     running):
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai, http={"idle_timeout_s": 1}), running)
    port = gateway.http_port
    silent, trickle = await asyncio.gather(
        asyncio.to_thread(_closed_within, port, b"", 10),
        asyncio.to_thread(_closed_within, port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n", 10))  # headers never end
    assert silent is not None and 0.5 < silent < 4, silent
    assert trickle is not None and trickle < 4, trickle
    async with aiohttp.ClientSession() as http, http.get(f"{base_of(gateway)}/healthz") as response:
        assert response.status == 200  # a real request is served as before


def _trickle(port: int, head: bytes, body: bytes, gap_s: float, seconds: float) -> tuple[float | None, bytes]:
    """Sends ``head``, then ``body`` one byte every ``gap_s`` seconds; returns after how long the
    server closed the connection (``None``: still open after ``seconds`` or once the body was sent
    whole) and what it answered."""
    with socket.create_connection(("127.0.0.1", port), timeout=seconds) as sock:
        started = time.monotonic()
        sock.sendall(head)
        sock.setblocking(False)
        answer = b""
        for byte in body:
            if time.monotonic() - started > seconds:
                return None, answer
            try:
                sock.sendall(bytes([byte]))
            except (BlockingIOError, ConnectionError):
                return time.monotonic() - started, answer
            time.sleep(gap_s)
            try:
                chunk = sock.recv(4096)
            except BlockingIOError:
                continue
            except ConnectionError:
                return time.monotonic() - started, answer
            answer += chunk
            if not chunk:
                return time.monotonic() - started, answer
        sock.settimeout(seconds)
        try:
            while chunk := sock.recv(4096):
                answer += chunk
        except TimeoutError:
            return None, answer
        return None, answer


async def test_a_body_trickled_slower_than_the_minimum_rate_is_cut_and_a_steady_one_is_not(tmp_path, fake_openai,
                                                                                            running):
    """aiohttp's keep-alive timeout stops counting once a request began: a body sent one byte every
    half second held its connection (and a descriptor) for as long as the client liked."""
    fake_openai.responder = lambda request: "ok"
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai, http={
        "idle_timeout_s": 30, "body_timeout_s": 1.5, "body_min_rate": 40}), running)
    port = gateway.http_port
    client = WebClient(base_of(gateway))
    try:
        await client.open()
        cookie = "; ".join(f"{c.key}={c.value}" for c in client.http.cookie_jar)
    finally:
        await client.http.close()

    def request(message_id: str, text: str) -> tuple[bytes, bytes]:
        body = b'{"id": "%s", "text": "%s", "name": ""}' % (message_id.encode(), text.encode())
        head = (b"POST /web/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"X-Requested-With: gateway-web\r\nCookie: %s\r\nContent-Length: %d\r\n\r\n"
                % (cookie.encode(), len(body)))
        return head, body

    slow_head, slow_body = request("slow0001", "slow " + "x" * 600)  # 15 s of credit at 40 bytes/s, sent at 2 bytes/s
    steady_head, steady_body = request("steady01", "steady " + "y" * 250)  # ~3 s at 100 bytes/s: late, not slow
    slow, steady = await asyncio.gather(asyncio.to_thread(_trickle, port, slow_head, slow_body, 0.5, 20),
                                        asyncio.to_thread(_trickle, port, steady_head, steady_body, 0.01, 20))
    cut_after, answer = slow
    assert cut_after is not None and cut_after < 8, slow
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert steady[1].startswith(b"HTTP/1.1 200"), steady  # read whole and stored
    async with aiohttp.ClientSession() as http, http.get(f"{base_of(gateway)}/healthz") as response:
        assert response.status == 200


async def test_one_address_holds_a_bounded_number_of_chat_pages_and_uploads(tmp_path, fake_openai, running):
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai, web={
        "streams_per_address": 3, "uploads_per_hour": 1, "upload_mb_per_hour": 1.0}), running)
    clients = [WebClient(base_of(gateway)) for _ in range(6)]
    try:
        for client in clients:
            await client.open()  # a fresh identity each: identities are free
        statuses = []
        streams = []
        for client in clients[:4]:
            response = await client.http.get(f"{client.base}/web/events?after=0")
            statuses.append(response.status)
            streams.append(response)
        assert statuses == [200, 200, 200, 429], statuses
        assert "from this address" in (await streams[3].json())["error"]
        streams[0].close()
        deadline = time.monotonic() + 15  # the server notices the closed page at its next poll (1 s)
        while True:
            again = await clients[4].http.get(f"{clients[4].base}/web/events?after=0")
            if again.status == 200 or time.monotonic() > deadline:
                break
            again.close()
            await asyncio.sleep(0.3)
        assert again.status == 200
        again.close()
        for stream in streams[1:3]:
            stream.close()

        uploads = [(await client.upload(b"file %d" % n, "text/plain", "a.txt"))[0] for n, client in enumerate(clients)]
        assert uploads == [200, 200, 200, 200, 429, 429], uploads  # four browsers' worth from one address
    finally:
        for client in clients:
            await client.close()


async def test_behind_a_trusted_proxy_each_forwarded_client_has_its_own_limits(tmp_path, fake_openai, running):
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai, http={"trusted_proxies": ["127.0.0.1/32"]},
                                                 web={"streams_per_address": 1}), running)
    client = WebClient(base_of(gateway))
    try:
        await client.open()
        first = await client.http.get(f"{client.base}/web/events?after=0",
                                      headers={"X-Forwarded-For": "198.51.100.7, 127.0.0.1"})
        second = await client.http.get(f"{client.base}/web/events?after=0",
                                       headers={"X-Forwarded-For": "203.0.113.9"})
        same = await client.http.get(f"{client.base}/web/events?after=0",
                                     headers={"X-Forwarded-For": "198.51.100.7"})
        assert (first.status, second.status, same.status) == (200, 200, 429)
        for response in (first, second, same):
            response.close()
    finally:
        await client.close()


def test_client_addresses_take_the_forwarded_hop_only_from_a_trusted_proxy():
    from unittest import mock

    from aiohttp.test_utils import make_mocked_request

    from gateway.core.clients import client_address, parse_networks

    proxies = parse_networks(["10.0.0.0/8"])

    def request(remote: str, forwarded: str | None = None):
        headers = {"X-Forwarded-For": forwarded} if forwarded else {}
        transport = mock.Mock()  # the connection: request.remote is its peer's address
        transport.get_extra_info.side_effect = lambda name, default=None: (remote, 1234) if name == "peername" \
            else default
        return make_mocked_request("GET", "/", headers=headers, transport=transport)

    assert client_address(request("10.1.1.1", "203.0.113.5, 10.2.2.2"), proxies) == "203.0.113.5"
    assert client_address(request("198.51.100.1", "203.0.113.5"), proxies) == "198.51.100.1"  # not a proxy: ignored
    assert client_address(request("10.1.1.1", "6.6.6.6, 203.0.113.5"), proxies) == "203.0.113.5"  # right-most
    assert client_address(request("2001:db8:1:2:aa::1"), proxies) == "2001:db8:1:2::/64"
    with pytest.raises(ValueError):
        parse_networks(["not-a-network"])


def test_link_codes_are_too_long_to_guess_and_wrong_guesses_of_others_never_close_link(tmp_path):
    """A web identity is free: one client made 1,000 guesses in 2.7 s with fresh cookies. Six-character
    codes needed a cap on all users' wrong guesses together, which anyone could use up to close
    ``/link`` for everyone; ten characters (50 bits) need none. Each user keeps their own limit."""
    import re

    from gateway.sessions.directory import CODE_ALPHABET, LINK_GUESSES, CodeError, Directory, WrongCode
    from gateway.store.db import create_db_engine, upgrade

    engine = create_db_engine(f"sqlite:///{tmp_path / 'link.db'}")
    upgrade(engine)
    directory = Directory(engine)
    code = directory.new_code("owner", "link")
    alphabet = re.escape(CODE_ALPHABET)
    assert re.fullmatch(f"[{alphabet}]{{5}}-[{alphabet}]{{5}}", code), code
    for n in range(300):  # wrong guesses from 300 fresh identities
        with pytest.raises(WrongCode):
            directory.link(code[:-1] + ("A" if code[-1] != "A" else "B"), f"guesser-{n}")
    for _ in range(LINK_GUESSES):
        with pytest.raises(WrongCode):
            directory.link("WRONG-CODE1", "guesser-0-again")
    with pytest.raises(CodeError, match="Too many wrong codes; try again in 15 minutes"):
        directory.link(code, "guesser-0-again")  # one identity's own limit still holds
    # the owner's other account links with the right code, typed loosely
    assert directory.link(" " + code.lower().replace("-", " ") + " ", "other-account") == "owner"
    engine.dispose()
