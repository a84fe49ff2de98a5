"""The browser's filtering forward proxy: every connection Chromium makes goes through
``agent.netguard`` (issue 17).

Playwright's ``page.route`` sees only the first request of a redirect chain, and Chromium resolves
host names itself, so a check in a route handler can be passed by a redirect or by a name that
resolves differently a moment later. Chromium is therefore launched with this proxy as its only
way out (``--proxy-server``, loopback included, WebRTC limited to proxied traffic): it sends the
host *name* to the proxy (``CONNECT host:443`` for https and WebSockets, an absolute-form request
for http), and the proxy resolves it with the guard and connects only to an allowed address.
Redirect hops, subresources, scripts' requests and WebSockets are all new proxy requests, each
checked. A refused target gets ``403`` with the reason as its body (an http page shows it; for
https Chromium reports ``ERR_TUNNEL_CONNECTION_FAILED``); ``refusals_since`` returns the recent
reasons so the tool can tell the model. Each browser context (one per session) has its own proxy,
so one session never hears of another's refusals.

The proxy listens on 127.0.0.1 on a random port and runs on the AsyncBridge loop with Playwright.
Plain-http requests are forwarded one per connection (``Connection: close`` upstream).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque

from yarl import URL

from agent.netguard import BlockedAddress, NetGuard

log = logging.getLogger("agent.browser_proxy")

_HEAD_LIMIT = 64 * 1024
_HOP_HEADERS = {"connection", "proxy-connection", "proxy-authorization", "keep-alive", "te", "upgrade"}


class GuardProxy:
    """An HTTP forward proxy (``CONNECT`` and absolute-form ``http://`` requests) behind ``guard``.

    Args:
        guard: decides which addresses may be connected to.
        connect_timeout_s: reading the request head, and each upstream connection attempt.
    """

    def __init__(self, guard: NetGuard, *, connect_timeout_s: float = 10.0) -> None:
        self.guard = guard
        self._connect_timeout_s = connect_timeout_s
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._refusals: deque[str] = deque(maxlen=50)
        self.refusal_count = 0
        """Targets refused so far (a mark for ``refusals_since``)."""
        self.port = 0

    def refusals_since(self, mark: int) -> list[str]:
        """Messages of the targets refused after ``refusal_count`` was ``mark`` (the latest 50 at most)."""
        return list(self._refusals)[-min(self.refusal_count - mark, len(self._refusals)):] \
            if self.refusal_count > mark else []

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT`` once started."""
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> str:
        """Starts listening on 127.0.0.1 (random port); returns ``url``."""
        if self._server is None:
            self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0, limit=_HEAD_LIMIT)
            self.port = self._server.sockets[0].getsockname()[1]
        return self.url

    async def close(self) -> None:
        """Stops listening and closes every open tunnel."""
        if self._server is not None:
            self._server.close()
            self._server = None
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._serve(reader, writer)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
            log.debug("proxy connection ended: %s", exc)
        finally:
            self._tasks.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self._connect_timeout_s)
        request_line, *header_lines = head[:-4].decode("latin-1").split("\r\n")
        method, target, version = request_line.split(" ", 2)
        if method == "CONNECT":
            host, _, port_text = target.rpartition(":")
            host, port = host.strip("[]"), int(port_text)
            path_line = b""
        else:
            url = URL(target)
            if url.scheme != "http" or not url.host:
                await self._refuse(writer, 400, f"refused {target[:200]}: not an absolute http:// URL")
                return
            host, port = url.host, url.port or 80
            headers = [line for line in header_lines
                       if line.split(":", 1)[0].strip().lower() not in _HOP_HEADERS]
            path_line = (f"{method} {url.raw_path_qs or '/'} {version}\r\n" + "".join(f"{h}\r\n" for h in headers)
                         + "Connection: close\r\n\r\n").encode("latin-1")
        try:
            up_reader, up_writer = await self.guard.open_connection(host, port, self._connect_timeout_s)
        except BlockedAddress as exc:
            self._refusals.append(str(exc))
            self.refusal_count += 1
            log.info("browser request refused: %s", exc)
            await self._refuse(writer, 403, str(exc))
            return
        except OSError as exc:
            await self._refuse(writer, 502, f"cannot connect to {host}:{port}: {exc}")
            return
        try:
            if method == "CONNECT":
                writer.write(b"HTTP/1.1 200 Connection Established\r\n\r\n")
                await writer.drain()
            else:
                up_writer.write(path_line)
            await self._pipe(reader, writer, up_reader, up_writer)
        finally:
            up_writer.close()
            with contextlib.suppress(Exception):
                await up_writer.wait_closed()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    up_reader: asyncio.StreamReader, up_writer: asyncio.StreamWriter) -> None:
        async def copy(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            while True:
                data = await source.read(65536)
                if not data:
                    return
                sink.write(data)
                await sink.drain()

        tasks = [asyncio.create_task(copy(reader, up_writer)), asyncio.create_task(copy(up_reader, writer))]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(BaseException):
                    await task

    @staticmethod
    async def _refuse(writer: asyncio.StreamWriter, status: int, message: str) -> None:
        reason = {400: "Bad Request", 403: "Forbidden", 502: "Bad Gateway"}[status]
        body = f"<title>Refused</title><p>{_escape(message)}</p>".encode()
        writer.write(f"HTTP/1.1 {status} {reason}\r\nContent-Type: text/html; charset=utf-8\r\n"
                     f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
        await writer.drain()


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
