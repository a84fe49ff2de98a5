"""The HTTP server (aiohttp): webhooks of the adapters, health, readiness and metrics."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

log = logging.getLogger("gateway.http")

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
"""Requests that never carry an event (pages, event streams, health): served even while not ready."""

NOT_READY_RETRY_AFTER_S = 5
"""``Retry-After`` of a 503 sent while the gateway starts or stops."""


def build_app(routes: list[web.RouteDef], ready: Callable[[], Awaitable[bool]],
              metrics: Callable[[], Awaitable[bytes]], metrics_type: str = "text/plain", *,
              accepting: Callable[[], bool] = lambda: True, instance: str | None = None,
              body_timeout_s: float = 20.0, body_min_rate: float = 500.0,
              body_max_s: float = 600.0) -> web.Application:
    """``/healthz`` (liveness: the process serves HTTP), ``/readyz`` (200 while ``ready()``: the
    database answers and every adapter has started; 503 otherwise), ``/metrics`` (Prometheus
    text) plus the adapters' webhook ``routes``. Request bodies are capped at 1 MiB. ``/readyz``
    names the ``instance`` id that answered (with ``gateway run --workers N`` every worker serves
    the port: a health check sees the worker that accepted its connection).

    Readiness gate: while ``accepting()`` is false (start-up until every adapter has started,
    and from the beginning of a stop), every request that may carry an event (any method but
    GET/HEAD/OPTIONS: Telegram, Slack and Feishu webhooks, web chat POSTs, admin forms) gets
    ``503 {"error": ...}`` with ``Retry-After`` before any handler runs, so nothing is
    acknowledged that the gateway cannot process yet. Telegram, Slack (up to 3 retries) and
    Feishu (15 s, 5 min, 1 h, 6 h) redeliver on a non-2xx answer (PLATFORMS.md).

    Body deadline (``body_deadline``): a request whose body has not arrived whole
    ``body_timeout_s`` seconds after its handler started, plus one second per ``body_min_rate``
    bytes received, at most ``body_max_s`` (Apache ``mod_reqtimeout``'s ``body=20-600,MinRate=500``),
    is answered ``408`` and its connection closed: a body trickled byte by byte would otherwise hold
    its connection (and a file descriptor) for ever, since aiohttp's keep-alive timeout stops
    counting once a request began.
    A body that came with its headers (every webhook) costs no watch.
    """

    @web.middleware
    async def body_deadline(request: web.Request,
                            handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        if request.method in SAFE_METHODS or not request.body_exists or request.content.is_eof():
            return await handler(request)
        task = asyncio.current_task()
        assert task is not None
        watch = asyncio.create_task(_watch_body(request, task, body_timeout_s, body_min_rate, body_max_s))
        try:
            return await handler(request)
        except asyncio.CancelledError:
            if not (watch.done() and not watch.cancelled() and watch.result()):
                raise
            task.uncancel()
            response = web.json_response({"error": "the request body arrived too slowly"}, status=408)
            response.force_close()
            with contextlib.suppress(ConnectionError):
                await response.prepare(request)
                await response.write_eof()
            # closed once the answer is flushed: aiohttp would otherwise keep reading the rest of the
            # body for its lingering time (10 s) before closing
            request.protocol.force_close()
            return response
        finally:
            watch.cancel()

    @web.middleware
    async def readiness_gate(request: web.Request,
                             handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        if request.method not in SAFE_METHODS and not accepting():
            return web.json_response({"error": "the gateway is starting or stopping; retry later"}, status=503,
                                     headers={"Retry-After": str(NOT_READY_RETRY_AFTER_S)})
        return await handler(request)

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def readyz(_: web.Request) -> web.Response:
        ok = await ready()
        body = {"status": "ready" if ok else "not ready", **({"instance": instance} if instance else {})}
        return web.json_response(body, status=200 if ok else 503)

    async def metrics_view(_: web.Request) -> web.Response:
        return web.Response(body=await metrics(), headers={"Content-Type": metrics_type})

    app = web.Application(client_max_size=1024 * 1024, middlewares=[readiness_gate, body_deadline])
    app.add_routes([web.get("/healthz", healthz), web.get("/readyz", readyz), web.get("/metrics", metrics_view),
                    *routes])
    return app


async def _watch_body(request: web.Request, handler: asyncio.Task[object], timeout_s: float, min_rate: float,
                      max_s: float = 600.0) -> bool:
    """Cancels ``handler`` (and returns ``True``) once ``request``'s body is late: not whole
    ``timeout_s`` seconds after the watch began plus one second per ``min_rate`` bytes received,
    or ``max_s`` seconds after it began; returns ``False`` as soon as the body is whole."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    content = request.content
    while not content.is_eof():
        late = started + min(timeout_s + content.total_bytes / min_rate, max_s) - loop.time()
        if late <= 0:
            log.info("%s %s: the body arrived slower than %g bytes/s (%d bytes in %.0f s); connection closed",
                     request.method, request.path, min_rate, content.total_bytes, loop.time() - started)
            handler.cancel()
            return True
        await asyncio.sleep(max(late, 0.05))
    return False
