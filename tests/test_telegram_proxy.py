"""Telegram calls go through the proxy the environment names (``HTTP(S)_PROXY``, ``NO_PROXY``):
python-telegram-bot's real ``Bot`` on the adapter's aiohttp client, a forwarding HTTP proxy and the
fake Bot API on loopback."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from aiohttp import web
from telegram import Bot
from telegram.error import NetworkError

from adapters.telegram.request import AiohttpRequest
from tests.fakes.telegram import FakeTelegram


async def _proxy(seen: list[str]) -> tuple[web.AppRunner, str]:
    """A plain HTTP forward proxy: takes absolute-form requests, records their URL, forwards them."""

    async def forward(request: web.Request) -> web.Response:
        seen.append(str(request.url))
        async with aiohttp.ClientSession() as client, client.request(
                request.method, str(request.url), data=await request.read(),
                headers={k: v for k, v in request.headers.items() if k.lower() not in ("host", "proxy-authorization")},
        ) as upstream:
            return web.Response(status=upstream.status, body=await upstream.read(),
                                content_type=upstream.content_type)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", forward)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://user:secret@127.0.0.1:{port}"


async def _get_me(telegram: FakeTelegram) -> str:
    request = AiohttpRequest()
    bot = Bot(telegram.token, base_url=f"{telegram.url}/bot", request=request, get_updates_request=AiohttpRequest())
    async with bot:
        me = await bot.get_me()
    return me.username


@pytest.mark.asyncio
async def test_bot_api_calls_go_through_the_environment_proxy(monkeypatch):
    seen: list[str] = []
    runner, proxy = await _proxy(seen)
    try:
        with FakeTelegram() as telegram:
            monkeypatch.delenv("NO_PROXY", raising=False)
            monkeypatch.delenv("no_proxy", raising=False)
            monkeypatch.setenv("HTTP_PROXY", proxy)
            assert await _get_me(telegram) == telegram.username
            assert seen and all(url.startswith(f"{telegram.url}/bot") for url in seen)
            assert any(url.endswith("/getMe") for url in seen)

            seen.clear()  # NO_PROXY names the host: straight to the Bot API
            monkeypatch.setenv("NO_PROXY", "127.0.0.1")
            assert await _get_me(telegram) == telegram.username
            assert seen == []
    finally:
        await runner.cleanup()


@pytest.mark.asyncio
async def test_proxy_choice_per_scheme_and_host(monkeypatch):
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "all_proxy",
                 "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    monkeypatch.setenv("NO_PROXY", "internal.example")
    request = AiohttpRequest()
    await request.initialize()  # reads the environment
    assert request.proxy("https://api.telegram.org/bot1:x/getMe") == "http://proxy.example:3128"
    assert request.proxy("https://internal.example/bot1:x/getMe") is None
    assert request.proxy("http://api.telegram.org/bot1:x/getMe") is None  # no HTTP_PROXY, no ALL_PROXY
    monkeypatch.setenv("ALL_PROXY", "socks5://ignored.example:1080")
    assert request.proxy("https://api.telegram.org/x") == "http://proxy.example:3128"  # read once, kept
    await request.shutdown()


async def _refusing_proxy() -> tuple[asyncio.Server, str]:
    """An HTTPS proxy that answers every CONNECT ``503`` (squid when the upstream is unreachable)."""

    async def refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(refuse, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://proxyuser:proxypass@127.0.0.1:{port}"


@pytest.mark.asyncio
async def test_a_refusing_proxy_is_named_without_its_password_or_the_token(monkeypatch):
    """aiohttp's ``ClientHttpProxyError`` text carries the proxy URL with its password; that text
    became the delivery's stored error, a report's failure notice and the admin page (found by a
    review). The error names the failure, never the password or the bot token."""
    server, proxy = await _refusing_proxy()
    token = "123456789:AAHfake-token-for-the-proxy-test_0123456"
    try:
        for name in ("NO_PROXY", "no_proxy", "HTTP_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("HTTPS_PROXY", proxy)
        bot = Bot(token, request=AiohttpRequest(), get_updates_request=AiohttpRequest())
        with pytest.raises(NetworkError) as raised:
            async with bot:
                await bot.get_me()
        said = str(raised.value)
        assert "503" in said and "ClientHttpProxyError" in said, said
        assert "proxypass" not in said and "proxyuser" not in said and token.split(":")[1] not in said, said
    finally:
        server.close()
        await server.wait_closed()
