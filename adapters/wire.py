"""What every webhook needs before it trusts a byte: raw header bytes, a bounded JSON parse, and
typed wire models that refuse wrong JSON types.

Rules every adapter follows (README "Security model"):
- the signature or secret is checked on the raw bytes of the body and of the headers, before
  anything is parsed; aiohttp hands header bytes that are not UTF-8 over as lone surrogates
  (``surrogateescape``), and ``header_bytes`` turns them back into the bytes that were sent, so a
  hostile header is a mismatch and never an exception;
- ``load_json`` accepts UTF-8 JSON only and turns every way a body can be unreadable (not UTF-8,
  not JSON, ``NaN``/``Infinity``, integers too long to read, nesting deeper than the parser's
  recursion limit) into ``UnreadableBody``;
- payloads are validated into ``WireModel`` subclasses (pydantic, strict: ``"12"`` is not an
  integer, ``1`` is not a string) before a platform SDK or the gateway sees them; ids are bounded
  by ``MAX_ID_CHARS`` so that they fit the database's columns.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, StringConstraints, ValidationError

MAX_ID_CHARS = 128
"""Longest platform id (chat, user, message, tenant, thread, event) taken from a payload. Real
ids are far shorter (Telegram: 52-bit integers; Slack: ~11 characters, ``ts`` 17; Feishu: ~40)."""

_SURROGATE = re.compile("[\ud800-\udfff]")


def _checkable(value: Any) -> Any:
    # pydantic-core refuses a str holding a lone surrogate (a JSON "\ud83d" escape, half an emoji)
    # as "not a valid string"; such text is authentic and cleaned later (gateway.store.text), so
    # it is checked here as if already cleaned. The payload itself is left as it came.
    return _SURROGATE.sub("\ufffd", value) if isinstance(value, str) else value


Text = Annotated[str, BeforeValidator(_checkable)]
"""A JSON string (any text, lone surrogates included; a number or null is not one)."""


Id = Annotated[str, StringConstraints(max_length=MAX_ID_CHARS), BeforeValidator(_checkable)]
"""A platform id as a string (empty allowed: several platforms send ``""`` for "none")."""
Word = Annotated[str, StringConstraints(max_length=32), BeforeValidator(_checkable)]
"""A type, subtype or kind field (``"group"``, ``"message_changed"``), at most 32 characters."""
Name = Annotated[str, StringConstraints(max_length=64), BeforeValidator(_checkable)]
"""A short name (an event type, a tag, a language), at most 64 characters."""
Label = Annotated[str, StringConstraints(max_length=255), BeforeValidator(_checkable)]
"""A label, mime type or action id, at most 255 characters."""
LongName = Annotated[str, StringConstraints(max_length=1024), BeforeValidator(_checkable)]
"""A longer label, at most 1024 characters."""


class UnreadableBody(ValueError):
    """The body is not UTF-8 JSON the gateway can read; ``str(exc)`` says why (no payload text)."""


class WireModel(BaseModel):
    """Base of the inbound wire models: strict JSON types, unknown fields ignored (platforms add
    fields all the time), nothing coerced. Validation only: adapters keep the original dict."""

    model_config = ConfigDict(strict=True, extra="ignore", populate_by_name=True)


def header_bytes(value: str | None) -> bytes:
    """The bytes a header value arrived as (aiohttp decodes with ``surrogateescape``); ``b""`` for
    a missing header."""
    return value.encode("utf-8", "surrogateescape") if value else b""


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError("number out of range")
    return value


_DECODER = json.JSONDecoder(parse_constant=_no_constant, parse_float=_finite)
"""What ``json.loads(text, parse_constant=..., parse_float=...)`` builds on every call (≈1.5 µs),
built once (a decoder keeps no state between calls, like ``json``'s own default one)."""


def load_json(raw: bytes | str) -> Any:
    """Parses a webhook body (RFC 8259: UTF-8 JSON).

    Raises:
        UnreadableBody: not UTF-8, not JSON, a ``NaN``/``Infinity`` constant, a number too large
            for a float or too long to read, or nested deeper than Python's recursion limit.
    """
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
    except UnicodeDecodeError:
        raise UnreadableBody("body is not UTF-8") from None
    try:
        return _DECODER.decode(text)
    except RecursionError:
        raise UnreadableBody("JSON nested too deeply") from None
    except ValueError:
        raise UnreadableBody("body is not JSON") from None


def validation_problem(exc: ValidationError) -> str:
    """A short, log-safe account of a validation error: where and what, never the input value
    (``message.chat.id: Input should be a valid integer (+2 more)``)."""
    errors = exc.errors(include_url=False, include_input=False, include_context=False)
    if not errors:
        return "invalid payload"
    first = errors[0]
    where = ".".join(str(part) for part in first.get("loc", ())) or "body"
    more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{where}: {first.get('msg', 'invalid')}{more}"


def check(model: type[WireModel], data: Any) -> str | None:
    """``None`` when ``data`` validates as ``model``, else why not (``validation_problem``).
    Nesting too deep for the validator counts as invalid too."""
    try:
        model.model_validate(data)
    except ValidationError as exc:
        return validation_problem(exc)
    except RecursionError:
        return "payload nested too deeply"
    return None
