"""Feishu/Lark long connection (event subscription over WebSocket) with a bounded, backing-off
reconnect, on a thread of its own.

lark-oapi's ``ws.Client`` (1.7.5) binds a module-level event loop, blocks in ``start()`` and has no
public stop (PLATFORMS.md §0.3). Its own reconnect fetches the connection URL with a *sync*
``requests.post`` without a timeout (a silent network stalls the loop, and with it shutdown) and
then retries at a fixed interval (120 s unless the server says otherwise, after up to 30 s of
jitter). Here the client's frame handling, pings and acks are lark's, but connecting is ours:

- the URL (``POST {domain}/callback/ws/endpoint``, body ``{"AppID", "AppSecret"}``) is fetched
  with aiohttp, and the fetch plus the WebSocket handshake are bounded by ``connect_timeout_s``;
- a failed attempt is retried after ``backoff_initial_s``, doubling up to ``backoff_max_s``, plus
  up to ``backoff_jitter_s`` of random jitter (tenacity ``wait_exponential_jitter``); a connection
  that opens resets the delay, and a dropped one is retried within ``backoff_initial_s`` (a random
  share of it, so many instances do not reconnect in the same instant);
- ``start()`` returns immediately and ``stop()`` ends a pending attempt or wait at once, so
  neither start-up nor shutdown waits for Feishu.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import threading
from collections.abc import Callable
from typing import Any

import aiohttp
import lark_oapi as lark
from lark_oapi.core.json import JSON
from lark_oapi.ws.model import EndpointResp
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, wait_exponential_jitter

log = logging.getLogger("adapters.feishu")

ENDPOINT_PATH = "/callback/ws/endpoint"


class LongConnectionError(Exception):
    """One connect attempt failed: the endpoint refused (``code``/``msg`` from Feishu, never the
    secret) or answered something else than a connection URL."""


class _Events(lark.EventDispatcherHandler):
    """lark's client calls ``_do_without_validation(payload)`` on its loop for each event frame and
    acks ``{"code": 200}`` when it returns, 500 when it raises (Feishu then pushes it again)."""

    def __init__(self, on_payload: Callable[[bytes], None]) -> None:
        super().__init__()
        self._on_payload = on_payload

    def _do_without_validation(self, payload: bytes) -> Any:
        self._on_payload(payload)
        return None


class _Client(lark.ws.Client):
    """lark's long-connection client, connected by ``LongConnection``: it uses the URL fetched for
    it and, when its receive loop ends (the socket dropped), reports the loss instead of running
    lark's own reconnect."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.endpoint_url = ""
        self.lost = asyncio.Event()

    def _get_conn_url(self) -> str:  # called by lark's _connect()
        return self.endpoint_url

    async def _reconnect(self) -> None:  # called by lark's receive loop after _disconnect()
        self.lost.set()


class LongConnection:
    """The long connection of one app.

    Args:
        app_id, app_secret: the app's credentials (the secret is sent only to ``domain``).
        domain: open platform origin (``https://open.feishu.cn``, ``https://open.larksuite.com``, or
            a loopback fake).
        on_payload: called on the connection's thread with each event's JSON bytes; returning acks
            the event, raising makes Feishu push it again.
        connect_timeout_s: bound on one attempt (URL fetch + WebSocket handshake), seconds.
        backoff_initial_s, backoff_max_s, backoff_jitter_s: retry delays after failed attempts
            (seconds): ``initial * 2**(n-1)`` plus ``0..jitter`` (default: ``initial``), at most ``max``.
    """

    def __init__(self, *, app_id: str, app_secret: str, domain: str, on_payload: Callable[[bytes], None],
                 connect_timeout_s: float = 10.0, backoff_initial_s: float = 1.0, backoff_max_s: float = 60.0,
                 backoff_jitter_s: float | None = None) -> None:
        self.app_id = app_id
        self._app_secret = app_secret
        self.domain = domain.rstrip("/")
        self._on_payload = on_payload
        self.connect_timeout_s = connect_timeout_s
        self._initial = backoff_initial_s
        self._wait = wait_exponential_jitter(multiplier=backoff_initial_s, max=backoff_max_s, exp_base=2,
                                             jitter=backoff_initial_s if backoff_jitter_s is None else backoff_jitter_s)
        self.connected = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._client: _Client | None = None

    def start(self) -> None:
        """Starts the connection thread and returns at once (connecting happens there)."""
        if self._thread is not None:
            return
        started = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(started,), name="feishu-ws", daemon=True)
        self._thread.start()
        started.wait(5)

    async def stop(self, timeout_s: float = 5.0) -> None:
        """Closes the connection (or ends the pending attempt or wait) and joins the thread."""
        thread, loop, stopping = self._thread, self._loop, self._stopping
        self._thread = None
        if thread is None:
            return
        if loop is not None and stopping is not None and loop.is_running():
            loop.call_soon_threadsafe(stopping.set)
        await asyncio.to_thread(thread.join, timeout_s)
        if thread.is_alive():
            log.warning("feishu long connection thread did not stop within %.0f s", timeout_s)

    def alive(self) -> bool:
        """Whether the connection thread runs (it ends only after ``stop``)."""
        return self._thread is not None and self._thread.is_alive()

    # -- the connection thread ---------------------------------------------------------------
    def _run(self, started: threading.Event) -> None:
        import lark_oapi.ws.client as ws_client  # the module holding lark's long-connection loop

        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        ws_client.loop = loop  # lark creates its receive tasks on this module global
        self._loop = loop
        self._stopping = asyncio.Event()
        self._client = _Client(self.app_id, self._app_secret, log_level=lark.LogLevel.WARNING,
                               event_handler=_Events(self._on_payload), domain=self.domain, auto_reconnect=True)
        started.set()
        try:
            loop.run_until_complete(self._supervise())
        except Exception as exc:  # never expected: the supervisor catches what an attempt raises
            log.error("feishu long connection ended: %s", type(exc).__name__)
        finally:
            tasks = [task for task in asyncio.all_tasks(loop) if not task.done()]
            for task in tasks:
                task.cancel()
            if tasks:
                loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            loop.close()

    async def _supervise(self) -> None:
        assert self._client is not None and self._stopping is not None
        client, stopping = self._client, self._stopping
        pings = asyncio.create_task(client._ping_loop())
        try:
            while not stopping.is_set():
                if not await self._connect_with_backoff():
                    break
                self.connected.set()
                log.info("feishu long connection open")
                lost = asyncio.create_task(client.lost.wait())
                stop = asyncio.create_task(stopping.wait())
                await asyncio.wait({lost, stop}, return_when=asyncio.FIRST_COMPLETED)
                lost.cancel()
                stop.cancel()
                self.connected.clear()
                if client.lost.is_set() and not stopping.is_set():
                    log.warning("feishu long connection lost; reconnecting")
                    await self._sleep(random.uniform(0, self._initial))
        finally:
            pings.cancel()
            client._auto_reconnect = False
            # lark's own tasks (receive loop, frame handlers) first, so none outlives the socket or
            # ends with an exception nobody retrieves; then the socket itself.
            tasks = [task for task in asyncio.all_tasks() if not task.done() and task is not asyncio.current_task()
                     and getattr(task.get_coro(), "__qualname__", "").startswith("Client.")]
            for task in tasks:
                task.cancel()
            await asyncio.gather(pings, *tasks, return_exceptions=True)
            with contextlib.suppress(Exception):
                await client._disconnect()

    async def _connect_with_backoff(self) -> bool:
        """Attempts until one opens the connection (``True``) or ``stop`` was called (``False``)."""
        assert self._stopping is not None
        stopping = self._stopping
        retrying = AsyncRetrying(
            wait=self._wait, retry=retry_if_exception_type(Exception), sleep=self._sleep,
            stop=lambda state: stopping.is_set(), before_sleep=self._log_failure, reraise=True)
        try:
            async for attempt in retrying:
                with attempt:
                    if stopping.is_set():
                        return False
                    await self._attempt()
        except Exception:
            return False  # stopped while an attempt was failing
        return not stopping.is_set()

    async def _attempt(self) -> None:
        """One bounded attempt: fetch the URL, open the WebSocket (lark's ``_connect``)."""
        assert self._client is not None
        client = self._client
        async with asyncio.timeout(self.connect_timeout_s):
            client.endpoint_url = await self._fetch_endpoint()
            client.lost.clear()
            await client._connect()

    async def _fetch_endpoint(self) -> str:
        """Feishu long connection bootstrap: ``POST {domain}/callback/ws/endpoint`` with the app's
        credentials -> ``{"code": 0, "data": {"URL": "wss://…", "ClientConfig": {…}}}``; the server's
        ping interval is kept, its reconnect settings are replaced by this class's backoff."""
        assert self._client is not None
        async with aiohttp.ClientSession() as session, session.post(
                self.domain + ENDPOINT_PATH, json={"AppID": self.app_id, "AppSecret": self._app_secret},
                headers={"locale": "zh"}, allow_redirects=False) as response:  # the secret goes nowhere else
            text, status = await response.text(), response.status
        try:
            endpoint = JSON.unmarshal(text, EndpointResp)
        except ValueError:
            raise LongConnectionError(f"endpoint answered HTTP {status}, not JSON") from None
        if status != 200 or endpoint.code != 0 or endpoint.data is None or not endpoint.data.URL:
            raise LongConnectionError(f"endpoint refused (HTTP {status}): code {endpoint.code}: {endpoint.msg}")
        config = endpoint.data.ClientConfig
        if config is not None and isinstance(config.PingInterval, int) and config.PingInterval > 0:
            self._client._ping_interval = config.PingInterval
        return str(endpoint.data.URL)

    async def _sleep(self, seconds: float) -> None:
        """Waits ``seconds`` or until ``stop`` is called, whichever comes first."""
        assert self._stopping is not None
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), seconds)

    @staticmethod
    def _log_failure(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome is not None else None
        reason = "timed out" if isinstance(exc, TimeoutError) else f"{type(exc).__name__}: {exc}"
        delay = state.next_action.sleep if state.next_action is not None else 0.0
        log.warning("feishu long connection attempt %d failed (%s); retrying in %.1f s",
                    state.attempt_number, reason, delay)
