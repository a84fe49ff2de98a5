"""MCP client (issue 9): tools of stdio and streamable-HTTP MCP servers as ``Tool``s.

Each server's session lives on the AsyncBridge loop for the life of the process: one task per
server enters the transport and ``ClientSession`` (anyio requires the same task to leave them)
and waits until ``close``. Discovery runs there too, so start-up never blocks the main loop; a
server that does not answer within the timeout is reported and skipped. Tools are named
``<server>__<tool>`` (cut and suffixed to fit ``^[a-zA-Z0-9_-]{1,64}$``), run through the
bridge like any async tool (the executor's timeout and result cap apply), and are marked
``side_effect="external"`` unless the server annotates them read-only.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
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


class _Server:
    """One server's long-lived session, owned by one task on the bridge loop."""

    def __init__(self, spec: McpServerSpec) -> None:
        self.spec = spec
        self.session: Any = None
        self.ready: asyncio.Future[list[Any]] | None = None
        self.stop: asyncio.Event | None = None
        self.task: asyncio.Task[None] | None = None

    def _transport(self) -> Any:
        if self.spec.command:
            from mcp.client.stdio import StdioServerParameters, stdio_client

            params = StdioServerParameters(command=self.spec.command[0], args=self.spec.command[1:],
                                           env=self.spec.env or None)
            return stdio_client(params)
        import httpx2
        from mcp.client.streamable_http import streamable_http_client

        client = httpx2.AsyncClient(headers=self.spec.headers, timeout=self.spec.timeout_s)
        return streamable_http_client(self.spec.url or "", http_client=client)

    async def run(self) -> None:
        from mcp import ClientSession

        assert self.ready is not None and self.stop is not None
        try:
            async with self._transport() as (read, write), ClientSession(read, write) as session:
                await session.initialize()
                tools: list[Any] = []
                cursor = None
                while True:
                    from mcp_types import PaginatedRequestParams

                    page = await session.list_tools(params=PaginatedRequestParams(cursor=cursor) if cursor else None)
                    tools.extend(page.tools)
                    cursor = page.next_cursor
                    if not cursor:
                        break
                self.session = session
                if not self.ready.done():
                    self.ready.set_result(tools)
                await self.stop.wait()
        except BaseException as exc:  # anyio wraps failures in groups; report the first cause
            if not self.ready.done():
                self.ready.set_exception(exc if isinstance(exc, Exception) else RuntimeError(repr(exc)))
            if isinstance(exc, asyncio.CancelledError):
                raise
        finally:
            self.session = None

    async def call(self, name: str, arguments: dict[str, Any]) -> str:
        if self.session is None:
            return f"Error: MCP server {self.spec.name} is not connected."
        result = await self.session.call_tool(name, arguments, read_timeout_seconds=self.spec.timeout_s)
        return _text_of(result)


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
        loop = asyncio.get_running_loop()
        server.ready, server.stop = loop.create_future(), asyncio.Event()
        server.task = loop.create_task(server.run(), name=f"mcp:{spec.name}")
        try:
            found = await asyncio.wait_for(asyncio.shield(server.ready), timeout_s)
        except Exception as exc:
            server.task.cancel()
            while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
                exc = exc.exceptions[0]  # anyio task groups wrap the real cause
            detail = f"no answer within {timeout_s:g} s" if isinstance(exc, TimeoutError) \
                else f"{type(exc).__name__}: {exc}"
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
        for server in self._servers.values():
            if server.stop is not None:
                server.stop.set()
        tasks = [s.task for s in self._servers.values() if s.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=5)
        self._servers.clear()
