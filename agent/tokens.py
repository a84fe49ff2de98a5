"""Token counts of model requests, estimated without a tokenizer download.

``tiktoken`` fetches its BPE tables at run time, which an offline gateway cannot rely on, so the
count is a documented estimate: the UTF-8 bytes of the message as compact JSON (what goes on the
wire) divided by ``BYTES_PER_TOKEN``, rounded up, plus ``MESSAGE_OVERHEAD`` per message. English
text runs at ~4 bytes per token with OpenAI's tokenizers, and JSON punctuation/CJK text at fewer
tokens per byte, so bytes/4 over-counts rather than under-counts for most chats; callers keep a
safety margin (``Window.hard_limit``) for the rest.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import orjson

BYTES_PER_TOKEN = 4
MESSAGE_OVERHEAD = 4
"""Tokens the chat format adds per message (role markers, separators)."""
IMAGE_TOKENS = 1_445
"""Tokens counted per ``image_url`` content part, whatever its URL's length (a base64 data URL is
not text the model reads): OpenAI's tile formula for an image within 2048 px at ``detail: high``
costs at most 85 + 170 x 8 = 1,445 tokens (768 x 2048 px, 8 tiles of 512 px)."""


def text_tokens(text: str) -> int:
    """Estimated tokens of a plain string (ceil of UTF-8 bytes / 4)."""
    return -(-len(text.encode("utf-8")) // BYTES_PER_TOKEN)


def json_tokens(obj: Any) -> int:
    """Estimated tokens of ``obj`` serialized as compact JSON (keys in given order, non-ASCII text
    as UTF-8). ``orjson`` writes the same bytes as ``json.dumps(obj, ensure_ascii=False,
    separators=(",", ":"))`` for the JSON a request holds, some 20 times faster (a turn estimates
    its whole window); what it refuses (keys that are not strings, integers beyond 64 bits) is
    counted through ``json``."""
    try:
        return -(-len(orjson.dumps(obj)) // BYTES_PER_TOKEN)
    except TypeError:  # orjson.JSONEncodeError is one
        return text_tokens(json.dumps(obj, ensure_ascii=False, separators=(",", ":")))


def message_tokens(message: dict[str, Any]) -> int:
    """Estimated tokens of one chat message (wire shape) including its per-message overhead; each
    image content part counts ``IMAGE_TOKENS``."""
    content = message.get("content")
    if isinstance(content, list):
        images = sum(1 for part in content if isinstance(part, dict) and part.get("type") == "image_url")
        if images:
            rest = [part for part in content if not (isinstance(part, dict) and part.get("type") == "image_url")]
            return json_tokens({**message, "content": rest}) + MESSAGE_OVERHEAD + IMAGE_TOKENS * images
    return json_tokens(message) + MESSAGE_OVERHEAD


def request_tokens(messages: Iterable[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> int:
    """Estimated prompt tokens of a whole request: every message plus the tool schemas."""
    return sum(message_tokens(m) for m in messages) + (json_tokens(tools) if tools else 0)
