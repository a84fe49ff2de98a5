"""The model client: an OpenAI-compatible chat-completions endpoint through the ``openai`` SDK.

Synchronous on purpose: turns run on worker threads (DESIGN §2), one blocking call per step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import openai
from openai.types.chat import ChatCompletion


class ModelError(Exception):
    """The model endpoint failed after the client's retries (network, auth, 4xx/5xx).

    ``user_message`` is a plain-words explanation safe to show in the chat (no secrets).
    """

    def __init__(self, message: str, user_message: str) -> None:
        super().__init__(message)
        self.user_message = user_message


@dataclass(frozen=True)
class Usage:
    """Token counts of one model call (``cached_tokens`` = prompt tokens served from cache)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0


@dataclass(frozen=True)
class ModelReply:
    """One assistant message: ``content`` and/or ``tool_calls`` (OpenAI wire shape)."""

    content: str | None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str = "stop"
    usage: Usage = field(default_factory=Usage)


class ChatModel(Protocol):
    """What the loop needs from a model."""

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> ModelReply: ...


class OpenAIChatModel:
    """Chat completions with tools against ``base_url`` (OpenAI or any compatible server)."""

    def __init__(
        self,
        *,
        base_url: str,
        api_key: str,
        model: str,
        timeout_s: float = 120.0,
        max_retries: int = 2,
        temperature: float | None = None,
    ) -> None:
        self.model = model
        self.temperature = temperature
        self._client = openai.OpenAI(base_url=base_url, api_key=api_key, timeout=timeout_s, max_retries=max_retries)

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> ModelReply:
        """One model call. Raises ``ModelError`` when the endpoint fails."""
        kwargs: dict[str, Any] = {"model": self.model, "messages": messages}
        if tools:
            kwargs["tools"] = tools
        if self.temperature is not None:
            kwargs["temperature"] = self.temperature
        try:
            # The client's typed ``create`` walks every message through its TypedDict transform
            # (milliseconds per call, growing with the history); our messages are already wire
            # JSON, so post them as they are and keep the client's auth, retries and errors.
            response = self._client.post("/chat/completions", body=kwargs, cast_to=ChatCompletion,
                                         options={"security": {"bearer_auth": True}})
        except openai.APIConnectionError as exc:
            raise ModelError(f"model endpoint unreachable: {exc}",
                             "The model is unreachable right now.") from exc
        except openai.AuthenticationError as exc:
            raise ModelError(f"model endpoint rejected the API key: {exc.status_code}",
                             "The model rejected the gateway's credentials.") from exc
        except openai.RateLimitError as exc:
            raise ModelError(f"model rate limited: {exc.status_code}",
                             "The model is rate limited; try again shortly.") from exc
        except openai.APIStatusError as exc:
            raise ModelError(f"model endpoint error {exc.status_code}: {exc.message}",
                             f"The model returned an error ({exc.status_code}).") from exc
        choice = response.choices[0]
        message = choice.message
        tool_calls = [
            {"id": call.id, "type": "function",
             "function": {"name": call.function.name, "arguments": call.function.arguments}}
            for call in (message.tool_calls or [])
            if getattr(call, "function", None) is not None
        ]
        usage = Usage()
        if response.usage is not None:
            details = getattr(response.usage, "prompt_tokens_details", None)
            usage = Usage(
                prompt_tokens=response.usage.prompt_tokens or 0,
                completion_tokens=response.usage.completion_tokens or 0,
                cached_tokens=(getattr(details, "cached_tokens", 0) or 0) if details else 0,
            )
        return ModelReply(message.content, tool_calls, choice.finish_reason or "stop", usage)
