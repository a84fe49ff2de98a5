"""The floor for the overhead benchmark: a bare aiohttp relay doing the gateway's HTTP in and out
with no database, no bus and no agent loop.

Webhook in (answered 200 at once) -> one streamed chat completion -> one ``sendMessage``.

    python -m bench.relay PORT MODEL_BASE_URL TELEGRAM_BASE_URL TOKEN
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import aiohttp
from aiohttp import web


def build_relay(model_url: str, telegram_url: str, token: str) -> web.Application:
    """The relay application (``POST /telegram/webhook``)."""
    tasks: set[asyncio.Task[None]] = set()
    state: dict[str, aiohttp.ClientSession] = {}

    async def relay(update: dict[str, Any]) -> None:
        http = state["http"]
        message = update["message"]
        body = {"model": "gpt-4o-mini", "stream": True, "stream_options": {"include_usage": True},
                "messages": [{"role": "system", "content": "relay"}, {"role": "user", "content": message["text"]}]}
        async with http.post(f"{model_url}/chat/completions", json=body,
                             headers={"Authorization": "Bearer sk-test"}) as resp:
            await resp.read()
        async with http.post(f"{telegram_url}/bot{token}/sendMessage",
                             json={"chat_id": message["chat"]["id"], "text": f"re: {message['text']}"}) as resp:
            await resp.read()

    async def webhook(request: web.Request) -> web.Response:
        task = asyncio.create_task(relay(await request.json()))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        return web.json_response({"ok": True})

    async def on_startup(_: web.Application) -> None:
        # no connection cap: the floor of a burst is one model latency, not waves of 100
        state["http"] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))

    async def on_cleanup(_: web.Application) -> None:
        await state["http"].close()

    app = web.Application()
    app.add_routes([web.post("/telegram/webhook", webhook), web.get("/healthz", lambda _: web.json_response({}))])
    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    return app


def main() -> None:
    port, model_url, telegram_url, token = sys.argv[1:5]
    web.run_app(build_relay(model_url, telegram_url, token), host="127.0.0.1", port=int(port), print=None)


if __name__ == "__main__":
    main()
