"""MCP client (issue 9): tools of stdio and streamable-HTTP MCP servers as ``Tool``s.

Each server's session lives on the AsyncBridge loop: one task per connection enters the
transport and ``ClientSession`` (anyio requires the same task to leave them) and waits until the
connection ends. Discovery runs there too, so start-up never blocks the main loop; a server that
does not answer within the timeout is reported and skipped. A server that crashes, hangs or
exits later is restarted on the next call (``_Server``). Tools are named ``<server>__<tool>``
(cut and suffixed to fit ``^[a-zA-Z0-9_-]{1,64}$``), run through the bridge like any async tool
(the executor's timeout and result cap apply), and are marked ``side_effect="external"`` unless
the server annotates them read-only.
"""
from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import re
import threading
from dataclasses import dataclass, field
from typing import Any

from agent.bridge import AsyncBridge
from agent.tools import Tool

log = logging.getLogger("agent.mcp")
_BAD = re.compile(r"[^a-zA-Z0-9_-]")


@dataclass(frozen=True)
class McpServerSpec:
    """How to reach one server: ``command`` (argv, stdio) or ``url`` (streamable HTTP)."""

    name: str
    command: list[str] | None = None
    env: dict[str, str] = field(default_factory=dict)
    url: str | None = None
    headers: dict[str, str] = field(default_factory=dict, repr=False)
    timeout_s: float = 30.0


@dataclass
class McpStatus:
    """What discovery found for one server (``gateway doctor`` prints it)."""

    name: str
    ok: bool
    detail: str
    tools: list[str] = field(default_factory=list)


def tool_name(server: str, tool: str) -> str:
    """``server__tool`` within the API's name rule; over-long names keep a hash suffix (unique)."""
    name = f"{_BAD.sub('_', server)}__{_BAD.sub('_', tool)}"
    if len(name) <= 64:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{name[:55]}_{digest}"


def _text_of(result: Any) -> str:
    parts = []
    for block in getattr(result, "content", None) or []:
        text = getattr(block, "text", None)
        parts.append(text if text is not None else f"[{getattr(block, 'type', 'content')} omitted]")
    if not parts and getattr(result, "structured_content", None) is not None:
        import json

        parts.append(json.dumps(result.structured_content, ensure_ascii=False, default=str))
    text = "\n".join(parts) or "(no output)"
    return f"Error: {text}" if getattr(result, "is_error", False) else text


class McpUnavailable(Exception):
    """A call could not be answered because the server crashed, hung or could not be started
    again; the message says which and what happens next (the executor shows it to the model)."""


class _StderrLog:
    """A stdio server's stderr, one log record per line (logger ``agent.mcp``, so through the
    gateway's redacting handler: a server that prints its token or the environment leaks nothing).

    ``file`` is the pipe's write end, given to the server process; ``close`` closes the gateway's
    copy, and the reading thread ends when the process has closed its own (it exited)."""

    def __init__(self, server: str) -> None:
        read_fd, write_fd = os.pipe()
        self.file = os.fdopen(write_fd, "w")
        self._server = server
        self._thread = threading.Thread(target=self._pump, args=(read_fd,), name=f"mcp-stderr:{server}",
                                        daemon=True)
        self._thread.start()

    def _pump(self, read_fd: int) -> None:
        with os.fdopen(read_fd, "r", errors="replace") as lines:
            for line in lines:
                if line.strip():
                    log.warning("MCP server %s stderr: %s", self._server, line.rstrip()[:2000])

    def close(self) -> None:
        self.file.close()


class _Connection:
    """One session with a server (for stdio: one server process), owned by one task on the bridge
    loop: the task enters the transport and ``ClientSession`` and leaves them when ``stop`` is set,
    which the transport's end also sets (a server process that exited, a dropped HTTP stream), so
    a dead connection is noticed before the next call is sent. Leaving the stdio transport stops
    the process (stdin closed, then SIGTERM/SIGKILL to its tree, bounded) and reaps it."""

    def __init__(self, spec: McpServerSpec) -> None:
        self.spec = spec
        self.session: Any = None
        loop = asyncio.get_running_loop()
        self.ready: asyncio.Future[list[Any]] = loop.create_future()
        self.ready.add_done_callback(lambda f: f.cancelled() or f.exception())  # read even when nobody waits
        self.stop = asyncio.Event()
        self.stderr: _StderrLog | None = None
        self.task = loop.create_task(self._run(), name=f"mcp:{spec.name}")

    @property
    def alive(self) -> bool:
        return self.session is not None and not self.stop.is_set()

    def _transport(self) -> Any:
        if self.spec.command:
            from mcp.client.stdio import StdioServerParameters, stdio_client

            params = StdioServerParameters(command=self.spec.command[0], args=self.spec.command[1:],
                                           env=self.spec.env or None)
            self.stderr = _StderrLog(self.spec.name)
            return stdio_client(params, errlog=self.stderr.file)
        import httpx2
        from mcp.client.streamable_http import streamable_http_client

        client = httpx2.AsyncClient(headers=self.spec.headers, timeout=self.spec.timeout_s)
        return streamable_http_client(self.spec.url or "", http_client=client)

    async def _relay(self, source: Any, sink: Any) -> None:
        """Passes the transport's messages to the session; the transport's end ends the connection."""
        async with sink:
            async for item in source:
                await sink.send(item)
        if not self.stop.is_set():
            log.warning("MCP server %s: connection closed by the server", self.spec.name)
        self.stop.set()

    async def _run(self) -> None:
        import anyio
        from mcp import ClientSession
        from mcp_types import PaginatedRequestParams

        try:
            async with self._transport() as (read, write), anyio.create_task_group() as relay:
                sink, source = anyio.create_memory_object_stream[Any](0)
                relay.start_soon(self._relay, read, sink)
                async with ClientSession(source, write) as session:
                    await session.initialize()
                    tools: list[Any] = []
                    cursor = None
                    while True:
                        page = await session.list_tools(
                            params=PaginatedRequestParams(cursor=cursor) if cursor else None)
                        tools.extend(page.tools)
                        cursor = page.next_cursor
                        if not cursor:
                            break
                    self.session = session
                    if not self.ready.done():
                        self.ready.set_result(tools)
                    await self.stop.wait()
                relay.cancel_scope.cancel()
        except BaseException as exc:  # anyio wraps failures in groups; report the first cause
            if not self.ready.done():
                self.ready.set_exception(exc if isinstance(exc, Exception) else RuntimeError(repr(exc)))
            if isinstance(exc, asyncio.CancelledError):
                raise
        finally:
            self.session = None
            self.stop.set()
            if self.stderr is not None:
                self.stderr.close()
            if not self.ready.done():
                self.ready.set_exception(ConnectionError("the connection ended before it was ready"))

    async def close(self, timeout_s: float) -> bool:
        """Ends the session (and stops a stdio server's process); whether it finished in time."""
        self.stop.set()
        done, _ = await asyncio.wait([self.task], timeout=timeout_s)
        return bool(done)


def _first_cause(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]  # anyio task groups wrap the real cause
    return exc


class _Server:
    """One configured server: its current connection, replaced when it dies.

    Rules of ``call`` (each bounded by the server's ``timeout_s``): a connection found dead (the
    process exited, the stream closed) is replaced before the call is sent, so a server that
    exited or was restarted between calls is re-initialised transparently; a call the server
    drops (it crashed while running it) or does not answer in time (it hangs) raises
    ``McpUnavailable`` and the connection is ended (a hung process is killed), so the next call
    starts the server again. A protocol error the server answers (unknown tool, bad params) is
    returned as an error text; the connection stays.
    """

    def __init__(self, spec: McpServerSpec) -> None:
        self.spec = spec
        self.connection: _Connection | None = None
        self.starts = 0
        self._lock: asyncio.Lock | None = None
        self._closing: set[asyncio.Task[Any]] = set()
        """Tasks of connections being ended (a hung or cancelled server's process is still stopping)."""

    async def connect(self, timeout_s: float) -> list[Any]:
        """Starts a connection and returns the server's tools; raises when it fails or is late."""
        connection = _Connection(self.spec)
        try:
            tools = await asyncio.wait_for(asyncio.shield(connection.ready), timeout_s)
        except BaseException:
            connection.task.cancel()  # the transport still stops the process; ``close`` waits for it
            self._track(connection.task)
            raise
        self.connection = connection
        self.starts += 1
        return tools

    async def _session(self, timeout_s: float) -> tuple[_Connection, Any]:
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            connection = self.connection
            if connection is not None and connection.alive:
                return connection, connection.session
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout_s
            if connection is not None:  # a dead process is reaped before its successor starts
                await connection.close(max(0.1, deadline - loop.time()))
            log.warning("MCP server %s is not connected; starting it again", self.spec.name)
            try:
                await self.connect(max(0.1, deadline - loop.time()))
            except Exception as exc:
                cause = _first_cause(exc)
                detail = "no answer" if isinstance(cause, TimeoutError) else f"{type(cause).__name__}: {cause}"
                raise McpUnavailable(f"MCP server {self.spec.name} is not running and could not be started "
                                     f"again within {timeout_s:g} s ({detail}); nothing was run.") from None
            assert self.connection is not None
            return self.connection, self.connection.session

    def _drop(self, connection: _Connection) -> None:
        """Ends ``connection`` in the background (killing a hung process takes a few seconds); the
        next call waits for it before starting the server again."""
        connection.stop.set()
        self._track(connection.task)

    def _track(self, task: asyncio.Task[Any]) -> None:
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def call(self, name: str, arguments: dict[str, Any]) -> str:
        from mcp import MCPError
        from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT

        loop = asyncio.get_running_loop()
        limit = self.spec.timeout_s
        started = loop.time()
        connection, session = await self._session(limit)
        left = max(1.0, limit - (loop.time() - started))
        maybe = "it may or may not have taken effect"
        try:
            result = await asyncio.wait_for(session.call_tool(name, arguments, read_timeout_seconds=left), left + 1)
        except MCPError as exc:
            if exc.code == REQUEST_TIMEOUT:
                self._drop(connection)
                raise McpUnavailable(f"MCP server {self.spec.name} did not answer {name} within {limit:g} s; the "
                                     f"server was stopped and starts again on the next call ({maybe}).") from None
            if exc.code == CONNECTION_CLOSED:
                self._drop(connection)
                raise McpUnavailable(f"MCP server {self.spec.name} stopped while running {name} (connection "
                                     f"closed); it starts again on the next call ({maybe}).") from None
            return f"Error: MCP server {self.spec.name} refused {name}: {exc.message}"
        except TimeoutError:
            self._drop(connection)
            raise McpUnavailable(f"MCP server {self.spec.name} did not answer {name} within {limit:g} s; the "
                                 f"server was stopped and starts again on the next call ({maybe}).") from None
        except Exception as exc:  # the transport failed under the call (a broken pipe, an HTTP error)
            self._drop(connection)
            cause = _first_cause(exc)
            raise McpUnavailable(f"MCP server {self.spec.name} failed while running {name} "
                                 f"({type(cause).__name__}: {cause}); it starts again on the next call "
                                 f"({maybe}).") from None
        return _text_of(result)

    async def close(self) -> None:
        """Ends the connection and waits (bounded: the stdio transport needs about 5 s at most to
        stop a process that ignores its closed stdin) for every connection still ending."""
        if self.connection is not None:
            self.connection.stop.set()
            self._track(self.connection.task)
        if self._closing:
            await asyncio.wait(list(self._closing), timeout=10)


class McpClients:
    """The configured servers. ``discover`` (from any loop) connects them; ``close`` at shutdown
    happens through the bridge's ``on_stop``."""

    def __init__(self, specs: list[McpServerSpec], bridge: AsyncBridge) -> None:
        self.specs = specs
        self.bridge = bridge
        self.status: list[McpStatus] = []
        self._servers: dict[str, _Server] = {}

    async def discover(self, timeout_s: float) -> list[Tool]:
        """Connects every server on the bridge loop (concurrently, each within ``timeout_s``);
        returns the tools of those that answered. Never raises for a server's failure."""
        if not self.specs:
            return []
        future = asyncio.run_coroutine_threadsafe(self._discover_all(timeout_s), self.bridge.loop)
        return await asyncio.wrap_future(future)

    async def _discover_all(self, timeout_s: float) -> list[Tool]:
        results = await asyncio.gather(*(self._discover(spec, timeout_s) for spec in self.specs))
        self.bridge.on_stop(self._close)
        return [tool for tools in results for tool in tools]

    async def _discover(self, spec: McpServerSpec, timeout_s: float) -> list[Tool]:
        server = _Server(spec)
        try:
            found = await server.connect(timeout_s)
        except Exception as exc:
            cause = _first_cause(exc)
            detail = f"no answer within {timeout_s:g} s" if isinstance(cause, TimeoutError) \
                else f"{type(cause).__name__}: {cause}"
            log.warning("MCP server %s skipped: %s", spec.name, detail)
            self.status.append(McpStatus(spec.name, False, detail))
            return []
        self._servers[spec.name] = server
        tools = [self._tool(server, t) for t in found]
        self.status.append(McpStatus(spec.name, True, f"{len(tools)} tools", [t.name for t in tools]))
        log.info("MCP server %s: %d tools", spec.name, len(tools))
        return tools

    def _tool(self, server: _Server, mcp_tool: Any) -> Tool:
        remote = mcp_tool.name
        annotations = getattr(mcp_tool, "annotations", None)
        read_only = bool(getattr(annotations, "read_only_hint", False))
        schema = dict(mcp_tool.input_schema or {"type": "object", "properties": {}})
        schema.setdefault("type", "object")
        schema.setdefault("properties", {})

        async def call(**arguments: Any) -> str:
            return await server.call(remote, arguments)

        return Tool(name=tool_name(server.spec.name, remote),
                    description=f"[MCP {server.spec.name}] {mcp_tool.description or remote}",
                    parameters=schema, fn=call, is_async=True, timeout_s=server.spec.timeout_s + 5,
                    side_effect="read" if read_only else "external", retries=0)

    async def _close(self) -> None:
        await asyncio.gather(*(server.close() for server in self._servers.values()))
        self._servers.clear()
