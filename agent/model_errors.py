"""What a failed model call means: ``ModelError`` and its ``reason``, read from the ``openai`` client's
exceptions (status, error body, ``Retry-After``), so routing can tell a provider's fault from a
fault of the request.

Reasons, and whether the next model of a route is tried (``FAILOVER_REASONS``):

| reason | from | fails over |
|---|---|---|
| ``rate_limited`` | 429 | yes (the provider cools down for its ``Retry-After``) |
| ``server`` | 5xx, 409 | yes |
| ``timeout`` | the client's timeout, 408 | yes |
| ``connection`` | refused, reset, DNS, TLS | yes |
| ``stream`` | a streamed answer that broke off after text arrived (set by the router) | yes |
| ``auth`` | 401, 403 | yes (the provider is marked down) |
| ``not_found`` | 404 (the model is not served there) | yes |
| ``context_length`` | 400/413/422 saying the request is longer than the model's window | no: compress, retry once |
| ``invalid_tools`` | 400/422 about a tool definition (``param`` ``tools[...]``) | no: reported |
| ``request`` | any other 4xx: the request itself | no |
| ``unavailable`` | no model of the route could be asked (all cooling down, open or down) | - |
"""

from __future__ import annotations

import email.utils
import math
import re
import time
from collections.abc import Mapping
from typing import Any

import openai

FAILOVER_REASONS = frozenset({"rate_limited", "server", "timeout", "connection", "stream", "auth", "not_found"})
"""Failures of the provider, not of the request: the next model of the route is asked."""

_CONTEXT = re.compile(
    r"context[ _-]?(length|size|window)|maximum context|prompt is too long|too many (input )?tokens|"
    r"exceeds? the (maximum|max|available)|maximum number of tokens|reduce the length|input is too long",
    re.IGNORECASE)
"""Context-window refusals as servers word them: OpenAI and vLLM ("This model's maximum context
length is 8192 tokens"), Anthropic ("prompt is too long: 210000 tokens > 200000 maximum"), Gemini
("The input token count (N) exceeds the maximum number of tokens allowed (M)"), llama.cpp ("the
request exceeds the available context size")."""

_LIMIT = re.compile(
    r"maximum context length is (\d+)|> ?(\d+) maximum|tokens allowed \((\d+)\)|context size \((\d+)|"
    r"context (?:length|window) (?:of|is) (\d+)", re.IGNORECASE)
"""The window a context refusal names, when it names one."""

_TOOLS = re.compile(r"invalid schema for function|tools\[\d+\]|function_declarations|function\.parameters",
                    re.IGNORECASE)

MAX_RETRY_AFTER_S = 3600.0
"""A ``Retry-After`` is believed up to an hour (a longer one is taken as an hour)."""


class ModelError(Exception):
    """A model call failed (after the client's own retries): network, auth, 4xx/5xx, a broken stream.

    Attributes:
        user_message: plain words safe to show in the chat (no secrets, no provider internals).
        reason: what failed (module table); ``FAILOVER_REASONS`` move on to the next model.
        status: the HTTP status, when there was a response.
        retry_after: seconds the provider asked to wait (``Retry-After``/``retry-after-ms``), or ``None``.
        param: the request field the provider blamed (``tools[2].function.parameters``), or ``None``.
        provider, model: which configured provider and model failed (set by the router).
        limit_tokens: the context window a ``context_length`` refusal named, or ``None``.
        window_tokens: the refusing model's configured context window (set by the router), or ``None``.
    """

    def __init__(self, message: str, user_message: str, *, reason: str = "error", status: int | None = None,
                 retry_after: float | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.user_message = user_message
        self.reason = reason
        self.status = status
        self.retry_after = retry_after
        self.param = param
        self.provider: str | None = None
        self.model: str | None = None
        self.limit_tokens: int | None = None
        self.window_tokens: int | None = None

    @property
    def fails_over(self) -> bool:
        """The provider failed, not the request: another provider may answer."""
        return self.reason in FAILOVER_REASONS


def from_api_error(exc: openai.APIError) -> ModelError:
    """The ``ModelError`` for one exception of the ``openai`` client (its message never holds the key)."""
    if isinstance(exc, openai.APITimeoutError):
        return ModelError("model endpoint timed out", "The model did not answer in time; try again.",
                          reason="timeout")
    if isinstance(exc, openai.APIConnectionError):
        return ModelError(f"model endpoint unreachable: {exc}", "The model is unreachable right now.",
                          reason="connection")
    if isinstance(exc, openai.APIStatusError):
        return _status_error(exc)
    # An error event inside a stream (the connection itself was fine).
    return ModelError(f"model stream failed: {type(exc).__name__}: {exc}", "The model's answer broke off; try again.",
                      reason="stream")


def _status_error(exc: openai.APIStatusError) -> ModelError:
    status = exc.status_code
    message = str(exc.message or "")
    param = exc.param if isinstance(exc.param, str) else None
    code = exc.code if isinstance(exc.code, str) else ""
    if status in (401, 403):
        return ModelError(f"model endpoint rejected the API key: {status}",
                          "The model rejected the gateway's credentials.", reason="auth", status=status)
    if status == 429:
        return ModelError(f"model rate limited: {status}", "The model is rate limited; try again shortly.",
                          reason="rate_limited", status=status, retry_after=retry_after_s(exc.response.headers))
    if status >= 500 or status == 409:
        return ModelError(f"model endpoint error {status}: {message}", f"The model returned an error ({status}).",
                          reason="server", status=status, retry_after=retry_after_s(exc.response.headers))
    if status == 408:
        return ModelError(f"model endpoint timed out ({status})", "The model did not answer in time; try again.",
                          reason="timeout", status=status)
    if status == 404:
        return ModelError(f"model endpoint error {status}: {message}", f"The model returned an error ({status}).",
                          reason="not_found", status=status)
    reason = "request"
    if status in (400, 413, 422) and (code == "context_length_exceeded" or _CONTEXT.search(message)):
        reason = "context_length"
    elif status in (400, 422) and ((param or "").startswith("tools") or _TOOLS.search(message)):
        reason = "invalid_tools"
    error = ModelError(f"model endpoint error {status}: {message}", f"The model returned an error ({status}).",
                       reason=reason, status=status, param=param)
    if reason == "context_length":
        error.limit_tokens = named_limit(message)
    return error


def named_limit(message: str) -> int | None:
    """The context window (tokens) a context-length refusal names, or ``None``."""
    match = _LIMIT.search(message)
    if match is None:
        return None
    return int(next(group for group in match.groups() if group))


def retry_after_s(headers: Mapping[str, str] | Any, now: float | None = None) -> float | None:
    """Seconds to wait from ``retry-after-ms`` or ``retry-after`` (seconds or an HTTP date; RFC 9110
    §10.2.3), capped at ``MAX_RETRY_AFTER_S``; ``None`` when absent or unreadable."""
    if headers is None:
        return None
    for name, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        raw = headers.get(name)
        if raw is None:
            continue
        try:
            value = float(raw) / scale
        except ValueError:
            if name != "retry-after":
                continue
            try:
                when = email.utils.parsedate_to_datetime(raw)
            except (TypeError, ValueError):
                return None
            value = when.timestamp() - (time.time() if now is None else now)
        if math.isfinite(value):
            return min(max(0.0, value), MAX_RETRY_AFTER_S)
    return None
