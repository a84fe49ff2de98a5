"""The HTTP server (aiohttp): webhooks of the adapters, health, readiness and metrics."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web


def build_app(routes: list[web.RouteDef], ready: Callable[[], Awaitable[bool]],
              metrics: Callable[[], Awaitable[bytes]], metrics_type: str = "text/plain") -> web.Application:
    """``/healthz`` (process up), ``/readyz`` (database reachable, adapters started),
    ``/metrics`` (Prometheus text) plus the adapters' webhook ``routes``. Request bodies are
    capped at 1 MiB."""

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def readyz(_: web.Request) -> web.Response:
        ok = await ready()
        return web.json_response({"status": "ready" if ok else "not ready"}, status=200 if ok else 503)

    async def metrics_view(_: web.Request) -> web.Response:
        return web.Response(body=await metrics(), headers={"Content-Type": metrics_type})

    app = web.Application(client_max_size=1024 * 1024)
    app.add_routes([web.get("/healthz", healthz), web.get("/readyz", readyz), web.get("/metrics", metrics_view),
                    *routes])
    return app
