"""Tool contract and registry (DESIGN §7).

A tool is a name, a description, a JSON-schema for its arguments and a function. ``tool(fn)``
builds one from a typed Python signature: a pydantic model of the parameters generates the schema
and validates every call before it runs (the executor answers a validation error to the model).
Async tools run on the AsyncBridge. ``ToolRegistry.schemas()`` renders the OpenAI ``tools`` list
in a stable order so the request prefix stays byte-identical across turns (prompt cache).
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model

NAME_RULE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
"""OpenAI (and most OpenAI-compatible APIs) function name rule."""
SideEffect = Literal["none", "read", "write", "external"]


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
        args_model: pydantic model of the arguments (built by ``tool()``); when set, arguments
            are validated (and coerced) with it before the call, and a failure goes to the model.
        needs_approval: ``True``/``False`` forces the approval decision; ``None`` leaves it to the
            approval policy (by ``side_effect``).
        trusted_output: the result is the host's own text (a skill's body written by the operator,
            the plan), not content from outside, so it is not wrapped as untrusted data.
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
    args_model: type[BaseModel] | None = None
    needs_approval: bool | None = None
    trusted_output: bool = False

    def __post_init__(self) -> None:
        if not NAME_RULE.match(self.name):
            raise ValueError(f"tool name {self.name!r} does not match {NAME_RULE.pattern}")

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


def _arg_docs(doc: str) -> tuple[str, dict[str, str]]:
    """Splits a Google-style docstring into ``(summary, {arg: description})``."""
    summary, args, current, in_args = [], {}, None, False
    for line in inspect.cleandoc(doc or "").splitlines():
        stripped = line.strip()
        if stripped in ("Args:", "Arguments:", "Parameters:"):
            in_args = True
            continue
        if in_args and stripped.endswith(":") and not line.startswith(" "):
            in_args = False  # "Returns:", "Raises:" ...
        if in_args:
            match = re.match(r"^\s{2,}(\w+)(?:\s*\([^)]*\))?:\s*(.*)$", line)
            if match and len(line) - len(line.lstrip()) <= 8:
                current = match.group(1)
                args[current] = match.group(2)
            elif current and stripped:
                args[current] += " " + stripped
        elif not args:
            summary.append(line)
    return "\n".join(summary).strip(), args


def _strip_titles(schema: Any) -> Any:
    """Drops pydantic's ``title`` keys (noise for the model; fewer prompt tokens)."""
    if isinstance(schema, dict):
        return {k: _strip_titles(v) for k, v in schema.items()
                if not (k == "title" and isinstance(v, str))}
    if isinstance(schema, list):
        return [_strip_titles(v) for v in schema]
    return schema


def args_model_for(fn: Callable[..., Any], name: str, skip_first: bool = False) -> tuple[type[BaseModel], str]:
    """A pydantic model of ``fn``'s keyword parameters and the docstring summary.

    Every parameter needs an annotation (``Annotated[int, Field(ge=1)]`` works); defaults make
    a parameter optional; descriptions come from the docstring's ``Args:`` section. Unknown
    arguments are rejected (``additionalProperties: false``).

    Raises:
        TypeError: a parameter has no annotation, or ``fn`` takes ``*args``/``**kwargs``.
    """
    summary, docs = _arg_docs(fn.__doc__ or "")
    hints = inspect.get_annotations(fn, eval_str=True)
    fields: dict[str, Any] = {}
    params = list(inspect.signature(fn).parameters.values())
    for param in params[1 if skip_first else 0:]:
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise TypeError(f"tool {name}: *args/**kwargs cannot be described to the model")
        if param.name not in hints:
            raise TypeError(f"tool {name}: parameter {param.name!r} needs a type annotation")
        default = ... if param.default is param.empty else param.default
        fields[param.name] = (hints[param.name], Field(default, description=docs.get(param.name)))
    model = create_model(f"{name}_args", __config__=ConfigDict(extra="forbid"), **fields)
    return model, summary


def tool(fn: Callable[..., Any] | None = None, *, name: str | None = None, description: str | None = None,
         timeout_s: float | None = None, side_effect: SideEffect = "read", idempotent: bool = False,
         retries: int | None = None, takes_context: bool = False, needs_approval: bool | None = None) -> Any:
    """Builds a ``Tool`` from a typed function (usable as ``@tool`` or ``@tool(side_effect=...)``).

    The schema is generated from the signature (``ctx`` first when ``takes_context``), the
    description from the docstring's summary unless given; async functions run on the bridge.

    Raises:
        TypeError: see ``args_model_for``; ``ValueError``: the name breaks ``NAME_RULE``.
    """
    def build(f: Callable[..., Any]) -> Tool:
        tool_name = name or f.__name__
        model, summary = args_model_for(f, tool_name, skip_first=takes_context)
        schema = _strip_titles(model.model_json_schema())
        schema.setdefault("properties", {})
        return Tool(name=tool_name, description=description or summary, parameters=schema, fn=f,
                    is_async=inspect.iscoroutinefunction(f), timeout_s=timeout_s, side_effect=side_effect,
                    idempotent=idempotent, retries=retries, takes_context=takes_context, args_model=model,
                    needs_approval=needs_approval)

    return build(fn) if fn is not None else build
