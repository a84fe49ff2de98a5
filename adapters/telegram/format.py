"""Pure outbound formatting for Telegram: model Markdown -> plain text + entities, in chunks.

Sending plain text with ``entities`` (no ``parse_mode``) means Telegram never has markup to
misparse; the Markdown is converted by ``telegramify_markdown`` (CommonMark via markdown-it).
Chunks respect Telegram Bot API: sendMessage, 1-4096 characters counted in UTF-16 code units;
entity offsets and lengths are UTF-16 code units too.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

import pyromark
from telegramify_markdown import convert

from adapters.text import safe_cut

MAX_MESSAGE_UTF16 = 4096
_PARSE_OPTIONS = (pyromark.Options.ENABLE_TABLES | pyromark.Options.ENABLE_STRIKETHROUGH
                  | pyromark.Options.ENABLE_TASKLISTS | pyromark.Options.ENABLE_MATH)
"""The options ``telegramify_markdown`` parses with (its ``STANDARD_OPTIONS``), so the raw HTML found
here is the raw HTML it would drop."""


@dataclass(frozen=True, slots=True)
class Entity:
    """A Telegram MessageEntity: ``type`` with offset/length in UTF-16 units."""

    type: str
    offset: int
    length: int
    url: str | None = None
    language: str | None = None

    def to_api(self) -> dict[str, object]:
        """The Bot API ``MessageEntity`` object, as JSON (unset ``url``/``language`` left out, as
        python-telegram-bot's ``MessageEntity.to_dict`` leaves them out)."""
        data: dict[str, object] = {"type": self.type, "offset": self.offset, "length": self.length}
        if self.url:
            data["url"] = self.url
        if self.language:
            data["language"] = self.language
        return data


@dataclass(frozen=True, slots=True)
class Chunk:
    """One sendMessage worth of text and its entities."""

    text: str
    entities: tuple[Entity, ...]


def utf16_len(text: str) -> int:
    """Length of ``text`` in UTF-16 code units (astral characters count 2)."""
    return len(text) + sum(1 for ch in text if ord(ch) > 0xFFFF)


_HOST = re.compile(r"(?:[a-z0-9\-_!$,~*'();&+=]|%[0-9a-f]{2}|[^\x00-\x7f])+(?:\.(?:[a-z0-9\-_!$,~*'();&+=]|%[0-9a-f]{2}"
                   r"|[^\x00-\x7f])*)+")


def link_accepted(url: str) -> bool:
    """Whether the Bot API takes ``url`` as a ``text_link`` entity's URL. It checks it with TDLib's
    ``LinkManager::check_link`` (td/telegram/LinkManager.cpp, tdutils/td/utils/HttpUrl.cpp) and
    refuses the whole message otherwise (400 "entity URL '...' is invalid: URL host is empty" for
    ``#anchor`` or ``/a/path``, "Host is invalid" for ``./README.md``, "Wrong HTTP URL" for a host
    without a dot). This is a stricter subset: ``http``/``https`` with a host that has a dot (or an
    IPv6 address) and a valid port, or ``tg://``. A scheme-less ``README.md`` (which TDLib would
    turn into ``http://README.md/``) and ``mailto:`` (which it reads as ``http://mailto:x@host/``)
    are not kept: the link would lead somewhere else than the model meant."""
    if url.lower().startswith("tg://"):
        return bool(re.fullmatch(r"tg://[A-Za-z0-9_-]+(?:[/?][^\s]*)?", url))
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return False
    if parts.scheme.lower() not in ("http", "https") or port == 0 or any(ch.isspace() for ch in url):
        return False
    host = parts.netloc.rpartition("@")[2]
    host = host.rsplit(":", 1)[0] if port is not None and not host.endswith("]") else host
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            return False
        return True
    return bool(_HOST.fullmatch(host.lower()))


def literal_html(markdown: str) -> str:
    """``markdown`` with every raw HTML run (CommonMark inline HTML and HTML blocks: ``<T>``,
    ``List<String>``, ``<your-token>``, ``<!-- x -->``, ``<div>``) escaped as ``\\<``, so it is read
    as text. Telegram messages have no HTML to render (plain text + entities), and the converter
    drops raw HTML, an HTML block with the rest of its line or block. Code and autolinks
    (``<https://…>``) are not raw HTML and stay as they are. Only the ``<`` that opens each raw HTML
    run (an inline tag, a line of an HTML block) is escaped, then the text is parsed again: an HTML
    block read as a paragraph can show inline HTML and code of its own, and a ``<`` inside that code
    (``sort < in.txt`` in a fence within ``<details>``) stays as written (found by a review)."""
    for _pass in range(8):
        if "<" not in markdown:
            return markdown
        source = markdown.encode()
        spots = sorted({at for payload, where in pyromark.events_with_range(markdown, options=_PARSE_OPTIONS)
                        if isinstance(payload, dict) and ("InlineHtml" in payload or "Html" in payload)
                        and source[at := _first_non_blank(source, where["start"], where["end"])] == 0x3C})  # "<"
        if not spots:
            return markdown
        pieces, last = [], 0
        for at in spots:
            pieces += [source[last:at], b"\\"]
            last = at
        markdown = b"".join([*pieces, source[last:]]).decode()
    return markdown


def _first_non_blank(source: bytes, start: int, end: int) -> int:
    """The first byte of ``source[start:end]`` that is no space or tab (``start`` if none)."""
    at = start
    while at < end - 1 and source[at] in (0x20, 0x09):
        at += 1
    return at


def render_markdown(markdown: str) -> tuple[str, list[Entity]]:
    """Converts model Markdown to ``(plain_text, entities)``; plain text if conversion fails.
    A link whose URL Telegram would refuse (``link_accepted``) keeps its text without the link; raw
    HTML is shown as written (``literal_html``)."""
    try:
        text, raw_entities = convert(literal_html(markdown), latex_escape=False)
    except Exception:
        return markdown, []
    entities = [
        Entity(e.type, e.offset, e.length, getattr(e, "url", None), getattr(e, "language", None))
        for e in raw_entities
        if e.length > 0 and (e.type != "text_link" or link_accepted(str(getattr(e, "url", "") or "")))
    ]
    return text.rstrip("\n"), entities


def _split_points(text: str, start: int, limit_index: int) -> int:
    """Best cut in ``text[start:limit_index]``: after a blank line, a newline, then a space;
    else a hard cut that does not split a surrogate pair (Python str indexes code points)."""
    window = text[start:limit_index]
    fallback = 0
    for sep in ("\n\n", "\n", " "):
        cut = window.rfind(sep)
        if cut >= len(window) // 2:  # a separator that keeps the chunk at least half full
            return start + cut + len(sep)
        fallback = max(fallback, cut + len(sep) if cut > 0 else 0)
    return start + fallback if fallback else limit_index


def chunk_text(text: str, entities: list[Entity], limit: int = MAX_MESSAGE_UTF16) -> list[Chunk]:
    """Splits ``(text, entities)`` into chunks of at most ``limit`` UTF-16 units.

    Cuts fall after paragraph breaks, line breaks or spaces where possible, and never inside a
    character as the reader sees it (``adapters.text.safe_cut``: a ZWJ emoji, a flag, a letter and
    its combining marks; Python indexes code points, so a surrogate pair is never split). The chunks' texts
    concatenated equal ``text`` exactly; an entity crossing a cut is clipped into both chunks
    (a code block is closed at the cut and reopened in the next chunk with its language).
    """
    if len(text.encode("utf-16-le", "surrogatepass")) // 2 <= limit:
        return [Chunk(text, tuple(entities))]  # fits: no offset table (a Python loop per character)
    # UTF-16 offset of every code point index, for entity mapping.
    offsets = [0] * (len(text) + 1)
    total = 0
    for i, ch in enumerate(text):
        offsets[i] = total
        total += 2 if ord(ch) > 0xFFFF else 1
    offsets[len(text)] = total

    chunks: list[Chunk] = []
    start = 0
    while start < len(text):
        # Largest end index whose UTF-16 span from start fits the limit.
        budget = offsets[start] + limit
        end = start
        lo, hi = start, len(text)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if offsets[mid] <= budget:
                lo = mid
            else:
                hi = mid - 1
        end = lo
        if end < len(text):
            end = safe_cut(text, _split_points(text, start, end), start)
        u_start, u_end = offsets[start], offsets[end]
        clipped = []
        for entity in entities:
            e_start, e_end = entity.offset, entity.offset + entity.length
            lo_u, hi_u = max(e_start, u_start), min(e_end, u_end)
            if hi_u > lo_u:
                clipped.append(Entity(entity.type, lo_u - u_start, hi_u - lo_u, entity.url, entity.language))
        chunks.append(Chunk(text[start:end], tuple(clipped)))
        start = end
    return chunks


def format_reply(markdown: str, limit: int = MAX_MESSAGE_UTF16) -> list[Chunk]:
    """Model Markdown -> the chunks to send, in order. Whitespace-only chunks are dropped
    (Telegram rejects empty text); a reply with text that renders to nothing (``[](url)``, an
    empty quote) is sent as written, never dropped."""
    text, entities = render_markdown(markdown)
    chunks = [chunk for chunk in chunk_text(text, entities, limit) if chunk.text.strip()]
    if not chunks and markdown.strip():
        chunks = [chunk for chunk in chunk_text(markdown.strip(), [], limit) if chunk.text.strip()]
    return chunks
