"""What the model sees of a file: a quoted line per attachment and, for images, content parts.

A user message with images goes to the model as content parts (OpenAI chat completions
"vision"): one ``text`` part (the header line, one line per attachment, the caption or text),
then one ``image_url`` part per image shown. While a projection is fitted into the context
window the image parts carry a ``blob:<sha256>`` placeholder (``IMAGE_TOKENS`` each in the
estimate, no blob read); ``resolve_images`` turns exactly the parts that are sent into base64 data
URLs of the stored renditions, so a replayed turn sends the same bytes.

Which images are shown: every image of the turn being answered, plus the newest
``media.history_images`` of earlier turns in the window; older ones, and all of them when the
model has no vision, are described in words. A file name is data: it is shown quoted (JSON string
quoting), with control characters removed when it was stored.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gateway.core.errors import BlobMissing
from gateway.core.types import MediaRef

log = logging.getLogger("gateway.media.render")

BLOB_SCHEME = "blob:"
"""Placeholder URL scheme of an image part before ``resolve_images`` (never sent)."""


@dataclass(frozen=True, slots=True)
class ImagePolicy:
    """``vision``: the model takes image parts; ``history_images``: earlier turns' images still shown."""

    vision: bool = True
    history_images: int = 4


def human_size(size: int) -> str:
    """``9.8 KB``, ``30.0 MB`` (powers of 1000, as the limits are stated)."""
    if size < 1000:
        return f"{size} B"
    if size < 1_000_000:
        return f"{size / 1000:.1f} KB"
    return f"{size / 1_000_000:.1f} MB"


def quoted(name: str | None) -> str:
    """A file name as quoted data (``"report.pdf"``), ``unnamed`` when there is none."""
    return json.dumps(name, ensure_ascii=False) if name else "unnamed"


def describe(ref: MediaRef, state: str | None = None) -> str:
    """One line for the model: ``[image "cat.jpg" (image/jpeg, 9.8 KB)]`` plus why it is not shown
    or could not be used (``state`` or ``ref.note``), plus extracted text when there is some."""
    line = f"[{ref.kind} {quoted(ref.name)} ({ref.mime_type}, {human_size(ref.size)})"
    if ref.note:
        line += f": could not be used: {ref.note}"
    elif state:
        line += f": {state}"
    line += "]"
    if ref.text:
        line += "\n" + ref.text
    return line


def refs_of(meta: dict[str, Any] | None) -> list[MediaRef]:
    """The attachment references stored in a user row's ``meta``."""
    return [MediaRef.from_dict(a) for a in (meta or {}).get("attachments", ()) if isinstance(a, dict)]


def shown(ref: MediaRef) -> bool:
    """Whether ``ref`` has a rendition the model could be shown."""
    return bool(ref.image and ref.image.get("sha256")) and not ref.note


def image_part(ref: MediaRef) -> dict[str, Any]:
    """The placeholder ``image_url`` part of ``ref``'s rendition (resolved before sending)."""
    assert ref.image is not None
    return {"type": "image_url", "image_url": {"url": f"{BLOB_SCHEME}{ref.image['sha256']}"}}


def resolve_images(history: list[dict[str, Any]], read: Callable[[str], bytes],
                   mime_of: Callable[[str], str] | None = None) -> list[dict[str, Any]]:
    """``history`` with every placeholder image part replaced by a data URL of its blob (read
    with ``read(sha256)``); a blob that is gone becomes a text part saying so. Messages without
    placeholders are returned as they are (same objects)."""
    out: list[dict[str, Any]] = []
    for message in history:
        content = message.get("content")
        if not isinstance(content, list) or not any(_placeholder(p) for p in content):
            out.append(message)
            continue
        parts: list[dict[str, Any]] = []
        for part in content:
            sha = _placeholder(part)
            if sha is None:
                parts.append(part)
                continue
            try:
                data = read(sha)
            except BlobMissing:
                log.info("image %s is no longer stored; described instead", sha)
                parts.append({"type": "text", "text": "[this image is no longer stored]"})
                continue
            mime = mime_of(sha) if mime_of else _mime(data)
            parts.append({"type": "image_url", "image_url": {
                "url": f"data:{mime};base64,{base64.b64encode(data).decode()}"}})
        out.append({**message, "content": parts})
    return out


def strip_images(history: list[dict[str, Any]], why: str) -> list[dict[str, Any]]:
    """``history`` with every image part replaced by a text part ``[image not shown: why]`` (a model
    without vision); messages without image parts are returned as they are."""
    out = []
    for message in history:
        content = message.get("content")
        if not isinstance(content, list) or not any(isinstance(p, dict) and p.get("type") == "image_url"
                                                    for p in content):
            out.append(message)
            continue
        text = "\n".join(str(p.get("text") or "") for p in content if isinstance(p, dict) and p.get("type") == "text")
        images = sum(1 for p in content if isinstance(p, dict) and p.get("type") == "image_url")
        out.append({**message, "content": f"{text}\n[{images} image{'s' if images > 1 else ''} not shown: {why}]"})
    return out


def has_images(messages: list[dict[str, Any]]) -> bool:
    return any(isinstance(m.get("content"), list) and any(isinstance(p, dict) and p.get("type") == "image_url"
                                                          for p in m["content"]) for m in messages)


def _placeholder(part: Any) -> str | None:
    if isinstance(part, dict) and part.get("type") == "image_url":
        url = str((part.get("image_url") or {}).get("url") or "")
        if url.startswith(BLOB_SCHEME):
            return url[len(BLOB_SCHEME):]
    return None


def _mime(data: bytes) -> str:
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        return "image/png"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "image/gif"
    return "image/jpeg"
