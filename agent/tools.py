"""Tool contract and registry (DESIGN §7, first part).

A tool is a name, a description, a JSON-schema for its arguments and a function. Async tools
run on the AsyncBridge. ``ToolRegistry.schemas()`` renders the OpenAI ``tools`` list in a stable
order so the request prefix stays byte-identical across turns (prompt cache).
"""

from __future__ import annotations

import json
from collections.abc import Callable
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
            a crash is then run again on resume (otherwise it is answered as interrupted).
    """

    name: str
    description: str
    parameters: dict[str, Any]
    fn: Callable[..., Any]
    is_async: bool = False
    timeout_s: float | None = None
    side_effect: str = "read"
    idempotent: bool = False

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

    def add(self, tool: Tool) -> None:
        if tool.name in self.tools:
            raise ValueError(f"tool {tool.name!r} registered twice")
        self.tools[tool.name] = tool
        self._rendered = None

    def get(self, name: str) -> Tool | None:
        return self.tools.get(name)

    def schemas(self) -> list[dict[str, Any]]:
        if self._rendered is None:
            self._rendered = [self.tools[name].schema() for name in sorted(self.tools)]
        return self._rendered

    def signature(self) -> str:
        """A stable string identifying the rendered tool set (for agent caching)."""
        return json.dumps(self.schemas(), sort_keys=True, separators=(",", ":"))
