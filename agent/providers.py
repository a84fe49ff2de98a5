"""Model providers: an OpenAI-compatible endpoint, its key, the models it serves, what it lacks.

A *target* is one model at one provider (``provider:model``); a route (``agent.routing``) is a
primary target and its fallbacks. Every target speaks Chat Completions; what differs between
servers is handled here, per target, on the request (``adapt_messages``) and in the client
(``OpenAIChatModel(stream=..., stream_options=...)``):

- ``stream``: the call is not streamed (no preview while it writes);
- ``stream_options``: no ``stream_options`` in the request; usage is estimated when the server
  sends none;
- ``parallel_tool_calls``: an assistant message with several tool calls (made by a model that
  can) is sent as one call per message, each followed by its result;
- ``vision``: image parts are replaced by a text note saying an image was there.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from agent.budget import Price

Capability = Literal["stream", "stream_options", "parallel_tool_calls", "vision"]
CAPABILITIES: tuple[str, ...] = ("stream", "stream_options", "parallel_tool_calls", "vision")

IMAGE_NOTE = "[An image was attached here; this model cannot see images, so it was left out.]"
"""What a model without vision reads in place of each image part."""


@dataclass(frozen=True)
class ModelInfo:
    """One model a provider serves. ``context_window_tokens``: prompt + reply (``None``: unknown,
    the gateway's default applies); ``price``: USD per 1M tokens (``None``: the price table by model
    name); ``lacks``: capabilities this model lacks beyond its provider's."""

    context_window_tokens: int | None = None
    price: Price | None = None
    lacks: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Provider:
    """An OpenAI-compatible endpoint.

    Attributes:
        name: the configured name (``openai``, ``local``): metrics, traces, transcript meta, logs.
        base_url: the API root (``https://api.openai.com/v1``).
        api_key: the key sent as ``Authorization: Bearer``; never in ``repr``, logs or traces.
        key_env: the environment variable the key comes from (``None``: the server needs none).
        key_missing: ``key_env`` is set but the variable is empty (a placeholder key is sent).
        models: the models it serves by name; empty: any model name is accepted.
        lacks: capabilities it lacks (``CAPABILITIES``; module doc).
        max_concurrency: most calls in flight to it at once (``None``: no limit); more wait.
        timeout_s: per-call timeout (``None``: the gateway's ``llm.timeout_s``).
        context_window_tokens: the window of a model it does not list (``None``: unknown).
    """

    name: str
    base_url: str
    api_key: str = field(repr=False)
    key_env: str | None = None
    key_missing: bool = False
    models: Mapping[str, ModelInfo] = field(default_factory=dict)
    lacks: frozenset[str] = frozenset()
    max_concurrency: int | None = None
    timeout_s: float | None = None
    context_window_tokens: int | None = None

    def info(self, model: str) -> ModelInfo:
        """The model's facts (for a model it does not list: only ``context_window_tokens``)."""
        return self.models.get(model) or ModelInfo(self.context_window_tokens)


@dataclass(frozen=True)
class Target:
    """One model at one provider: an entry of a route."""

    provider: Provider
    model: str

    @property
    def name(self) -> str:
        """``provider:model`` (the form routes are written in)."""
        return f"{self.provider.name}:{self.model}"

    @property
    def info(self) -> ModelInfo:
        return self.provider.info(self.model)

    @property
    def lacks(self) -> frozenset[str]:
        """What this provider and model lack together."""
        return self.provider.lacks | self.info.lacks


def split_target(entry: str) -> tuple[str, str]:
    """``"local:qwen2.5:7b"`` -> ``("local", "qwen2.5:7b")`` (the provider is before the first colon;
    model names may hold colons, as Ollama's do). Raises ``ValueError`` without a provider or model."""
    provider, sep, model = entry.partition(":")
    if not sep or not provider or not model:
        raise ValueError(f"{entry!r} is not provider:model")
    return provider, model


def adapt_messages(messages: list[dict[str, Any]], lacks: frozenset[str]) -> list[dict[str, Any]]:
    """The request's messages as a target that lacks ``lacks`` can take them (module doc).

    Returns ``messages`` itself when nothing needs changing (the usual case: no copy), else a new
    list; the input is never modified (it is the transcript's projection, shared by every target).
    """
    out = messages
    if "vision" in lacks and any(_has_image(m) for m in messages):
        out = [_without_images(m) for m in out]
    if "parallel_tool_calls" in lacks and any(len(m.get("tool_calls") or ()) > 1 for m in out):
        out = _one_call_per_message(out)
    return out


def _has_image(message: dict[str, Any]) -> bool:
    content = message.get("content")
    return isinstance(content, list) and any(isinstance(p, dict) and p.get("type") == "image_url" for p in content)


def _without_images(message: dict[str, Any]) -> dict[str, Any]:
    if not _has_image(message):
        return message
    parts = [p if not (isinstance(p, dict) and p.get("type") == "image_url") else {"type": "text", "text": IMAGE_NOTE}
             for p in message["content"]]
    return {**message, "content": parts}


def _one_call_per_message(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each assistant message with N > 1 tool calls and its N results become N pairs
    ``assistant(call i)``, ``tool(result i)`` in call order (the text, if any, stays on the first)."""
    out: list[dict[str, Any]] = []
    index = 0
    while index < len(messages):
        message = messages[index]
        calls = message.get("tool_calls") or []
        if message.get("role") != "assistant" or len(calls) < 2:
            out.append(message)
            index += 1
            continue
        end = index + 1
        while end < len(messages) and messages[end].get("role") == "tool":
            end += 1
        results = {m.get("tool_call_id"): m for m in messages[index + 1:end]}
        for n, call in enumerate(calls):
            out.append({**message, "content": message.get("content") if n == 0 else None, "tool_calls": [call]})
            if call.get("id") in results:
                out.append(results.pop(call.get("id")))
        out.extend(results.values())  # results of no call of this message (repaired before sending)
        index = end
    return out
