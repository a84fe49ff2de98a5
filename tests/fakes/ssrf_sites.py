"""Loopback sites for the SSRF tests (issue 17): an internal server holding a secret, a "public"
site that redirects wherever it is told, and a resolver that names them.

The public site binds 127.10.0.1, which the guard under test is told to treat as public
(``NetGuard(allow=[PUBLIC_NETWORK])``); everything else on loopback stays refused.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any
from urllib.parse import quote

from aiohttp import web
from aiohttp.abc import AbstractResolver, ResolveResult

from tests.fakes.server import ThreadedServer

SECRET = "INTERNAL-SECRET-7731"
PUBLIC_IP = "127.10.0.1"
PUBLIC_NETWORK = f"{PUBLIC_IP}/32"


class InternalServer(ThreadedServer):
    """``/secret`` answers the secret; ``hits`` counts every request that arrived."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        super().__init__()
        self.host = host
        self.hits: list[str] = []

    def build_app(self) -> web.Application:
        @web.middleware
        async def count(request: web.Request, handler: Any) -> web.StreamResponse:
            self.hits.append(request.path_qs)
            return await handler(request)

        async def secret(_: web.Request) -> web.Response:
            return web.Response(text=f"<title>Admin</title><p>{SECRET}</p>", content_type="text/html")

        app = web.Application(middlewares=[count])
        app.add_routes([web.get("/secret", secret)])
        return app


class PublicSite(ThreadedServer):
    """``/to?u=URL`` redirects (302) to URL; ``/hop2?u=URL`` redirects to ``/to?u=URL`` (two hops);
    ``/loop?n=N`` redirects N more times; ``/page`` is a plain page; ``/embeds?port=P`` loads an
    image, frames and a ``fetch`` from the internal server on port P; ``/headers`` echoes the
    credentials it received; ``/setcookie`` sets a session cookie; ``/streamed`` sends 20 lines
    10 ms apart; ``/secret`` is a 404 here."""

    host = PUBLIC_IP

    def build_app(self) -> web.Application:
        async def to(request: web.Request) -> web.Response:
            raise web.HTTPFound(request.query["u"])

        async def hop2(request: web.Request) -> web.Response:
            raise web.HTTPFound(f"/to?u={quote(request.query['u'], safe='')}")

        async def loop(request: web.Request) -> web.Response:
            n = int(request.query["n"])
            raise web.HTTPFound(f"/loop?n={n - 1}" if n > 0 else "/page")

        async def page(_: web.Request) -> web.Response:
            return web.Response(text="<title>Public</title><p>A public page.</p>", content_type="text/html")

        async def embeds(request: web.Request) -> web.Response:
            port = request.query["port"]  # the internal server's, referenced four ways
            redirected = quote(f"http://internal.test:{port}/secret?redirected-frame", safe="")
            return web.Response(content_type="text/html", text=(
                "<title>Embeds</title><p>A public page with embeds.</p>"
                f"<img src='http://127.0.0.1:{port}/secret?img'>"
                f"<iframe src='http://2130706433:{port}/secret?frame'></iframe>"
                f"<iframe src='/to?u={redirected}'></iframe>"
                f"<script>fetch('http://[::ffff:127.0.0.1]:{port}/secret?fetch').catch(() => {{}});</script>"))

        async def headers(request: web.Request) -> web.Response:
            return web.json_response({k: request.headers.get(k) for k in ("Authorization", "Cookie", "Host")})

        async def set_cookie(_: web.Request) -> web.Response:
            response = web.Response(text="<title>Login</title><p>Signed in.</p>", content_type="text/html")
            response.set_cookie("sid", "user-one-session-cookie")
            return response

        async def streamed(request: web.Request) -> web.StreamResponse:
            response = web.StreamResponse(headers={"Content-Type": "text/plain; charset=utf-8"})
            await response.prepare(request)
            for n in range(1, 21):  # sent as a server streams a page it renders: line by line
                await response.write(f"line {n:02d} {'x' * 290}\n".encode())
                await asyncio.sleep(0.01)
            await response.write_eof()
            return response

        app = web.Application()
        app.add_routes([web.get("/to", to), web.get("/hop2", hop2), web.get("/loop", loop), web.get("/page", page),
                        web.get("/embeds", embeds), web.get("/headers", headers),
                        web.get("/setcookie", set_cookie), web.get("/streamed", streamed)])
        return app


class FakeResolver(AbstractResolver):
    """Names to addresses for the guard under test: ``public.test`` and ``other.test`` (another
    origin, same site) are public, ``internal.test`` is 127.0.0.1, ``rebind.test`` changes after
    its first lookup."""

    def __init__(self) -> None:
        self.lookups: list[str] = []

    async def resolve(self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
                      ) -> list[ResolveResult]:
        self.lookups.append(host)
        table = {"public.test": PUBLIC_IP, "other.test": PUBLIC_IP, "internal.test": "127.0.0.1",
                 "rebind.test": PUBLIC_IP if self.lookups.count("rebind.test") == 1 else "127.0.0.1"}
        if host not in table:
            raise OSError(f"{host} does not resolve")
        return [ResolveResult(hostname=host, host=table[host], port=port, family=socket.AF_INET, proto=0,
                              flags=socket.AI_NUMERICHOST)]

    async def close(self) -> None:
        pass




def redirect_chain(public_base: str, target: str, hops: int) -> str:
    """A URL on the public site that reaches ``target`` after ``hops`` (0-2) redirects."""
    if hops == 0:
        return target
    return f"{public_base}/{'to' if hops == 1 else 'hop2'}?u={quote(target, safe='')}"
