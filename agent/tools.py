"""Tool contract and registry (DESIGN §7, first part).

A tool is a name, a description, a JSON-schema for its arguments and a function. Async tools
run on the AsyncBridge. ``ToolRegistry.schemas()`` renders the OpenAI ``tools`` list in a stable
order so the request prefix stays byte-identical across turns (prompt cache).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Tool:
    """One tool the model may call.

    Attributes:
        name: ``^[a-zA-Z0-9_-]{1,64}$`` (OpenAI function name rules).
        description: what it is for and when not to use it (the model reads this).
        parameters: JSON schema (``type: object``) of the arguments.
        fn: called with the parsed arguments as keyword arguments; returns a string (or
            something ``str()``-able). Async functions return a coroutine and run on the bridge.
        is_async: ``fn`` is a coroutine function.
        timeout_s: limit for one call; ``None`` uses the agent's default.
        side_effect: ``none`` | ``read`` | ``write`` | ``external``.
        idempotent: running it twice with the same arguments does no harm; a call interrupted by
            a crash is then run again on resume (otherwise it is answered as interrupted), and a
            timed-out call may be retried.
        retries: extra attempts after ``agent.errors.ToolRetry``; ``None`` uses the agent's default.
        takes_context: ``fn`` is called as ``fn(ctx, **args)`` with the per-call
            ``agent.context.RunContext`` (session id, budget, model, bridge); the model never sees it.
        reserves_budget: the tool runs a sub-agent: each call gets an iteration reservation from
            the task's wallet in ``ctx.reservation`` (``None`` when refused), closed after the call.
    """

    name: str
    description: str
    parameters: dict[str, Any]
    fn: Callable[..., Any]
    is_async: bool = False
    timeout_s: float | None = None
    side_effect: str = "read"
    idempotent: bool = False
    retries: int | None = None
    takes_context: bool = False
    reserves_budget: bool = False

    def schema(self) -> dict[str, Any]:
        """The tool's entry in the chat-completions ``tools`` list."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


@dataclass
class ToolRegistry:
    """Tools by name. Rendering is cached and ordered by name (stable bytes for prompt caching)."""

    tools: dict[str, Tool] = field(default_factory=dict)
    _rendered: list[dict[str, Any]] | None = None
    _subsets: dict[frozenset[str], ToolRegistry] = field(default_factory=dict)

    def add(self, tool: Tool) -> None:
        """Registers ``tool``. Raises ``ValueError`` for a name already registered."""
        if tool.name in self.tools:
            raise ValueError(f"tool {tool.name!r} registered twice")
        self.tools[tool.name] = tool
        self._rendered = None
        self._subsets.clear()

    def subset(self, names: Iterable[str]) -> ToolRegistry:
        """The registry of the named tools that exist here (unknown names are ignored); cached per
        name set, so a toolset mounted again renders the same schema bytes."""
        key = frozenset(name for name in names if name in self.tools)
        if key not in self._subsets:
            self._subsets[key] = ToolRegistry({name: self.tools[name] for name in sorted(key)})
        return self._subsets[key]

    def get(self, name: str) -> Tool | None:
        return self.tools.get(name)

    def schemas(self) -> list[dict[str, Any]]:
        """The OpenAI ``tools`` list, ordered by name (rendered once)."""
        if self._rendered is None:
            self._rendered = [self.tools[name].schema() for name in sorted(self.tools)]
        return self._rendered

    def signature(self) -> str:
        """A stable string identifying the rendered tool set (for agent caching)."""
        return json.dumps(self.schemas(), sort_keys=True, separators=(",", ":"))
