"""The HTTP server (aiohttp): webhooks of the adapters, health, readiness and metrics."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
"""Requests that never carry an event (pages, event streams, health): served even while not ready."""

NOT_READY_RETRY_AFTER_S = 5
"""``Retry-After`` of a 503 sent while the gateway starts or stops."""


def build_app(routes: list[web.RouteDef], ready: Callable[[], Awaitable[bool]],
              metrics: Callable[[], Awaitable[bytes]], metrics_type: str = "text/plain", *,
              accepting: Callable[[], bool] = lambda: True, instance: str | None = None) -> web.Application:
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
    """

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

    app = web.Application(client_max_size=1024 * 1024, middlewares=[readiness_gate])
    app.add_routes([web.get("/healthz", healthz), web.get("/readyz", readyz), web.get("/metrics", metrics_view),
                    *routes])
    return app
