"""The model client: an OpenAI-compatible chat-completions endpoint through the ``openai`` SDK.

Synchronous on purpose: turns run on worker threads (DESIGN §2), one blocking call per step.
"""

from __future__ import annotations

import itertools
import json
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx2  # the openai SDK's HTTP client (its dependency)
import openai
import orjson
from openai.types.chat import ChatCompletion

from agent.model_errors import ModelError, from_api_error
from agent.model_http import StreamingEndpoint
from agent.streaming import StreamAccumulator, ends_reply, new_call_id

__all__ = ["ChatModel", "ModelError", "ModelReply", "OnText", "OpenAIChatModel", "Usage"]

HTTP_CLIENTS = ("auto", "curl", "httpx")
"""``http_client`` values: the streamed call on libcurl (``agent.model_curl``, where ``pycurl``
imports, for ``auto``) or on the SDK's own HTTP client (httpx, ``agent.model_http``)."""


def curl_available() -> bool:
    """Whether ``pycurl`` (libcurl) can be imported here."""
    try:
        import pycurl  # noqa: F401
    except ImportError:
        return False
    return True


def uses_curl(http_client: str) -> bool:
    """Whether ``http_client`` (one of ``HTTP_CLIENTS``) sends the streamed call on libcurl.
    Raises ``ValueError`` for an unknown value, or ``curl`` where ``pycurl`` cannot be imported."""
    if http_client not in HTTP_CLIENTS:
        raise ValueError(f"http_client must be one of {', '.join(HTTP_CLIENTS)}, not {http_client!r}")
    if http_client == "curl" and not curl_available():
        raise ValueError("http_client = 'curl' needs pycurl (libcurl), which cannot be imported here; "
                         "install it or use 'auto' or 'httpx'")
    return http_client == "curl" or (http_client == "auto" and curl_available())


_AUTH: Any = {"security": {"bearer_auth": True}}

CLIENT_SHARDS = 8
"""Clients (connection pools) per model client; threads use them in turn (``OpenAIChatModel._client``).
Together they allow the SDK's defaults: 1,000 connections, 100 kept alive."""

_tls_lock = threading.Lock()
_tls: Any = None


def shared_tls_context() -> Any:
    """The ``ssl.SSLContext`` every model client's connection pools verify with, built on first
    use exactly as ``httpx2.Client`` builds its default (``httpx2.create_ssl_context()``: the
    system's CA file and path, or ``SSL_CERT_FILE``/``SSL_CERT_DIR`` when set) and shared.

    Each client built with the default ``verify=True`` loads the CA bundle anew: about 20 ms of CPU
    (parsing some 150 certificates) per client, so the ``CLIENT_SHARDS`` pools of one model cost
    160 ms in the first turns after a start, under the interpreter lock. An ``SSLContext`` is safe
    to share between threads and connections (CPython ``ssl``: its settings are read per handshake).

    Raises ``ValueError`` naming where the certificates were looked for when they cannot be loaded
    (``SSL_CERT_FILE`` naming no file, an unreadable bundle)."""
    global _tls
    if _tls is None:
        with _tls_lock:
            if _tls is None:
                try:
                    _tls = httpx2.create_ssl_context()
                except OSError as exc:  # ssl.SSLError is one too
                    raise ValueError(f"the CA certificates that verify the model endpoint could not be loaded "
                                     f"from {_ca_source()}: {exc.strerror or exc}") from exc
    return _tls


def _ca_source() -> str:
    for name in ("SSL_CERT_FILE", "SSL_CERT_DIR"):
        if value := os.environ.get(name):
            return f"{name}={value}"
    return "the system's CA bundle"


OnText = Callable[[str], None]
"""Called during a streamed model call with the step's text so far (not just the delta)."""


@dataclass(frozen=True)
class Usage:
    """Token counts of one model call (``cached_tokens`` = prompt tokens served from cache;
    ``estimated``: the server reported none, so they were estimated with ``agent.tokens``)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    estimated: bool = False


@dataclass(frozen=True)
class ModelReply:
    """One assistant message: ``content`` and/or ``tool_calls`` (OpenAI wire shape). ``provider`` and
    ``model`` name who answered when a router chose (``agent.routing``; ``None`` otherwise)."""

    content: str | None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str = "stop"
    usage: Usage = field(default_factory=Usage)
    provider: str | None = None
    model: str | None = None


class ChatModel(Protocol):
    """What the loop needs from a model. ``model`` names it (price lookup, agent cache)."""

    model: str

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                 on_text: OnText | None = None) -> ModelReply: ...


class OpenAIChatModel:
    """Chat completions with tools against ``base_url`` (OpenAI or any compatible server).

    With ``stream=True`` (the default) every call streams (``stream_options.include_usage``):
    the text so far goes to ``on_text`` after each text delta (when the next chunk arrives and
    does not end the reply: the complete reply is never told to it) and tool-call deltas are merged by ``id``, then
    ``index`` (``agent.streaming``). ``stream=False`` is for servers without streaming support;
    ``stream_options=False`` for servers that refuse ``stream_options`` (usage then comes only if
    the server sends it unasked). ``http_client`` (``HTTP_CLIENTS``): what carries a streamed call:
    libcurl (``agent.model_curl``; ``auto`` where ``pycurl`` imports) or the SDK's httpx client;
    ``ValueError`` for ``curl`` without ``pycurl``.

    ``missing_key`` names the environment variable that should hold the API key when it is unset
    (the call goes out with a placeholder key, so servers that need none still work): every
    ``ModelError`` then ends its ``user_message`` with what to set. The key itself is never put
    in a message.
    """

    def __init__(
        self,
        *,
        base_url: str,
        api_key: str,
        model: str,
        timeout_s: float = 120.0,
        max_retries: int = 2,
        temperature: float | None = None,
        stream: bool = True,
        missing_key: str | None = None,
        stream_options: bool = True,
        http_client: str = "auto",
    ) -> None:
        self.model = model
        self.curl = uses_curl(http_client)
        self.missing_key = missing_key
        self.temperature = temperature
        self.stream = stream
        self.stream_options = stream_options
        self._connect: dict[str, Any] = {"base_url": base_url, "api_key": api_key, "timeout": timeout_s,
                                         "max_retries": max_retries}
        self._shards: list[tuple[openai.OpenAI, Any] | None] = [None] * CLIENT_SHARDS
        self._shard_lock = threading.Lock()
        self._curl_endpoint: Any = None
        self._next_shard = itertools.count()
        self._local = threading.local()
        self._verify = shared_tls_context()  # at construction (start-up), not in the first turn

    @property
    def _client(self) -> openai.OpenAI:
        """The calling thread's SDK client (``_shard``)."""
        return self._shard[0]

    @property
    def _shard(self) -> tuple[openai.OpenAI, Any]:
        """The calling thread's client and its streaming endpoint: one of ``CLIENT_SHARDS``,
        assigned to threads in turn.

        The SDK's connection pool (httpx) probes the socket of every idle keep-alive connection
        on each request and again on each response; after a burst one client holds up to 100 of
        them, which cost more CPU than the call itself. Shards split the pool: each holds a share of
        the connections (and keeps a share of the idle ones), so a request scans a few."""
        index = getattr(self._local, "shard", None)
        if index is None:
            index = self._local.shard = next(self._next_shard) % CLIENT_SHARDS
        shard = self._shards[index]
        if shard is None:
            with self._shard_lock:
                shard = self._shards[index]
                if shard is None:
                    limits = httpx2.Limits(max_connections=1000 // CLIENT_SHARDS,
                                          max_keepalive_connections=-(-100 // CLIENT_SHARDS))
                    http = openai.DefaultHttpxClient(limits=limits, verify=self._verify)
                    client = openai.OpenAI(**self._connect, http_client=http)
                    shard = self._shards[index] = (client, self._endpoint(client, http))
        return shard

    def _endpoint(self, client: openai.OpenAI, http: httpx2.Client) -> Any:
        """The streamed call's endpoint for ``client`` (called under ``_shard_lock``): a
        ``StreamingEndpoint`` per shard, or one ``CurlEndpoint`` for every shard (its transfers
        are a pool of their own: a pool per shard would keep eight times the idle ones)."""
        if not self.curl:
            return StreamingEndpoint(client, http)
        if self._curl_endpoint is None:
            from agent.model_curl import CurlEndpoint

            self._curl_endpoint = CurlEndpoint(client, http)
        return self._curl_endpoint

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                 on_text: OnText | None = None) -> ModelReply:
        """One model call. Raises ``ModelError`` when the endpoint fails (also mid-stream)."""
        try:
            return self._complete(messages, tools, on_text)
        except ModelError as exc:
            if self.missing_key:
                exc.user_message += (f" No model API key is set: put it in the environment variable "
                                     f"{self.missing_key} (llm.api_key_env) and restart the gateway.")
            raise

    def _complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                  on_text: OnText | None) -> ModelReply:
        kwargs: dict[str, Any] = {"model": self.model, "messages": messages}
        if tools:
            kwargs["tools"] = tools
        if self.temperature is not None:
            kwargs["temperature"] = self.temperature
        try:
            if self.stream:
                return self._streamed(kwargs, on_text)
            # The client's typed ``create`` walks every message through its TypedDict transform
            # (milliseconds per call, growing with the history); our messages are already wire
            # JSON, so they are posted as they are, keeping the client's auth, retries and errors.
            return self._whole(self._client.post("/chat/completions", content=request_json(kwargs),
                                                 cast_to=ChatCompletion, options=_AUTH))
        except openai.APIError as exc:  # status, connection, timeout, a stream that broke off
            raise from_api_error(exc) from exc  # agent.model_errors: its reason decides failover

    def _streamed(self, kwargs: dict[str, Any], on_text: OnText | None) -> ModelReply:
        acc = StreamAccumulator()
        body = {**kwargs, "stream": True, "stream_options": {"include_usage": True}} if self.stream_options \
            else {**kwargs, "stream": True}
        # A text delta is told to ``on_text`` when the next chunk arrives, and only if that chunk
        # does not end the reply: the whole reply is never shown as a preview of itself (a thread
        # that read its stream late would start a preview of a finished reply, then edit it).
        held = False
        for chunk in self._shard[1].events(request_json(body)):
            if not isinstance(chunk, dict):
                continue
            if held and not ends_reply(chunk):
                on_text(acc.text)  # type: ignore[misc]  # the text so far, appended to (StreamAccumulator.text)
            held = acc.add(chunk) is not None and on_text is not None
        return ModelReply(acc.text or None, acc.tool_calls(), acc.finish_reason or "stop", _usage(acc.usage))

    @staticmethod
    def _whole(response: Any) -> ModelReply:
        """The reply of a call that was not streamed. Every call gets an id of its own: one sent
        without an id, or with the id of an earlier call of the reply (some models give parallel
        calls one id; the API refuses two results for one ``tool_call_id``), gets a ``call_`` id.

        Arguments sent as a JSON object (some servers) are sent on as its text; a ``refusal`` with no
        content is the reply's text (OpenAI: ``message.refusal``), not "(no answer)".

        Raises ``ModelError`` (reason ``stream``: the provider's fault, the route fails over) for a
        200 answer without a choice (a proxy's ``{"error": ...}``, empty ``choices``), or with a tool
        call without a name or whose arguments are not text (stored, it would make every later
        request of the session invalid)."""
        choices = getattr(response, "choices", None)
        if not isinstance(choices, list) or not choices or getattr(choices[0], "message", None) is None:
            error = getattr(response, "error", None)
            detail = error.get("message") if isinstance(error, dict) else None
            raise ModelError(f"model endpoint answered 200 without a completion: {detail or 'no choices'}",
                             "The model's answer broke off; try again.", reason="stream")
        choice = choices[0]
        message = choice.message
        tool_calls: list[dict[str, Any]] = []
        for call in message.tool_calls or []:
            function = getattr(call, "function", None)
            if function is None:
                continue
            fields = function if isinstance(function, dict) else {"name": getattr(function, "name", None),
                                                                   "arguments": getattr(function, "arguments", None)}
            name, arguments = fields.get("name"), fields.get("arguments")
            if isinstance(arguments, dict):
                arguments = json.dumps(arguments, ensure_ascii=False)
            if not isinstance(name, str) or not name or not isinstance(arguments, (str, type(None))):
                raise ModelError("model endpoint answered a tool call without a name or with arguments that are "
                                 "not text", "The model's answer broke off; try again.", reason="stream")
            call_id = getattr(call, "id", None)
            taken = call_id and any(call_id == earlier["id"] for earlier in tool_calls)
            tool_calls.append({"id": call_id if call_id and not taken else new_call_id(), "type": "function",
                               "function": {"name": name, "arguments": arguments or ""}})
        usage = _usage(response.usage.model_dump() if response.usage is not None else None)
        content = message.content
        refusal = getattr(message, "refusal", None)
        if not content and isinstance(refusal, str) and refusal:
            content = refusal
        return ModelReply(content, tool_calls, choice.finish_reason or "stop", usage)


def request_json(body: dict[str, Any]) -> bytes:
    """The request body as compact UTF-8 JSON bytes (the SDK posts bytes as they are): orjson, or the
    standard library's encoder with the same output where orjson refuses a value (a lone surrogate,
    an integer beyond 64 bits), so a session's system + tools prefix stays byte-identical."""
    try:
        return orjson.dumps(body)
    except TypeError:
        text = json.dumps(body, ensure_ascii=False, separators=(",", ":"))
        return text.encode("utf-8", "backslashreplace")  # a lone surrogate becomes its JSON escape


def _usage(raw: dict[str, Any] | None) -> Usage:
    if not raw:
        return Usage()
    details = raw.get("prompt_tokens_details") or {}
    return Usage(prompt_tokens=raw.get("prompt_tokens") or 0, completion_tokens=raw.get("completion_tokens") or 0,
                 cached_tokens=details.get("cached_tokens") or 0)
