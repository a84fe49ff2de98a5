"""A loopback aiohttp server on its own thread and event loop, the base of every wire-level fake.

Fakes run on their own loop so that blocking SDK calls made by the code under test (the sync
``openai`` client on worker threads, lark-oapi's sync token fetch) can never deadlock the fake,
and so that a test's event loop stays free for the gateway itself.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from aiohttp import web

T = TypeVar("T")


class ThreadedServer:
    """Runs ``self.app`` (an ``aiohttp.web.Application``) on 127.0.0.1 in a daemon thread.

    Subclasses build their routes in ``build_app()`` and may bind another loopback address
    (``host = "::1"``). ``start()`` blocks until the socket is bound and returns the base URL
    ``http://127.0.0.1:PORT``; ``stop()`` shuts the server down.
    ``call(coro)`` runs a coroutine on the server's loop from any thread (for injecting events).
    """

    host = "127.0.0.1"

    def __init__(self, port: int = 0) -> None:
        self._port = port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._ready = threading.Event()
        self._startup_error: BaseException | None = None
        self.port: int = 0

    def build_app(self) -> web.Application:
        """Returns the application to serve; subclasses override."""
        raise NotImplementedError

    @property
    def url(self) -> str:
        """Base URL of the running server, e.g. ``http://127.0.0.1:43121``."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        assert self._loop is not None, "server not started"
        return self._loop

    def start(self) -> str:
        """Starts the server thread; returns the base URL. Raises what the server raised on start."""
        self._thread = threading.Thread(target=self._run, name=type(self).__name__, daemon=True)
        self._thread.start()
        self._ready.wait(10)
        if self._startup_error is not None:
            raise self._startup_error
        return self.url

    def _run(self) -> None:
        self._loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._serve())
        except BaseException as exc:  # surfaced to start()
            self._startup_error = exc
            self._ready.set()
            return
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(self._runner.cleanup() if self._runner else asyncio.sleep(0))
        self._loop.close()

    async def _serve(self) -> None:
        self._runner = web.AppRunner(self.build_app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self._port)
        await site.start()
        sockets = site._server.sockets  # type: ignore[union-attr]
        self.port = sockets[0].getsockname()[1]

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 10) -> T:
        """Runs ``coro`` on the server loop from another thread and returns its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        """Stops the server and joins its thread (idempotent)."""
        if self._loop is not None and self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None

    def __enter__(self) -> ThreadedServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
