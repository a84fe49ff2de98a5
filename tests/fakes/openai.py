"""A wire-level fake of the OpenAI Chat Completions API, driven by the real ``openai`` client.

Usage::

    with FakeOpenAI(api_key="sk-test") as fake:
        fake.script(text("hi"), tool_calls(call("get_weather", {"city": "Oslo"})))
        client = openai.OpenAI(base_url=f"{fake.url}/v1", api_key="sk-test")

Scripted replies are consumed one per valid ``POST /v1/chat/completions`` request (FIFO); when the
queue is empty ``fake.responder(request_json)`` is asked, else ``text("(no scripted reply)")`` is sent.
Requests are validated the way the real API validates the message sequence (orphan tool messages,
unanswered ``tool_call_id``s, ...) *before* a scripted reply is consumed.

``POST /v1/audio/transcriptions`` (speech to text) is as strict as OpenAI's: multipart only, a
``model`` it knows, a ``file`` at most 25 MB whose name ends in a supported extension and whose
bytes are audio; answers come from ``script_transcription(...)`` (FIFO), else
``transcription_responder``, else ``NO_TRANSCRIPT``. Each upload is recorded in
``transcriptions``.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import email.parser
import email.policy
import hashlib
import json
import math
import re
import struct
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.fakes.server import ThreadedServer

NO_REPLY = "(no scripted reply)"
NO_TRANSCRIPT = "(no scripted transcript)"
TRANSCRIPTION_MODELS = ("whisper-1", "gpt-4o-mini-transcribe", "gpt-4o-transcribe")
TRANSCRIPTION_MAX_BYTES = 26_214_400
"""OpenAI: "File uploads are currently limited to 25 MB"; a larger body gets 413."""
AUDIO_FORMATS = ("flac", "m4a", "mp3", "mp4", "mpeg", "mpga", "oga", "ogg", "wav", "webm")
"""The extensions OpenAI's speech to text takes (from its "Invalid file format" message)."""
_RESPONSE_FORMATS = ("json", "text", "srt", "verbose_json", "vtt")
_TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]+$")
_ROLES = ("system", "assistant", "user", "function", "tool", "developer")
_CACHE_BLOCK_CHARS = 128 * 4  # the provider caches in 128-token blocks; 1 token ~ 4 chars here
_CACHE_MIN_TOKENS = 1024
_EMBED_STOPWORDS = frozenset({"the", "and", "what", "which", "who", "mine", "your", "you", "are", "was", "this",
                              "that", "with", "for", "have", "has", "does", "did"})


# --------------------------------------------------------------------------------------- replies


@dataclass(frozen=True)
class ReportedUsage:
    """Token figures a reply reports instead of the emulated ones (``usage(...)``)."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0


USAGE_SHAPES = ("final", "finish_and_final", "every_chunk")
"""Where a stream carries ``usage`` (only with ``stream_options.include_usage``): ``"final"``
(OpenAI: one extra chunk with empty ``choices`` after the finish chunk, ``usage: null`` on the
others), ``"finish_and_final"`` (the same figures also on the finish chunk, as some proxies send
them) or ``"every_chunk"`` (running totals on every chunk, the whole figures on the last two, as
vLLM's continuous usage stats do). A client that adds them up counts the call twice or more."""


@dataclass(frozen=True)
class TextReply:
    """An assistant text message: ``message.content = content``, ``finish_reason`` as given.

    Streamed, the content goes out in ``pieces`` deltas, ``piece_delay_s`` apart (a slow writer).
    """

    content: str
    finish_reason: str = "stop"
    pieces: int = 3
    piece_delay_s: float = 0.0
    usage: ReportedUsage | None = None
    usage_shape: str = "final"


@dataclass(frozen=True)
class ToolCall:
    """One ``tool_calls[i]`` entry; ``arguments`` is the raw JSON string sent on the wire."""

    name: str
    arguments: str
    id: str


@dataclass(frozen=True)
class ToolCallsReply:
    """An assistant message with ``tool_calls`` (parallel when several); ``finish_reason="tool_calls"``.

    Streamed with ``interleave``, the calls' argument pieces alternate between the calls (each
    delta tagged only by ``index``), the way OpenAI emits parallel calls. ``index_shape`` is how
    the calls are tagged on the stream: ``"distinct"`` (OpenAI: call *i* has ``index: i``),
    ``"shared"`` (vLLM and several proxies: every call has ``index: 0`` and its own id, one call
    after the other in consecutive chunks) or ``"one_chunk"`` (every call whole, ``index: 0``,
    all in a single chunk).
    """

    calls: tuple[ToolCall, ...]
    content: str | None = None
    interleave: bool = False
    index_shape: str = "distinct"
    usage: ReportedUsage | None = None
    usage_shape: str = "final"


@dataclass(frozen=True)
class ErrorReply:
    """An HTTP error: ``status`` with body ``{"error": {"message", "type", "param", "code"}}``."""

    status: int
    message: str
    type: str = "invalid_request_error"
    code: str | None = None
    param: str | None = None
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class DelayedReply:
    """``reply`` answered after ``await asyncio.sleep(seconds)`` on the server loop (non-blocking)."""

    seconds: float
    reply: Reply


@dataclass(frozen=True)
class HeldReply:
    """``reply`` answered once ``gate`` is set (from any thread): a model call that lasts exactly
    as long as the test wants, without blocking other requests."""

    gate: threading.Event
    reply: Reply


@dataclass(frozen=True)
class CutReply:
    """``reply`` whose connection is cut: streamed, after ``after_chunks`` SSE chunks (the role
    delta counts as one) the socket is closed without the chunked terminator or ``[DONE]`` (a
    provider or proxy dying mid-answer); not streamed, before any response is sent."""

    reply: TextReply | ToolCallsReply
    after_chunks: int = 3


@dataclass(frozen=True)
class RawReply:
    """A 200 answer whose body is ``body`` as it is, completion or not (a proxy that answers an
    upstream failure with ``{"error": ...}`` and status 200, a completion without ``choices``):
    not streamed, the JSON object; streamed, one ``data:`` event of it, then ``[DONE]``."""

    body: dict[str, Any]


Reply = TextReply | ToolCallsReply | ErrorReply | DelayedReply | HeldReply | CutReply | RawReply


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> ReportedUsage:
    """Figures for a reply to report (``prompt_tokens_details.cached_tokens`` = ``cached_tokens``)."""
    if not 0 <= cached_tokens <= prompt_tokens:
        raise ValueError("cached_tokens must be between 0 and prompt_tokens")
    return ReportedUsage(prompt_tokens, completion_tokens, cached_tokens)


def _check_usage_shape(shape: str) -> None:
    if shape not in USAGE_SHAPES:
        raise ValueError(f"unknown usage_shape {shape!r}; one of {USAGE_SHAPES}")


def text(content: str, finish_reason: str = "stop", *, pieces: int = 3, piece_delay_s: float = 0.0,
         usage: ReportedUsage | None = None, usage_shape: str = "final") -> TextReply:
    """A plain assistant reply (``finish_reason`` may be e.g. ``"length"`` to emulate truncation);
    ``pieces``/``piece_delay_s`` shape how it streams; ``usage`` fixes the reported token figures
    and ``usage_shape`` where a stream carries them (``USAGE_SHAPES``)."""
    _check_usage_shape(usage_shape)
    return TextReply(content, finish_reason, pieces, piece_delay_s, usage, usage_shape)


def call(name: str, arguments: dict[str, Any] | str, id: str | None = None) -> ToolCall:
    """One tool call. A dict is ``json.dumps``'d; a str goes out verbatim (so it may be invalid JSON).
    ``id`` defaults to a fresh ``call_<24 hex>`` fixed at construction, so tests can read ``.id``."""
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return ToolCall(name, args, id or f"call_{uuid.uuid4().hex[:24]}")


def tool_calls(*calls: ToolCall, content: str | None = None, interleave: bool = False,
               index_shape: str = "distinct", usage: ReportedUsage | None = None,
               usage_shape: str = "final") -> ToolCallsReply:
    """An assistant message carrying ``calls`` (content null unless given; ``interleave`` and
    ``index_shape``: see ``ToolCallsReply``; ``usage`` and ``usage_shape``: see ``text``)."""
    _check_usage_shape(usage_shape)
    if not calls:
        raise ValueError("tool_calls() needs at least one call()")
    if index_shape not in ("distinct", "shared", "one_chunk"):
        raise ValueError(f"unknown index_shape {index_shape!r}")
    if interleave and index_shape != "distinct":
        raise ValueError("interleaved pieces need distinct indexes")
    return ToolCallsReply(tuple(calls), content, interleave, index_shape, usage, usage_shape)


def error(
    status: int,
    message: str,
    type: str = "invalid_request_error",
    code: str | None = None,
    headers: dict[str, str] | None = None,
    param: str | None = None,
) -> ErrorReply:
    """An error response, e.g. ``error(429, "Rate limit reached", "requests", "rate_limit_exceeded",
    headers={"retry-after": "0"})`` or ``error(500, "The server had an error", "server_error")``."""
    return ErrorReply(status, message, type, code, param, dict(headers or {}))


def raw(body: dict[str, Any]) -> RawReply:
    """A 200 answer with ``body`` as it is (``RawReply``)."""
    return RawReply(dict(body))


def delay(seconds: float, reply: Reply | str) -> DelayedReply:
    """Wraps ``reply`` so the server waits ``seconds`` (without blocking other requests) first."""
    return DelayedReply(seconds, _coerce(reply))


def hold(gate: threading.Event, reply: Reply | str) -> HeldReply:
    """Wraps ``reply`` so the server answers it only once ``gate`` is set."""
    return HeldReply(gate, _coerce(reply))


def cut(reply: TextReply | ToolCallsReply | str, after_chunks: int = 3) -> CutReply:
    """Wraps ``reply`` so its connection breaks after ``after_chunks`` chunks (``CutReply``)."""
    inner = _coerce(reply)
    if not isinstance(inner, TextReply | ToolCallsReply):
        raise ValueError("cut() takes a text or tool_calls reply")
    return CutReply(inner, after_chunks)


def _coerce(reply: Reply | str) -> Reply:
    return text(reply) if isinstance(reply, str) else reply


# ------------------------------------------------------------------------------------ validation


class _Invalid(Exception):
    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.reply = ErrorReply(400, message, "invalid_request_error", code, param)


def _missing(name: str) -> _Invalid:
    return _Invalid(f"Missing required parameter: '{name}'.", name, "missing_required_parameter")


def validate_chat_request(body: Any) -> None:
    """Raises ``_Invalid`` (a 400) where the real API rejects a chat completions request.

    Emulated rules: ``model`` and a non-empty ``messages`` array are required; every message has a
    valid ``role``; an assistant ``tool_calls`` array is non-empty and must be followed immediately by
    consecutive tool messages answering each of its ids; a tool message must answer a call of that
    assistant message, and only once (``Duplicate value for 'tool_call_id'``); each of those
    calls has a non-empty ``id`` (a missing, null or empty one
    is answered ``Missing required parameter: 'messages[2].tool_calls[1].id'.``), a ``type``, a
    ``function.name`` and ``function.arguments``; an assistant message without ``tool_calls`` has
    string ``content`` (a null one: ``Invalid value for 'content': expected a string, got null.``);
    tools need ``type: "function"`` and a ``function.name`` matching ``^[a-zA-Z0-9_-]{1,64}$``;
    ``stream_options`` only with ``stream: true``.
    """
    if not isinstance(body, dict):
        raise _Invalid("We could not parse the JSON body of your request.")
    if not body.get("model"):
        raise _Invalid("you must provide a model parameter")
    messages = body.get("messages")
    if messages is None:
        raise _missing("messages")
    if not isinstance(messages, list):
        raise _Invalid("Invalid type for 'messages': expected an array.", "messages", "invalid_type")
    if not messages:
        raise _Invalid(
            "Invalid 'messages': empty array. Expected an array with minimum length 1, "
            "but got an empty array instead.", "messages", "empty_array")
    for i, tool in enumerate(body.get("tools") or []):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or "type" not in tool:
            raise _missing(f"tools[{i}].type")
        if tool["type"] != "function":
            raise _Invalid(f"Invalid value: '{tool['type']}'. Supported values are: 'function'.",
                           f"tools[{i}].type", "invalid_value")
        if not isinstance(fn, dict) or not fn.get("name"):
            raise _missing(f"tools[{i}].function.name")
        name, param = str(fn["name"]), f"tools[{i}].function.name"
        if len(name) > 64:
            raise _Invalid(f"Invalid '{param}': string too long. Expected a string with maximum length "
                           f"64, but got a string with length {len(name)} instead.",
                           param, "string_above_max_length")
        if not _TOOL_NAME.match(name):
            raise _Invalid(f"Invalid '{param}': string does not match pattern. Expected a string that "
                           "matches the pattern '^[a-zA-Z0-9_-]+$'.", param, "invalid_value")
    if body.get("stream_options") is not None and not body.get("stream"):
        raise _Invalid("The 'stream_options' parameter is only allowed when 'stream' is enabled.",
                       "stream_options")
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or "role" not in msg:
            raise _missing(f"messages[{i}].role")
        if msg["role"] not in _ROLES:
            raise _Invalid(f"Invalid value: '{msg['role']}'. Supported values are: 'system', 'assistant', "
                           "'user', 'function', 'tool', and 'developer'.", f"messages[{i}].role",
                           "invalid_value")
        if msg["role"] == "assistant" and msg.get("tool_calls") == []:
            raise _Invalid(f"Invalid 'messages[{i}].tool_calls': empty array. Expected an array with "
                           "minimum length 1, but got an empty array instead.",
                           f"messages[{i}].tool_calls", "empty_array")
        if msg["role"] == "assistant" and msg.get("tool_calls"):
            _validate_tool_calls(i, msg["tool_calls"])
        elif msg["role"] == "assistant" and msg.get("content") is None:  # content may be null only beside tool_calls
            if "content" not in msg:
                raise _missing(f"messages[{i}].content")
            raise _Invalid("Invalid value for 'content': expected a string, got null.", f"messages.[{i}].content")
        if isinstance(msg.get("content"), list):
            _validate_content_parts(i, msg["role"], msg["content"])
    _validate_tool_sequence(messages)


IMAGE_FORMATS = {"image/png": b"\x89PNG\r\n\x1a\n", "image/jpeg": b"\xff\xd8\xff", "image/gif": b"GIF8",
                 "image/webp": b"RIFF"}
MAX_IMAGE_BYTES = 20 * 1024 * 1024
MAX_REQUEST_BYTES = 50 * 1024 * 1024
"""Largest request body taken (OpenAI: images up to 50 MB in total per request); larger ones get 413."""
"""OpenAI "Images and vision": PNG, JPEG, WEBP, non-animated GIF; up to 20 MB per image."""
_DATA_URL = re.compile(r"data:([^;,]*);base64,(.*)", re.DOTALL)


def _validate_content_parts(i: int, role: str, parts: list[Any]) -> None:
    """Content parts as the real API checks them: ``text`` parts carry a string ``text``;
    ``image_url`` parts only in user messages, with ``image_url.url`` an http(s) URL or a base64
    data URL of a supported image type whose bytes are that type, at most 20 MB, and ``detail`` in
    ``auto``/``low``/``high``."""
    if not parts:
        raise _Invalid(f"Invalid 'messages[{i}].content': empty array. Expected an array with minimum length 1, "
                       "but got an empty array instead.", f"messages[{i}].content", "empty_array")
    for j, part in enumerate(parts):
        where = f"messages[{i}].content[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text":
            if not isinstance(part.get("text"), str):
                raise _missing(f"{where}.text")
            continue
        if kind != "image_url":
            raise _Invalid(f"Invalid value: '{kind}'. Supported values are: 'text', 'image_url', 'input_audio', "
                           "'refusal', 'audio', and 'file'.", f"{where}.type", "invalid_value")
        if role != "user":
            raise _Invalid(f"Invalid '{where}': Image URLs are only allowed for messages with role 'user', but "
                           f"this message with role '{role}' contains an image URL.", where, "invalid_value")
        image = part.get("image_url")
        url = image.get("url") if isinstance(image, dict) else None
        if not isinstance(url, str):
            raise _missing(f"{where}.image_url.url")
        if image.get("detail", "auto") not in ("auto", "low", "high"):
            raise _Invalid(f"Invalid value: '{image.get('detail')}'. Supported values are: 'auto', 'low', and 'high'.",
                           f"{where}.image_url.detail", "invalid_value")
        if url.startswith(("http://", "https://")):
            continue
        match = _DATA_URL.fullmatch(url)
        if match is None:
            raise _Invalid(f"Invalid '{where}.image_url.url'. Expected a base64-encoded data URL with an image MIME "
                           "type (e.g. 'data:image/png;base64,aW1nIGJ5dGVzIGhlcmU='), but got a value without the "
                           "'data:' prefix.", f"{where}.image_url.url", "invalid_value")
        mime, payload = match.group(1).lower(), match.group(2)
        try:
            data = base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            raise _Invalid(f"Invalid '{where}.image_url.url'. Expected a base64-encoded data URL with an image MIME "
                           "type, but got invalid base64 data.", f"{where}.image_url.url", "invalid_value") from None
        if mime not in IMAGE_FORMATS:
            raise _Invalid("You uploaded an unsupported image. Please make sure your image has of one the following "
                           "formats: ['png', 'jpeg', 'gif', 'webp'].", f"{where}.image_url.url",
                           "invalid_image_format")
        if len(data) > MAX_IMAGE_BYTES:
            raise _Invalid(f"Invalid '{where}.image_url.url': image exceeds the maximum size of 20 MB.",
                           f"{where}.image_url.url", "image_too_large")
        if not data.startswith(IMAGE_FORMATS[mime]) or (mime == "image/webp" and data[8:12] != b"WEBP"):
            raise _Invalid("The image data you provided does not represent a valid image. Please check your input "
                           "and try again with one of the supported image formats: ['image/jpeg', 'image/png', "
                           "'image/gif', 'image/webp'].", f"{where}.image_url.url", "invalid_image")


def _has_images(body: dict[str, Any]) -> bool:
    return any(isinstance(m.get("content"), list) and any(isinstance(p, dict) and p.get("type") == "image_url"
                                                          for p in m["content"]) for m in body["messages"])


IMAGE_TOKEN_CHARS = 765 * 4
"""An image counts 765 tokens in ``usage`` (OpenAI's tile formula for 1024 x 768 at high detail),
whatever the length of its base64 data URL."""


def _image_digests(message: dict[str, Any]) -> dict[str, Any]:
    """``message`` with each image URL replaced by its digest padded to ``IMAGE_TOKEN_CHARS`` (the
    emulated prompt cache still tells two images apart; usage counts images as tokens, not base64)."""
    content = message.get("content")
    if not isinstance(content, list):
        return message
    parts = []
    for part in content:
        if isinstance(part, dict) and part.get("type") == "image_url":
            url = str((part.get("image_url") or {}).get("url"))
            digest = hashlib.sha256(url.encode()).hexdigest()
            part = {"type": "image_url", "image": digest.ljust(IMAGE_TOKEN_CHARS, ".")}
        parts.append(part)
    return {**message, "content": parts}


def image_parts(request: dict[str, Any]) -> list[tuple[str, bytes]]:
    """``(mime type, bytes)`` of every data-URL image in a recorded request's messages, in order."""
    found = []
    for message in request["json"]["messages"]:
        for part in message.get("content") if isinstance(message.get("content"), list) else ():
            if part.get("type") == "image_url":
                match = _DATA_URL.fullmatch(part["image_url"]["url"])
                if match:
                    found.append((match.group(1), base64.b64decode(match.group(2))))
    return found


def _validate_tool_calls(i: int, calls: Any) -> None:
    if not isinstance(calls, list):
        raise _Invalid(f"Invalid type for 'messages[{i}].tool_calls': expected an array.",
                       f"messages[{i}].tool_calls", "invalid_type")
    for j, tc in enumerate(calls):
        where = f"messages[{i}].tool_calls[{j}]"
        if not isinstance(tc, dict):
            raise _Invalid(f"Invalid type for '{where}': expected an object.", where, "invalid_type")
        for key in ("id", "type", "function"):
            if not tc.get(key):  # an empty id is refused like a missing one
                raise _missing(f"{where}.{key}")
        if tc["type"] != "function":
            raise _Invalid(f"Invalid value: '{tc['type']}'. Supported values are: 'function'.",
                           f"{where}.type", "invalid_value")
        function = tc["function"]
        if not isinstance(function, dict) or not function.get("name"):
            raise _missing(f"{where}.function.name")
        if not isinstance(function.get("arguments"), str):
            raise _missing(f"{where}.function.arguments")


def _validate_tool_sequence(messages: list[dict[str, Any]]) -> None:
    open_ids: list[str] | None = None  # ids of the assistant tool_calls block being answered
    owner = -1  # index of that assistant message
    answered: dict[str, int] = {}  # tool_call_id -> index of the tool message answering it

    def close() -> None:
        missing = [cid for cid in open_ids or [] if cid not in answered]
        if missing:
            raise _Invalid(
                "An assistant message with 'tool_calls' must be followed by tool messages responding to "
                "each 'tool_call_id'. The following tool_call_ids did not have response messages: "
                + ", ".join(missing), f"messages.[{owner}].role")

    for i, msg in enumerate(messages):
        if msg["role"] == "tool":
            if open_ids is None or msg.get("tool_call_id") not in open_ids:
                raise _Invalid("Invalid parameter: messages with role 'tool' must be a response to a "
                               "preceeding message with 'tool_calls'.", f"messages.[{i}].role")
            if msg["tool_call_id"] in answered:
                raise _Invalid(f"Invalid parameter: Duplicate value for 'tool_call_id' of '{msg['tool_call_id']}', "
                               f"in messages[{answered[msg['tool_call_id']]}] and messages[{i}].",
                               f"messages.[{i}].tool_call_id")
            answered[msg["tool_call_id"]] = i
            continue
        close()
        open_ids, answered = None, {}
        if msg["role"] == "assistant" and msg.get("tool_calls"):
            open_ids = [str(tc.get("id")) for tc in msg["tool_calls"] if isinstance(tc, dict)]
            owner = i
    close()


LACKS = ("stream", "stream_options", "parallel_tool_calls", "vision")
"""What a ``FakeOpenAI(lacks=...)`` refuses, the way servers without it do."""


def refuse_lacking(body: dict[str, Any], lacks: frozenset[str]) -> None:
    """Raises ``_Invalid`` (400) for what a server lacking ``lacks`` refuses:

    - ``stream``: ``stream: true`` ("Streaming is not supported");
    - ``stream_options``: any ``stream_options`` (Azure OpenAI before 2024-09 and older vLLM:
      ``Unrecognized request argument supplied: stream_options``);
    - ``parallel_tool_calls``: the ``parallel_tool_calls`` parameter, or an assistant message with
      more than one tool call (chat templates that render one call per turn);
    - ``vision``: an ``image_url`` content part (OpenAI for a text-only model: ``Invalid content
      type. image_url is only supported by certain models.``).
    """
    if "stream" in lacks and body.get("stream"):
        raise _Invalid("Streaming is not supported by this server.", "stream", "unsupported_parameter")
    if "stream_options" in lacks and "stream_options" in body:
        raise _Invalid("Unrecognized request argument supplied: stream_options", "stream_options")
    if "parallel_tool_calls" in lacks:
        if "parallel_tool_calls" in body:
            raise _Invalid("Unrecognized request argument supplied: parallel_tool_calls", "parallel_tool_calls")
        for i, msg in enumerate(body["messages"]):
            if len(msg.get("tool_calls") or ()) > 1:
                raise _Invalid(f"This model does not support parallel tool calls: 'messages[{i}].tool_calls' has "
                               f"{len(msg['tool_calls'])} entries; send one tool call per assistant message.",
                               f"messages[{i}].tool_calls", "unsupported_value")
    if "vision" in lacks:
        for i, msg in enumerate(body["messages"]):
            content = msg.get("content")
            if isinstance(content, list) and any(isinstance(p, dict) and p.get("type") == "image_url"
                                                 for p in content):
                raise _Invalid("Invalid content type. image_url is only supported by certain models.",
                               f"messages.[{i}].content.[0].type", "invalid_value")


# ---------------------------------------------------------------------------------------- server


def _canon(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _looks_like_audio(data: bytes) -> bool:
    """The bytes start like a container the speech-to-text decoder reads (OGG, FLAC, WAV, MP4/M4A,
    WebM/Matroska, MP3 with an ID3 tag or a frame header)."""
    head = data[:16]
    return (head.startswith((b"OggS", b"fLaC", b"ID3", b"\x1a\x45\xdf\xa3"))
            or (head.startswith(b"RIFF") and head[8:12] == b"WAVE") or head[4:8] == b"ftyp"
            or (len(head) > 1 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0 and head[1] & 0x06 != 0))


def _audio_seconds(data: bytes) -> int:
    """How long the audio lasts, in whole seconds (at least 1), as the API reports it in ``usage``:
    an Ogg Opus stream's last granule position (48 kHz samples), a WAV file's data bytes over its
    byte rate; other containers (not parsed here) by size, as 32 kbit/s."""
    if data.startswith(b"OggS"):
        last = data.rfind(b"OggS")
        if len(data) >= last + 14:
            granule = struct.unpack_from("<q", data, last + 6)[0]
            if granule > 0:
                return max(1, math.ceil(granule / 48000))
    if data.startswith(b"RIFF") and data[8:12] == b"WAVE":
        at, rate = 12, 0
        while at + 8 <= len(data):
            chunk, size = data[at:at + 4], struct.unpack_from("<I", data, at + 4)[0]
            if chunk == b"fmt " and size >= 12:
                rate = struct.unpack_from("<I", data, at + 16)[0]  # bytes per second
            elif chunk == b"data" and rate:
                return max(1, math.ceil(min(size, len(data) - at - 8) / rate))
            at += 8 + size + (size & 1)
    return max(1, len(data) // 4000)


def _new_id(prefix: str, n: int = 24) -> str:
    return f"{prefix}{uuid.uuid4().hex[:n]}"


def _pieces(s: str, n: int = 3) -> list[str]:
    """Splits ``s`` into at most ``n`` non-empty pieces (as a stream would deliver it)."""
    if not s:
        return []
    size = max(1, -(-len(s) // n))
    return [s[k:k + size] for k in range(0, len(s), size)]


class FakeOpenAI(ThreadedServer):
    """The fake server. ``POST /v1/chat/completions``, ``POST /v1/embeddings``,
    ``POST /v1/audio/transcriptions`` and ``GET /v1/models``, Bearer auth required.

    Public state (all thread-safe): ``responder`` (``fn(request_json) -> Reply | str | None``, used
    when the queue is empty), ``requests`` (list of records ``{"path", "json", "headers", "time",
    "status", "prompt_tokens", "cached_tokens", "usage"}``; a record is appended on arrival and its
    ``status`` and token fields are filled in once answered; ``usage`` is the object the reply
    reported, ``prompt_tokens``/``cached_tokens`` the emulated figures), ``last_request``,
    ``pending`` (queued replies).

    ``usage.prompt_tokens`` is ``len(serialized tools + messages) // 4``; ``cached_tokens`` emulates the
    provider prompt cache: the longest prefix shared with any earlier valid request, in whole
    128-token blocks, and 0 below 1024 tokens.

    Servers that differ from OpenAI: ``lacks`` (``LACKS``: ``stream``, ``stream_options``,
    ``parallel_tool_calls``, ``vision``) refuses what such a server refuses (``refuse_lacking``);
    ``context_window`` refuses longer prompts with OpenAI's ``context_length_exceeded`` 400. Run
    several instances (each with its own key) to stand in for several providers.
    """

    def __init__(self, api_key: str = "sk-test", models: Iterable[str] = ("gpt-4o-mini",),
                 port: int = 0, lacks: Iterable[str] = (), context_window: int | None = None) -> None:
        super().__init__(port)
        self.api_key = api_key
        self.models = list(models)
        self.lacks = frozenset(lacks)
        """What this server refuses, like servers that lack it (``LACKS``, checked with the request)."""
        unknown = self.lacks - set(LACKS)
        if unknown:
            raise ValueError(f"unknown lacks {sorted(unknown)}; one of {LACKS}")
        self.context_window = context_window
        """Requests whose prompt (the emulated ``prompt_tokens``) exceeds it are refused as OpenAI
        refuses them: 400 ``context_length_exceeded``."""
        self.responder: Callable[[dict[str, Any]], Reply | str | None] | None = None
        self.vision_models: set[str] | None = None
        """Models that take image parts (``None``: every model); a request with images to another
        model gets OpenAI's 400 "Invalid content type. image_url is only supported by certain models."."""
        self.on_request: Callable[[dict[str, Any]], None] | None = None
        """Called with each valid chat request's body as it arrives, before it is answered (on the
        server's loop: keep it short), e.g. to look at the gateway while the model is mid-request."""
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._queue: deque[Reply] = deque()
        self._requests: list[dict[str, Any]] = []
        self._prefixes: set[bytes] = set()
        self.embedding_requests: list[dict[str, Any]] = []
        """Bodies of ``POST /v1/embeddings`` requests (kept apart from chat ``requests``)."""
        self.embedding_aliases: dict[str, str] = {}
        """Word -> word it embeds as (``{"automobile": "car"}``: synonyms a keyword search misses)."""
        self.transcriptions: list[dict[str, Any]] = []
        """Records of ``POST /v1/audio/transcriptions``: ``{"status", "model", "filename",
        "content_type", "size", "sha256", "fields", "headers"}`` (appended on arrival)."""
        self.transcription_responder: Callable[[dict[str, Any]], str | ErrorReply | None] | None = None
        """Asked with the upload's record when no transcript is scripted."""
        self._transcripts: deque[str | ErrorReply] = deque()

    # ---- scripting and inspection (any thread)

    def script(self, *replies: Reply | str) -> None:
        """Appends replies to the FIFO queue (a plain str means ``text(str)``)."""
        with self._lock:
            self._queue.extend(_coerce(r) for r in replies)

    def script_transcription(self, *replies: str | ErrorReply) -> None:
        """Appends transcripts (or ``error(...)`` replies) for the next uploads, FIFO."""
        with self._lock:
            self._transcripts.extend(replies)

    def wait_for_transcriptions(self, n: int, timeout: float = 5) -> list[dict[str, Any]]:
        """Blocks until at least ``n`` uploads arrived; returns their records. Raises TimeoutError."""
        with self._cond:
            if not self._cond.wait_for(lambda: len(self.transcriptions) >= n, timeout):
                raise TimeoutError(f"expected {n} transcriptions, got {len(self.transcriptions)}")
            return list(self.transcriptions)

    def reset(self) -> None:
        """Clears the queues, the responders, recorded requests and the emulated prompt cache."""
        with self._lock:
            self._transcripts.clear()
            self.transcriptions.clear()
            self.transcription_responder = None
            self._queue.clear()
            self._requests.clear()
            self._prefixes.clear()
            self.responder = None
            self.on_request = None
            self.embedding_requests.clear()
            self.embedding_aliases.clear()

    @property
    def pending(self) -> int:
        """Number of scripted replies not yet consumed."""
        with self._lock:
            return len(self._queue)

    @property
    def requests(self) -> list[dict[str, Any]]:
        """Snapshot of all chat completion request records, oldest first."""
        with self._lock:
            return list(self._requests)

    @property
    def last_request(self) -> dict[str, Any] | None:
        """The newest request record, or None."""
        with self._lock:
            return self._requests[-1] if self._requests else None

    def wait_for_requests(self, n: int, timeout: float = 5) -> list[dict[str, Any]]:
        """Blocks until at least ``n`` requests arrived; returns the records. Raises TimeoutError."""
        with self._cond:
            if not self._cond.wait_for(lambda: len(self._requests) >= n, timeout):
                raise TimeoutError(f"expected {n} requests, got {len(self._requests)}")
            return list(self._requests)

    def cache_hit_ratio(self) -> float:
        """Sum of ``cached_tokens`` over sum of ``prompt_tokens`` across answered valid requests."""
        recs = [r for r in self.requests if r["prompt_tokens"]]
        total = sum(r["prompt_tokens"] for r in recs)
        return sum(r["cached_tokens"] for r in recs) / total if total else 0.0

    # ---- HTTP

    def build_app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_REQUEST_BYTES)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/embeddings", self._embeddings)
        app.router.add_post("/v1/audio/transcriptions", self._transcriptions)
        return app

    def _auth_error(self, request: web.Request) -> ErrorReply | None:
        header = request.headers.get("Authorization", "")
        if not header.startswith("Bearer ") or not header[7:].strip():
            return ErrorReply(401, "You didn't provide an API key. You need to provide your API key in "
                              "an Authorization header using Bearer auth (i.e. Authorization: Bearer "
                              "YOUR_KEY).")
        key = header[7:].strip()
        if key != self.api_key:
            shown = f"{key[:3]}{'*' * max(0, len(key) - 7)}{key[-4:]}" if len(key) > 7 else key
            return ErrorReply(401, f"Incorrect API key provided: {shown}. You can find your API key at "
                              "https://platform.openai.com/account/api-keys.", code="invalid_api_key")
        return None

    @staticmethod
    def _error_response(err: ErrorReply) -> web.Response:
        body = {"error": {"message": err.message, "type": err.type, "param": err.param, "code": err.code}}
        headers = {"x-request-id": _new_id("req_", 32), **err.headers}
        return web.json_response(body, status=err.status, headers=headers)

    async def _models(self, request: web.Request) -> web.Response:
        if (err := self._auth_error(request)) is not None:
            return self._error_response(err)
        data = [{"id": m, "object": "model", "created": 1700000000, "owned_by": "openai"}
                for m in self.models]
        return web.json_response({"object": "list", "data": data})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = None
        record: dict[str, Any] = {
            "path": request.path, "json": body, "time": time.time(), "status": None,
            "headers": {k.lower(): v for k, v in request.headers.items()},
            "prompt_tokens": None, "cached_tokens": None, "usage": None,
            "peer": request.transport.get_extra_info("peername") if request.transport else None,
        }
        with self._cond:
            self._requests.append(record)
            self._cond.notify_all()
        reply = self._auth_error(request)
        if reply is None:
            try:
                validate_chat_request(body)
                refuse_lacking(body, self.lacks)
                self._check_window(body)
                if self.vision_models is not None and body["model"] not in self.vision_models and _has_images(body):
                    raise _Invalid("Invalid content type. image_url is only supported by certain models.",
                                   "messages", "invalid_value")
            except _Invalid as exc:
                reply = exc.reply
        if reply is not None:
            record["status"] = reply.status
            return self._error_response(reply)

        prompt_tokens, cached = self._account(body)
        record["prompt_tokens"], record["cached_tokens"] = prompt_tokens, cached
        if self.on_request is not None:
            self.on_request(body)
        reply = self._next_reply(body)
        if isinstance(reply, CutReply):
            record["status"] = "cut"
            return await self._cut(request, body, reply, prompt_tokens, cached)
        while isinstance(reply, DelayedReply | HeldReply):
            if isinstance(reply, HeldReply):
                while not reply.gate.is_set():
                    await asyncio.sleep(0.02)
            else:
                await asyncio.sleep(reply.seconds)
            reply = reply.reply
        record["status"] = reply.status if isinstance(reply, ErrorReply) else 200
        if isinstance(reply, ErrorReply):
            return self._error_response(reply)
        if isinstance(reply, RawReply):
            if not body.get("stream"):
                return web.json_response(reply.body)
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
            await resp.prepare(request)
            await resp.write(f"data: {json.dumps(reply.body)}\n\ndata: [DONE]\n\n".encode())
            await resp.write_eof()
            return resp
        record["usage"] = self._usage(reply, prompt_tokens, cached)
        if body.get("stream"):
            return await self._stream(request, body, reply, prompt_tokens, cached)
        return web.json_response(self._completion(body, reply, prompt_tokens, cached),
                                 headers={"x-request-id": _new_id("req_", 32)})

    async def _embeddings(self, request: web.Request) -> web.Response:
        """``POST /v1/embeddings``: a deterministic bag-of-words vector per input (64 dimensions;
        words of 3+ letters hashed, a few stop words and a trailing ``s`` dropped,
        ``embedding_aliases`` applied), so texts sharing words (or aliased words) are near."""
        if (err := self._auth_error(request)) is not None:
            return self._error_response(err)
        body = await request.json()
        inputs = body.get("input")
        if isinstance(inputs, str):
            inputs = [inputs]
        if not body.get("model") or not isinstance(inputs, list) or not inputs:
            return self._error_response(ErrorReply(400, "'model' and a non-empty 'input' are required."))
        with self._lock:
            self.embedding_requests.append(body)
            aliases = dict(self.embedding_aliases)
        data = []
        for index, text_ in enumerate(inputs):
            vector = [0.0] * 64
            for word in re.findall(r"[a-z0-9]{3,}", str(text_).lower()):
                if word in _EMBED_STOPWORDS:
                    continue
                word = aliases.get(word, word)
                word = word[:-1] if word.endswith("s") else word
                vector[hashlib.md5(word.encode()).digest()[0] % 64] += 1.0
            data.append({"object": "embedding", "index": index, "embedding": vector})
        tokens = sum(len(str(t)) // 4 + 1 for t in inputs)
        return web.json_response({"object": "list", "data": data, "model": body["model"],
                                  "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})

    async def _transcriptions(self, request: web.Request) -> web.Response:
        """``POST /v1/audio/transcriptions``: the checks OpenAI makes, in its order: the key (401),
        the body size (413 over 25 MB: "Maximum content size limit (26214400) exceeded (N bytes
        read)"), a multipart body, ``model`` (400 when missing, 404 when unknown), ``file``
        (400 when missing; 400 "Invalid file format. Supported formats: [...]" unless its name
        ends in one; 400 "Audio file might be corrupted or unsupported" unless its bytes start
        like an audio container), ``response_format``. Then the scripted text, as ``{"text",
        "usage"}`` (json), plain text (text, srt, vtt) or ``verbose_json`` (whisper-1 only). ``usage``
        is OpenAI's: ``{"type": "duration", "seconds"}`` for whisper-1 (the audio's length,
        ``_audio_seconds``), ``{"type": "tokens", "input_tokens", "output_tokens", "total_tokens"}``
        for the gpt-4o models."""
        record: dict[str, Any] = {"status": None, "model": None, "filename": None, "content_type": None,
                                  "size": None, "sha256": None, "fields": {},
                                  "headers": {k.lower(): v for k, v in request.headers.items()}}
        with self._cond:
            self.transcriptions.append(record)
            self._cond.notify_all()

        def refuse(err: ErrorReply) -> web.Response:
            record["status"] = err.status
            return self._error_response(err)

        if (err := self._auth_error(request)) is not None:
            return refuse(err)
        raw = await request.read()
        if len(raw) > TRANSCRIPTION_MAX_BYTES:
            return refuse(ErrorReply(413, f"Maximum content size limit ({TRANSCRIPTION_MAX_BYTES}) exceeded "
                                          f"({len(raw)} bytes read)", "server_error"))
        if not request.content_type.startswith("multipart/form-data"):
            return refuse(ErrorReply(400, f"Invalid Content-Type header ({request.content_type}), expected "
                                          "multipart/form-data. (HINT: If you're using curl, you can pass "
                                          "-H 'Content-Type: multipart/form-data')"))
        fields: dict[str, str] = {}
        upload: tuple[str | None, str, bytes] | None = None
        parsed = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
            f"Content-Type: {request.headers.get('Content-Type', '')}\r\n\r\n".encode() + raw)
        for part in parsed.iter_parts() if parsed.is_multipart() else ():
            name = part.get_param("name", header="content-disposition")
            payload = part.get_payload(decode=True) or b""
            if name == "file":
                upload = (part.get_filename(), part.get_content_type(), payload)
            elif isinstance(name, str):
                fields[name] = payload.decode("utf-8", errors="replace")
        record["fields"] = fields
        model = fields.get("model")
        record["model"] = model
        if not model:
            return refuse(ErrorReply(400, "you must provide a model parameter"))
        if model not in TRANSCRIPTION_MODELS:
            return refuse(ErrorReply(404, f"The model `{model}` does not exist or you do not have access to it.",
                                     code="model_not_found"))
        if upload is None:
            return refuse(_missing("file").reply)
        filename, content_type, data = upload
        record.update(filename=filename, content_type=content_type, size=len(data),
                      sha256=hashlib.sha256(data).hexdigest())
        ext = (filename or "").rsplit(".", 1)[-1].lower() if "." in (filename or "") else ""
        if ext not in AUDIO_FORMATS:
            return refuse(ErrorReply(400, f"Invalid file format. Supported formats: {list(AUDIO_FORMATS)}",
                                     param="file", code="invalid_value"))
        if not _looks_like_audio(data):
            return refuse(ErrorReply(400, "Audio file might be corrupted or unsupported", param="file",
                                     code="invalid_value"))
        response_format = fields.get("response_format", "json")
        if response_format not in _RESPONSE_FORMATS:
            return refuse(ErrorReply(400, f"Invalid value: '{response_format}'. Supported values are: "
                                          + ", ".join(f"'{f}'" for f in _RESPONSE_FORMATS) + ".",
                                     param="response_format", code="invalid_value"))
        if model != "whisper-1" and response_format not in ("json", "text"):
            return refuse(ErrorReply(400, f"response_format '{response_format}' is not compatible with model "
                                          f"'{model}'. Use 'json' or 'text' instead.", param="response_format",
                                     code="unsupported_value"))
        with self._lock:
            scripted = self._transcripts.popleft() if self._transcripts else None
            responder = self.transcription_responder
        if scripted is None and responder is not None:
            scripted = responder(record)
        if isinstance(scripted, ErrorReply):
            return refuse(scripted)
        said = NO_TRANSCRIPT if scripted is None else scripted
        record["status"] = 200
        seconds = _audio_seconds(data)
        if response_format in ("text", "srt", "vtt"):
            return web.Response(text=said + "\n", content_type="text/plain")
        if response_format == "verbose_json":
            return web.json_response({"task": "transcribe", "language": "english", "duration": seconds,
                                      "text": said, "segments": [], "usage": {"type": "duration",
                                                                              "seconds": seconds}})
        usage_ = ({"type": "duration", "seconds": seconds} if model == "whisper-1" else
                  {"type": "tokens", "input_tokens": seconds * 10, "output_tokens": len(said) // 4 + 1,
                   "total_tokens": seconds * 10 + len(said) // 4 + 1})
        return web.json_response({"text": said, "usage": usage_})

    def _next_reply(self, body: dict[str, Any]) -> Reply:
        with self._lock:
            if self._queue:
                return self._queue.popleft()
            responder = self.responder
        reply = responder(body) if responder is not None else None
        return _coerce(reply if reply is not None else NO_REPLY)

    def _account(self, body: dict[str, Any]) -> tuple[int, int]:
        """Returns (prompt_tokens, cached_tokens) and remembers this prompt's block prefixes."""
        serialized = (_canon(body["tools"]) if body.get("tools") else "") + "".join(
            _canon(_image_digests(m)) for m in body["messages"])
        h = hashlib.blake2b(digest_size=16)
        digests: list[bytes] = []
        for end in range(_CACHE_BLOCK_CHARS, len(serialized) + 1, _CACHE_BLOCK_CHARS):
            h.update(serialized[end - _CACHE_BLOCK_CHARS:end].encode())
            digests.append(h.digest())
        with self._lock:
            hit = 0
            for d in digests:  # prefixes nest, so the first miss ends the shared prefix
                if d not in self._prefixes:
                    break
                hit += 1
            self._prefixes.update(digests)
        cached = hit * _CACHE_BLOCK_CHARS // 4
        return max(1, len(serialized) // 4), cached if cached >= _CACHE_MIN_TOKENS else 0

    @staticmethod
    def _usage(reply: TextReply | ToolCallsReply, prompt_tokens: int, cached: int) -> dict[str, Any]:
        if reply.usage is not None:
            prompt_tokens, completion, cached = (reply.usage.prompt_tokens, reply.usage.completion_tokens,
                                                 reply.usage.cached_tokens)
        else:
            if isinstance(reply, TextReply):
                out = reply.content
            else:
                out = (reply.content or "") + "".join(c.name + c.arguments for c in reply.calls)
            completion = max(1, len(out) // 4)
        return {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
                "total_tokens": prompt_tokens + completion,
                "prompt_tokens_details": {"cached_tokens": cached, "audio_tokens": 0},
                "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0,
                                              "accepted_prediction_tokens": 0,
                                              "rejected_prediction_tokens": 0}}

    def _completion(self, body: dict[str, Any], reply: TextReply | ToolCallsReply, prompt_tokens: int,
                    cached: int) -> dict[str, Any]:
        """The non-streaming ``chat.completion`` object."""
        message: dict[str, Any] = {"role": "assistant", "refusal": None}
        if isinstance(reply, TextReply):
            message["content"], finish = reply.content, reply.finish_reason
        else:
            message["content"], finish = reply.content, "tool_calls"
            message["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in reply.calls]
        return {"id": _new_id("chatcmpl-", 29), "object": "chat.completion", "created": int(time.time()),
                "model": body["model"], "system_fingerprint": "fp_fake",
                "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
                "usage": self._usage(reply, prompt_tokens, cached)}

    def _check_window(self, body: dict[str, Any]) -> None:
        if self.context_window is None:
            return
        tokens = self._prompt_tokens(body)
        if tokens > self.context_window:
            raise _Invalid(f"This model's maximum context length is {self.context_window} tokens. However, your "
                           f"messages resulted in {tokens} tokens. Please reduce the length of the messages.",
                           "messages", "context_length_exceeded")

    @staticmethod
    def _prompt_tokens(body: dict[str, Any]) -> int:
        serialized = (_canon(body["tools"]) if body.get("tools") else "") + "".join(
            _canon(m) for m in body["messages"])
        return max(1, len(serialized) // 4)

    async def _cut(self, request: web.Request, body: dict[str, Any], reply: CutReply, prompt_tokens: int,
                   cached: int) -> web.StreamResponse:
        """Answers ``reply.reply`` but breaks the connection (``CutReply``)."""
        if request.transport is None:
            raise ConnectionError("no transport")
        if not body.get("stream"):
            request.transport.abort()
            return web.Response(status=500)  # never reaches the client: the socket is gone
        return await self._stream(request, body, reply.reply, prompt_tokens, cached, cut_after=reply.after_chunks)

    async def _stream(self, request: web.Request, body: dict[str, Any], reply: TextReply | ToolCallsReply,
                      prompt_tokens: int, cached: int, cut_after: int | None = None) -> web.StreamResponse:
        """SSE: role delta, content/tool-call deltas, finish_reason chunk, optional usage, ``[DONE]``
        (with ``cut_after``: only that many chunks, then the socket is closed)."""
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        base = {"id": _new_id("chatcmpl-", 29), "object": "chat.completion.chunk",
                "created": int(time.time()), "model": body["model"], "system_fingerprint": "fp_fake"}

        def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            c = {**base, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
            if include_usage:
                c["usage"] = None
            return c

        chunks: list[dict[str, Any]] = []
        delay = 0.0
        if isinstance(reply, TextReply):
            chunks.append(chunk({"role": "assistant", "content": "", "refusal": None}))
            chunks += [chunk({"content": p}) for p in _pieces(reply.content, reply.pieces)]
            finish, delay = reply.finish_reason, reply.piece_delay_s
        else:
            chunks.append(chunk({"role": "assistant", "content": None, "refusal": None}))
            chunks += [chunk({"content": p}) for p in _pieces(reply.content or "")]
            shared = reply.index_shape != "distinct"
            heads = [chunk({"tool_calls": [{"index": 0 if shared else idx, "id": c.id, "type": "function",
                                            "function": {"name": c.name, "arguments": ""}}]})
                     for idx, c in enumerate(reply.calls)]
            bodies = [[chunk({"tool_calls": [{"index": 0 if shared else idx, "function": {"arguments": p}}]})
                       for p in _pieces(c.arguments, 4)] for idx, c in enumerate(reply.calls)]
            if reply.index_shape == "one_chunk":
                chunks.append(chunk({"tool_calls": [
                    {"index": 0, "id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                    for c in reply.calls]}))
            elif reply.interleave:
                chunks += heads
                for round_ in range(max(len(b) for b in bodies)):
                    chunks += [b[round_] for b in reversed(bodies) if round_ < len(b)]
            else:
                for head, body in zip(heads, bodies, strict=True):
                    chunks += [head, *body]
            finish = "tool_calls"
        chunks.append(chunk({}, finish))
        if include_usage:
            whole = self._usage(reply, prompt_tokens, cached)
            chunks.append({**base, "choices": [], "usage": whole})
            if reply.usage_shape == "finish_and_final":
                chunks[-2]["usage"] = whole
            elif reply.usage_shape == "every_chunk":  # running totals: the prompt at once, output growing
                for n, c in enumerate(chunks[:-2], 1):
                    done = whole["completion_tokens"] * n // (len(chunks) - 1)
                    c["usage"] = {**whole, "completion_tokens": done,
                                  "total_tokens": whole["prompt_tokens"] + done}
                chunks[-2]["usage"] = whole

        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8",
                                           "Cache-Control": "no-cache",
                                           "x-request-id": _new_id("req_", 32)})
        await resp.prepare(request)
        try:
            for n, c in enumerate(chunks):
                if cut_after is not None and n == cut_after:
                    assert request.transport is not None
                    request.transport.abort()  # no terminating chunk: the client sees a broken body
                    return resp
                await resp.write(f"data: {json.dumps(c)}\n\n".encode())
                if delay and c["choices"] and c["choices"][0]["delta"].get("content"):
                    await asyncio.sleep(delay)
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        except ConnectionError:  # the client stopped reading the stream
            pass
        return resp
