"""A wire-level fake of the Telegram Bot API for the real python-telegram-bot to talk to.

Point PTB at it with ``Bot(token, base_url=f"{fake.url}/bot", base_file_url=f"{fake.url}/file/bot")``
(or the same two ``ApplicationBuilder`` settings). What is emulated follows PLATFORMS.md §1.4 and the
Bot API docs (https://core.telegram.org/bots/api): the ``{"ok", "result"}`` / ``{"ok": false,
"error_code", "description", "parameters"}`` envelope with HTTP status = ``error_code``; PTB's
form-urlencoded/multipart request bodies (nested objects arrive as JSON strings) and JSON bodies
(what the gateway's ``adapters.telegram.request`` sends without files); ``getUpdates`` long polling
with offsets and 409 conflicts; per-chat message ids; the 4096-UTF-16-unit text limit (1024 for
captions); command menus per ``BotCommandScope`` with setMyCommands' rules (unique 1-32 character
``a-z0-9_`` names, at most 100, descriptions 1-256; else 400 ``BOT_COMMAND_INVALID`` and friends); and
small HTML / MarkdownV2 checkers that reject what Telegram rejects most often.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import hashlib
import html
import io
import ipaddress
import itertools
import json
import re
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web
from PIL import Image

from tests.fakes.holds import Holds
from tests.fakes.server import ThreadedServer

TEXT_LIMIT = 4096  # sendMessage / editMessageText, UTF-16 code units after entity parsing
CAPTION_LIMIT = 1024  # media captions, UTF-16 code units
PHOTO_MAX_BYTES = 10 * 1000 * 1000  # sendPhoto: "The photo must be at most 10 MB in size"
PHOTO_MAX_SIDES = 10_000  # "The photo's width and height must not exceed 10000 in total"
PHOTO_MAX_RATIO = 20  # "Width and height ratio must be at most 20"
UPLOAD_MAX_BYTES = 50 * 1000 * 1000  # "bots can currently send files of any type of up to 50 MB in size"
JSON = dict[str, Any]
Predicate = Callable[["Call"], bool]

_JSON_FIELDS = {
    "reply_parameters", "reply_markup", "entities", "caption_entities", "allowed_updates",
    "link_preview_options", "commands", "reaction", "scope",
}
_INT_FIELDS = {
    "chat_id", "message_id", "message_thread_id", "offset", "limit", "timeout", "reply_to_message_id",
    "draft_id", "user_id", "cache_time", "max_connections", "from_chat_id",
}
_BOOL_FIELDS = {
    "drop_pending_updates", "disable_notification", "protect_content", "show_alert", "is_big",
    "allow_sending_without_reply", "disable_web_page_preview",
}
_HTML_TAGS = {
    "b": "bold", "strong": "bold", "i": "italic", "em": "italic", "u": "underline", "ins": "underline",
    "s": "strikethrough", "strike": "strikethrough", "del": "strikethrough", "tg-spoiler": "spoiler",
    "span": "spoiler", "a": "text_link", "code": "code", "pre": "pre", "blockquote": "blockquote",
    "tg-emoji": "custom_emoji",
}
_HTML_TAG_RE = re.compile(r"<(/?)([A-Za-z][A-Za-z0-9-]*)((?:\s[^<>]*)?)/?>")
_HTML_ATTR_RE = re.compile(r"""([\w-]+)(?:\s*=\s*(?:"([^"]*)"|'([^']*)'|([^\s"'>]+)))?""")
_HTML_ENTITY_RE = re.compile(r"&(lt|gt|amp|quot|#[0-9]+|#x[0-9A-Fa-f]+);")
_MD_PRE_LANG_RE = re.compile(r"([\w+#.-]*)\n")
_MD_RESERVED = set("_*[]()~`>#+-=|{}.!\\")
_MD_NAMES = {
    "bold": "Bold", "italic": "Italic", "underline": "Underline", "strikethrough": "Strikethrough",
    "spoiler": "Spoiler", "code": "Code", "pre": "Pre", "text_link": "TextUrl",
}
_WEBHOOK_CONFLICT = (
    "Conflict: can't use getUpdates method while webhook is active; use deleteWebhook to delete the "
    "webhook first"
)
_POLL_CONFLICT = (
    "Conflict: terminated by other getUpdates request; make sure that only one bot instance is running"
)
_COMMAND_RE = re.compile(r"[a-z0-9_]{1,32}")
MAX_COMMANDS = 100  # setMyCommands: "At most 100 commands can be specified"
ISO_639_1 = frozenset((
    "aa", "ab", "ae", "af", "ak", "am", "an", "ar", "as", "av", "ay", "az", "ba", "be", "bg", "bh", "bi",
    "bm", "bn", "bo", "br", "bs", "ca", "ce", "ch", "co", "cr", "cs", "cu", "cv", "cy", "da", "de", "dv",
    "dz", "ee", "el", "en", "eo", "es", "et", "eu", "fa", "ff", "fi", "fj", "fo", "fr", "fy", "ga", "gd",
    "gl", "gn", "gu", "gv", "ha", "he", "hi", "ho", "hr", "ht", "hu", "hy", "hz", "ia", "id", "ie", "ig",
    "ii", "ik", "io", "is", "it", "iu", "ja", "jv", "ka", "kg", "ki", "kj", "kk", "kl", "km", "kn", "ko",
    "kr", "ks", "ku", "kv", "kw", "ky", "la", "lb", "lg", "li", "ln", "lo", "lt", "lu", "lv", "mg", "mh",
    "mi", "mk", "ml", "mn", "mr", "ms", "mt", "my", "na", "nb", "nd", "ne", "ng", "nl", "nn", "no", "nr",
    "nv", "ny", "oc", "oj", "om", "or", "os", "pa", "pi", "pl", "ps", "pt", "qu", "rm", "rn", "ro", "ru",
    "rw", "sa", "sc", "sd", "se", "sg", "si", "sk", "sl", "sm", "sn", "so", "sq", "sr", "ss", "st", "su",
    "sv", "sw", "ta", "te", "tg", "th", "ti", "tk", "tl", "tn", "to", "tr", "ts", "tt", "tw", "ty", "ug",
    "uk", "ur", "uz", "ve", "vi", "vo", "wa", "wo", "xh", "yi", "yo", "za", "zh", "zu",
))
"""setMyCommands ``language_code``: "A two-letter ISO 639-1 language code" (every code ISO 639-1 assigns)."""
REACTION_EMOJI = frozenset((
    "👍", "👎", "❤", "🔥", "🥰", "👏", "😁", "🤔", "🤯", "😱", "🤬", "😢", "🎉", "🤩", "🤮", "💩",
    "🙏", "👌", "🕊", "🤡", "🥱",
    "🥴", "😍", "🐳", "❤\u200d🔥", "🌚", "🌭", "💯", "🤣", "⚡", "🍌", "🏆", "💔", "🤨", "😐",
    "🍓", "🍾", "💋", "🖕", "😈",
    "😴", "😭", "🤓", "👻", "👨\u200d💻", "👀", "🎃", "🙈", "😇", "😨", "🤝", "✍",
    "🤗", "🫡", "🎅", "🎄", "☃", "💅", "🤪",
    "🗿", "🆒", "💘", "🙉", "🦄", "😘", "💊", "🙊", "😎", "👾", "🤷\u200d♂", "🤷", "🤷\u200d♀", "😡",
))
"""Bot API ReactionTypeEmoji: the only emoji a bot may react with."""
MAX_COMMAND_DESCRIPTION = 256  # BotCommand.description: 1-256 characters
_SCOPE_TYPES = {"default", "all_private_chats", "all_group_chats", "all_chat_administrators", "chat",
                "chat_administrators", "chat_member"}
_NOT_MODIFIED = (
    "Bad Request: message is not modified: specified new message content and reply markup are exactly "
    "the same as a current content and reply markup of the message"
)


_URL_HOST_CHARS = set("abcdefghijklmnopqrstuvwxyz.0123456789-_!$,~*'();&+=")


def _parse_url(url: str) -> tuple[str | None, dict[str, Any]]:
    """TDLib ``parse_url`` (tdutils/td/utils/HttpUrl.cpp), which the Bot API applies to a
    ``text_link`` entity's URL: ``[http(s)://][userinfo@]host[:port][/query]``, a missing scheme
    read as ``http``. Returns ``(error, parts)``; ``error`` is TDLib's message or ``None``."""
    cut = next((k for k, ch in enumerate(url) if ch in ":/?#@[]"), len(url))
    https, pos = False, 0
    if url.startswith("://", cut):
        scheme = url[:cut].lower()
        if scheme not in ("http", "https"):
            return "Unsupported URL protocol", {}
        https, pos = scheme == "https", cut + 3
    end = next((k for k in range(pos, len(url)) if url[k] in "/?#"), len(url))
    authority = url[pos:end]
    colon, port = len(authority) - 1, 0
    while colon > 0 and authority[colon] not in ":]@":
        colon -= 1
    if colon > 0 and authority[colon] == ":":
        digits = authority[colon + 1:].lstrip("0") or authority[colon + 1:][-1:]
        port = int(digits) if re.fullmatch(r"-?[0-9]{1,10}", digits) and int(digits) != 0 else -1
        authority = authority[:colon]
    if port < 0 or port > 65535:
        return "Wrong port number specified in the URL", {}
    userinfo, _, host = authority.rpartition("@")
    ipv6 = len(host) >= 2 and host[0] == "[" and host[-1] == "]"
    if ipv6:
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            return "Wrong IPv6 address specified in the URL", {}
    if not host:
        return "URL host is empty", {}
    if host == ".":
        return "Host is invalid", {}
    if not ipv6:
        lowered, k = host.lower(), 0
        while k < len(lowered):
            ch = lowered[k]
            if ch == "%":
                if not re.fullmatch(r"[0-9a-f]{2}", lowered[k + 1:k + 3]):
                    return "Wrong percent-encoded symbol in URL host", {}
                k += 3
                continue
            if ch not in _URL_HOST_CHARS and ord(ch) < 128:
                return "Wrong URL host", {}
            k += 1
    return None, {"https": https, "userinfo": userinfo, "host": host, "ipv6": ipv6, "port": port}


def link_problem(link: str) -> str | None:
    """Why the Bot API refuses ``link`` as a ``text_link`` entity's URL, or ``None``: TDLib
    ``LinkManager::check_link`` (td/telegram/LinkManager.cpp). ``tg://`` and ``ton://`` links are
    taken as they are (no port, userinfo or ``https``); any other link goes through ``parse_url``
    (only ``http``/``https`` schemes; no scheme means ``http``) and needs a host with a dot (or an
    IPv6 address): ``#anchor`` and ``/a/path`` have no host, ``./README.md`` has the host ``.``,
    ``javascript:x`` a port that is not a number, ``localhost`` no dot."""
    lowered = link.lower()
    internal = "tg" if lowered.startswith("tg:") else "ton" if lowered.startswith("ton:") else None
    rest = link[len(internal) + 1:] if internal else link
    if internal and rest.startswith("//"):
        rest = rest[2:]
    error, parts = _parse_url(rest)
    if error:
        return error
    if internal:
        if rest.lower().startswith("http://") or parts["https"] or parts["userinfo"] or parts["port"] or parts["ipv6"]:
            return f"Wrong {internal} URL"
        if any(not (ch.isascii() and (ch.isalnum() or ch in "-_")) for ch in parts["host"]):
            return "Unallowed characters in URL host"
        return None
    if "." not in parts["host"] and not parts["ipv6"]:
        return "Wrong HTTP URL"
    return None


def utf16_len(text: str) -> int:
    """Length of ``text`` in UTF-16 code units, the unit of Telegram limits and entity offsets."""
    return len(text.encode("utf-16-le")) // 2


@dataclass
class Call:
    """One recorded Bot API call. ``time`` is ``time.monotonic()`` seconds at arrival; ``params`` are
    the merged, decoded parameters; ``files`` lists multipart file parts as
    ``{"name", "filename", "size" (bytes), "content_type"}``."""

    time: float
    method: str
    params: dict[str, Any]
    files: list[dict[str, Any]] = field(default_factory=list)


TOKEN_SHAPE = re.compile(r"\d+:[A-Za-z0-9_-]+")
"""A well-formed bot token (``123456:ABC-DEF...``, as @BotFather issues them)."""


class ApiError(Exception):
    """A Bot API error answer: HTTP ``status`` = ``error_code``, plus ``description``/``parameters``."""

    def __init__(self, status: int, description: str, parameters: dict[str, Any] | None = None) -> None:
        super().__init__(description)
        self.status, self.description, self.parameters = status, description, parameters

    def response(self) -> web.Response:
        body: dict[str, Any] = {"ok": False, "error_code": self.status, "description": self.description}
        if self.parameters:
            body["parameters"] = self.parameters
        return web.json_response(body, status=self.status)


def _bad(reason: str) -> ApiError:
    return ApiError(400, f"Bad Request: {reason}")


def _entity_error(reason: str) -> ApiError:
    return _bad(f"can't parse entities: {reason}")


class _Text:
    """Accumulates plain text with a running UTF-16 offset (for entity offsets)."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.pos = 0

    def add(self, s: str) -> None:
        self.parts.append(s)
        self.pos += utf16_len(s)

    def value(self) -> str:
        return "".join(self.parts)


def _finish(out: _Text, entities: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    entities = [e for e in entities if e["length"] > 0]
    entities.sort(key=lambda e: (e["offset"], -e["length"]))
    return out.value(), entities


def parse_html(src: str) -> tuple[str, list[dict[str, Any]]]:
    """Telegram ``parse_mode="HTML"`` (approximation): returns ``(plain_text, entities)`` or raises
    ``ApiError`` 400 "can't parse entities: ..." for unsupported or unbalanced tags and bare ``<``/``&``."""
    out, entities, stack = _Text(), [], []  # stack: (tag, type, start, attrs)
    i = 0
    while i < len(src):
        j = min((k for k in (src.find("<", i), src.find("&", i)) if k >= 0), default=len(src))
        out.add(src[i:j])
        if j >= len(src):
            break
        byte_off = len(src[:j].encode())
        if src[j] == "&":
            m = _HTML_ENTITY_RE.match(src, j)
            if not m:
                raise _entity_error(f"Character '&' must be escaped as &amp; at byte offset {byte_off}")
            out.add(html.unescape(m.group(0)))
            i = m.end()
            continue
        m = _HTML_TAG_RE.match(src, j)
        if not m:
            raise _entity_error(f'Unsupported start tag "" at byte offset {byte_off}')
        closing, tag, attr_src = m.group(1) == "/", m.group(2).lower(), m.group(3)
        if tag not in _HTML_TAGS:
            kind = "end" if closing else "start"
            raise _entity_error(f'Unsupported {kind} tag "{tag}" at byte offset {byte_off}')
        if closing:
            if not stack:
                raise _entity_error(f"Unexpected end tag at byte offset {byte_off}")
            open_tag, etype, start, attrs = stack.pop()
            if open_tag != tag:
                raise _entity_error(
                    f'Unmatched end tag at byte offset {byte_off}, expected "</{open_tag}>", found "</{tag}>"'
                )
            entity: dict[str, Any] = {"type": etype, "offset": start, "length": out.pos - start}
            if etype == "text_link":
                if not attrs.get("href"):
                    entity["length"] = 0
                entity["url"] = attrs.get("href", "")
            elif etype == "custom_emoji":
                entity["custom_emoji_id"] = attrs.get("emoji-id", "")
            elif etype == "blockquote" and "expandable" in attrs:
                entity["type"] = "expandable_blockquote"
            elif etype == "code" and stack and stack[-1][0] == "pre" and "class" in attrs:
                entity["length"] = 0  # <pre><code class="language-x"> sets the pre's language
                stack[-1][3]["language"] = attrs["class"].removeprefix("language-")
            elif etype == "pre" and attrs.get("language"):
                entity["language"] = attrs["language"]
            entities.append(entity)
        else:
            attrs = {
                a.group(1).lower(): html.unescape(a.group(2) or a.group(3) or a.group(4) or "")
                for a in _HTML_ATTR_RE.finditer(attr_src)
            }
            attrs.pop("language", None)
            stack.append((tag, _HTML_TAGS[tag], out.pos, attrs))
        i = m.end()
    if stack:
        raise _entity_error(f'Can\'t find end tag corresponding to start tag "{stack[-1][0]}"')
    return _finish(out, entities)


def parse_markdown_v2(src: str) -> tuple[str, list[dict[str, Any]]]:
    """Telegram ``parse_mode="MarkdownV2"`` (approximation): ``* _ __ ~ || ` ```
    [text](url)`` and ``>`` quotes; returns ``(plain_text, entities)``. Raises ``ApiError`` 400 for an
    unescaped reserved character (``_*[]()~`>#+-=|{}.!``) or an unclosed entity."""
    out, entities = _Text(), []
    stack: list[tuple[str, str, int, int]] = []  # (marker, type, start, byte offset)
    quote_start: int | None = None
    pre_lang, i, n = "", 0, len(src)

    def toggle(marker: str, etype: str, at: int) -> None:
        for k in range(len(stack) - 1, -1, -1):
            if stack[k][0] == marker:
                _, _, start, _ = stack.pop(k)
                entities.append({"type": etype, "offset": start, "length": out.pos - start})
                return
        stack.append((marker, etype, out.pos, len(src[:at].encode())))

    while i < n:
        c = src[i]
        in_code = bool(stack) and stack[-1][1] in ("code", "pre")
        if c == "\\":
            if i + 1 < n and 0 < ord(src[i + 1]) < 127:
                out.add(src[i + 1])
                i += 2
                continue
            raise _entity_error("Character '\\' is reserved and must be escaped with the preceding '\\'")
        if src.startswith("```", i) and (not in_code or stack[-1][1] == "pre"):
            toggle("```", "pre", i)
            if in_code:
                if pre_lang:
                    entities[-1]["language"] = pre_lang
                i += 3
            else:
                m = _MD_PRE_LANG_RE.match(src, i + 3)  # optional language line
                pre_lang, i = (m.group(1), m.end()) if m else ("", i + 3)
            continue
        if c == "`":
            toggle("`", "code", i)
            i += 1
            continue
        if in_code:
            out.add(c)
            i += 1
            continue
        if c == ">" and (i == 0 or src[i - 1] == "\n"):
            if quote_start is None:
                quote_start = out.pos
            i += 1
            continue
        if c == "\n" and quote_start is not None and not src.startswith(">", i + 1):
            entities.append({"type": "blockquote", "offset": quote_start, "length": out.pos - quote_start})
            quote_start = None
        step = 2 if src.startswith(("__", "||"), i) else 1
        if c == "*":
            toggle("*", "bold", i)
        elif c == "_":
            toggle(src[i : i + step], "underline" if step == 2 else "italic", i)
        elif c == "~":
            toggle("~", "strikethrough", i)
        elif c == "|" and step == 2:
            toggle("||", "spoiler", i)
        elif c == "[":
            stack.append(("[", "text_link", out.pos, len(src[:i].encode())))
        elif c == "]" and stack and stack[-1][0] == "[" and src.startswith("(", i + 1):
            url, k = [], i + 2
            while k < n and src[k] != ")":
                if src[k] == "\\" and k + 1 < n:
                    k += 1
                url.append(src[k])
                k += 1
            if k >= n:
                raise _entity_error(f"Can't find end of a URL at byte offset {len(src[: i + 1].encode())}")
            _, _, start, _ = stack.pop()
            link = {"type": "text_link", "offset": start, "length": out.pos - start, "url": "".join(url)}
            entities.append(link)
            i = k + 1
            continue
        elif c in _MD_RESERVED:
            raise _entity_error(f"Character '{c}' is reserved and must be escaped with the preceding '\\'")
        else:
            out.add(c)
        i += step if c in "_|" else 1
    if stack:
        _, etype, _, byte_off = stack[-1]
        raise _entity_error(f"Can't find end of {_MD_NAMES[etype]} entity at byte offset {byte_off}")
    if quote_start is not None:
        entities.append({"type": "blockquote", "offset": quote_start, "length": out.pos - quote_start})
    return _finish(out, entities)


def render(
    text: Any, parse_mode: Any, entities: Any, limit: int = TEXT_LIMIT, *, caption: bool = False
) -> tuple[str, list[dict[str, Any]] | None]:
    """Applies ``parse_mode`` or validates explicit ``entities`` the way sendMessage/editMessageText/
    captions do; returns ``(plain_text, entities or None)`` or raises ``ApiError`` 400 (empty text,
    longer than ``limit`` UTF-16 units, unparsable markup, entity out of bounds)."""
    text = "" if text is None else str(text)
    if not caption and not text.strip():
        raise _bad("message text is empty")
    ents: list[dict[str, Any]] | None = None
    if entities:
        if not isinstance(entities, list):
            raise _entity_error("entities must be an array")
        size = utf16_len(text)
        for k, e in enumerate(entities):
            off, length = (e.get("offset"), e.get("length")) if isinstance(e, dict) else (None, None)
            if not (isinstance(off, int) and isinstance(length, int) and "type" in e):
                raise _entity_error(f"entity {k} must have type, offset and length")
            if off < 0 or length <= 0 or off + length > size:
                raise _entity_error(f"entity {k} (offset {off}, length {length}) is out of the text bounds")
            if e["type"] == "text_link":
                url = str(e.get("url") or "")
                problem = link_problem(url)
                if problem is not None:  # TDLib get_message_entities: "Entity " + check_link's error
                    raise _bad(f"entity URL '{url}' is invalid: {problem}")
        ents = entities
    elif parse_mode:
        mode = str(parse_mode).lower()
        if mode == "html":
            text, ents = parse_html(text)
        elif mode == "markdownv2":
            text, ents = parse_markdown_v2(text)
        elif mode != "markdown":  # legacy Markdown: accepted as-is, not emulated
            raise _bad("unsupported parse_mode")
        ents = ents or None
    if not caption and not text.strip():
        raise _bad("message text is empty")
    if utf16_len(text) > limit:
        raise _bad("message caption is too long" if caption else "message is too long")
    return text, ents


class _Queued:
    __slots__ = ("delivered", "update", "update_id")

    def __init__(self, update: dict[str, Any]) -> None:
        self.update, self.update_id, self.delivered = update, int(update["update_id"]), False


class _Poller:
    __slots__ = ("event", "terminated")

    def __init__(self) -> None:
        self.event, self.terminated = asyncio.Event(), False


class FakeTelegram(ThreadedServer):
    """Fake Telegram Bot API server (PLATFORMS.md §1.4) on 127.0.0.1; defaults are the fixture bot.

    Routes ``POST|GET /bot{token}/{method}`` and ``GET /file/bot{token}/{file_path}``. Test-facing
    state: ``forum_chats`` (set of chat ids; when non-empty, ``message_thread_id`` is only accepted for
    these), ``files`` (file_id -> bytes served by ``getFile`` + the file route), ``webhook_url``,
    ``webhook_secret``, ``commands`` (the command menu per scope: ``"default"``,
    ``"all_private_chats"``, ``"all_group_chats"``, ``"chat:<id>"``, ...; see ``menu``),
    ``can_read_all_group_messages`` (what ``getMe`` reports: ``False`` = privacy mode on, Telegram's
    default for a new bot) and ``webhook_deliveries`` (``(update_id, status)`` pairs).
    """

    def __init__(
        self,
        token: str = "7000000001:AAFakeTokenForLoopbackTestsOnly0000",
        bot_id: int = 7000000001,
        username: str = "gateway_test_bot",
        first_name: str = "Gateway Test Bot",
        port: int = 0,
    ) -> None:
        super().__init__(port)
        self.token, self.bot_id, self.username, self.first_name = token, bot_id, username, first_name
        self.forum_chats: set[int] = set()
        self.migrated: dict[str, int] = {}
        """Groups upgraded to supergroups: old chat id (as text) -> the supergroup's id. Sending to
        the old id answers 400 with ``parameters.migrate_to_chat_id`` (Bot API "ResponseParameters")."""
        self.files: dict[str, bytes] = {}
        self.download_limit = 20 * 1024 * 1024
        """getFile's limit: "bots can download files of up to 20 MB" (cloud Bot API)."""
        self.webhook_url: str = ""
        self.webhook_secret: str | None = None
        self.commands: dict[str, list[dict[str, Any]]] = {}
        self.reactions: dict[tuple[int, int], list[str]] = {}
        """The bot's reaction on each ``(chat_id, message_id)`` (setMessageReaction; ``[]``: removed)."""
        self.can_read_all_group_messages = False
        self.webhook_deliveries: list[tuple[int, int]] = []
        self.uploads: list[dict[str, Any]] = []
        """Files the bot uploaded that became messages: ``{"method", "chat_id", "message_id",
        "filename", "size", "sha256", "content_type", "caption"}``, in order."""
        self.holds = Holds()
        """``holds.hold_next("sendPhoto")``: that call takes effect, its answer waits for ``release``."""
        self._lock = threading.Lock()
        self._calls: list[Call] = []
        self._faults: dict[str, deque[ApiError]] = {}
        self._floods: dict[str, float] = {}  # method -> monotonic time its flood control ends
        self._updates: list[_Queued] = []
        self._last_update_id = 0
        self._confirmed_offset = 0
        self._pollers: list[_Poller] = []
        self._closing = False
        self._messages: dict[tuple[Any, int], dict[str, Any]] = {}  # bot and injected messages
        self._last_message_id: dict[Any, int] = {}
        self._chats: dict[Any, dict[str, Any]] = {}
        self._file_ids = itertools.count(1)
        self._methods: dict[str, tuple[str, Callable[..., Any]]] = {
            name.lower(): (name, handler)
            for name, handler in {
                "getMe": self._get_me, "deleteWebhook": self._delete_webhook,
                "setWebhook": self._set_webhook, "getWebhookInfo": self._get_webhook_info,
                "getUpdates": self._get_updates, "sendMessage": self._send_message,
                "editMessageText": self._edit_message_text, "deleteMessage": self._delete_message,
                "sendChatAction": self._true, "answerCallbackQuery": self._true,
                "setMyCommands": self._set_my_commands, "getMyCommands": self._get_my_commands,
                "deleteMyCommands": self._delete_my_commands,
                "setMessageReaction": self._set_message_reaction, "sendMessageDraft": self._send_message_draft,
                "sendPhoto": self._send_photo, "sendDocument": self._send_document, "getFile": self._get_file,
            }.items()
        }

    # ---- test-facing API -------------------------------------------------------------------------

    def bot_user(self) -> JSON:
        """The bot as a Telegram ``User`` dict (the ``from`` of every message it sends)."""
        return {"id": self.bot_id, "is_bot": True, "first_name": self.first_name, "username": self.username}

    def calls(self, method: str | None = None) -> list[Call]:
        """Recorded calls (valid token only) in arrival order, optionally only those of ``method``."""
        with self._lock:
            calls = list(self._calls)
        name = self._canonical(method) if method else None
        return [c for c in calls if name is None or c.method == name]

    def _find_call(self, method: str, predicate: Predicate | None, since: int) -> Call | None:
        with self._lock:
            calls = self._calls[since:]
        name = self._canonical(method)
        return next((c for c in calls if c.method == name and (predicate is None or predicate(c))), None)

    def _timeout_error(self, method: str, timeout: float) -> TimeoutError:
        seen = [c.method for c in self.calls()]
        return TimeoutError(f"no matching {method} call within {timeout} s; calls so far: {seen}")

    async def wait_for_call(
        self, method: str, predicate: Predicate | None = None, timeout: float = 5.0, *, since: int = 0
    ) -> Call:
        """Waits (from any event loop, by polling every 10 ms) for a recorded ``method`` call matching
        ``predicate(call)``; ``since`` skips the first N entries of the full log (pass
        ``len(fake.calls())`` taken before acting). Raises ``TimeoutError`` after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while (found := self._find_call(method, predicate, since)) is None:
            if time.monotonic() >= deadline:
                raise self._timeout_error(method, timeout)
            await asyncio.sleep(0.01)
        return found

    def wait_for_call_sync(
        self, method: str, predicate: Predicate | None = None, timeout: float = 5.0, *, since: int = 0
    ) -> Call:
        """Blocking twin of ``wait_for_call`` for synchronous tests or worker threads."""
        deadline = time.monotonic() + timeout
        while (found := self._find_call(method, predicate, since)) is None:
            if time.monotonic() >= deadline:
                raise self._timeout_error(method, timeout)
            time.sleep(0.01)
        return found

    def sent_messages(self, chat_id: int | str | None = None) -> list[dict[str, Any]]:
        """Messages the bot sent and that still exist, in send order, as they are now (after edits)."""
        with self._lock:
            msgs = [copy.deepcopy(m) for m in self._messages.values() if self._is_own(m)]
        return [m for m in msgs if chat_id is None or m["chat"]["id"] == chat_id]

    def inject(self, update: dict[str, Any]) -> int:
        """Queues an Update for ``getUpdates`` (callable from any thread) and wakes a waiting poller.

        Assigns ``update_id`` (last + 1) when absent and keeps an explicit one, so replaying a fixture
        duplicate keeps the original id. Every injected update is returned at least once, even when its
        id is below an offset confirmed earlier (models Telegram re-sending an unconfirmed update);
        after that, a ``getUpdates`` with ``offset > update_id`` removes it. Returns the update_id."""
        upd = copy.deepcopy(update)
        with self._lock:
            if "update_id" not in upd:
                upd["update_id"] = self._last_update_id + 1
            self._last_update_id = max(self._last_update_id, int(upd["update_id"]))
            self._updates.append(_Queued(upd))
            self._learn(upd)
        if self._loop is not None and self._loop.is_running():
            self._loop.call_soon_threadsafe(self._wake_pollers)
        return int(upd["update_id"])

    def add_chat(self, chat: dict[str, Any]) -> None:
        """Makes a Telegram ``Chat`` known, as if its user had written to the bot before (chat
        scopes and ``getChat``-like lookups need that)."""
        with self._lock:
            self._chats[chat["id"]] = copy.deepcopy(chat)

    def delete_by_user(self, chat_id: int, message_id: int) -> None:
        """A user deletes the bot's message for everyone (private chats allow it; Telegram sends the
        bot no update): later ``editMessageText`` of it answers 400 "message to edit not found"."""
        with self._lock:
            del self._messages[(chat_id, message_id)]

    @property
    def confirmed_offset(self) -> int:
        """Highest positive ``offset`` any getUpdates call has sent (0 before the first)."""
        with self._lock:
            return self._confirmed_offset

    async def post_webhook(
        self, url: str | None, update: dict[str, Any], secret_token: str | None = None
    ) -> int:
        """Delivers ``update`` the way Telegram's webhook does: POST JSON to ``url`` (default: the
        ``setWebhook`` URL) with ``X-Telegram-Bot-Api-Secret-Token: secret_token`` (default: the
        ``setWebhook`` secret; ``""`` sends no header). Usable from the test's loop; returns the HTTP
        status, also appended to ``webhook_deliveries``."""
        upd = dict(update)
        with self._lock:
            if "update_id" not in upd:
                upd["update_id"] = self._last_update_id + 1
            self._last_update_id = max(self._last_update_id, int(upd["update_id"]))
            self._learn(upd)
        secret = self.webhook_secret if secret_token is None else secret_token
        headers = {"X-Telegram-Bot-Api-Secret-Token": secret} if secret else {}
        async with aiohttp.ClientSession() as session, session.post(
            url or self.webhook_url, json=upd, headers=headers, timeout=aiohttp.ClientTimeout(total=10)
        ) as resp:
            status = resp.status
        self.webhook_deliveries.append((int(upd["update_id"]), status))
        return status

    def fail_next(
        self, method: str, status: int, description: str | None = None, parameters: JSON | None = None
    ) -> None:
        """Queues a canned error for the next call of ``method`` (one per call; queue several for a
        streak), e.g. ``fail_next("sendMessage", 429, parameters={"retry_after": 1})``. The call is
        still recorded; no state changes. ``description`` defaults to Telegram's wording per status."""
        if description is None:
            retry = (parameters or {}).get("retry_after")
            description = {
                400: "Bad Request: can't parse entities: Character '.' is reserved and must be escaped "
                "with the preceding '\\'",
                403: "Forbidden: bot was blocked by the user",
                409: _POLL_CONFLICT,
                429: f"Too Many Requests: retry after {retry}",
            }.get(status, "Bad Gateway")
        with self._lock:
            self._faults.setdefault(self._canonical(method), deque()).append(
                ApiError(status, description, parameters)
            )

    def flood(self, method: str, seconds: float) -> None:
        """Flood control on ``method`` for ``seconds``: every call meanwhile is answered 429 with
        ``parameters.retry_after``, "the number of seconds left to wait before the request can be
        repeated" (Bot API, ResponseParameters), counted from that call."""
        with self._lock:
            self._floods[self._canonical(method)] = time.monotonic() + seconds

    def stop(self) -> None:
        """Releases pending long polls (so shutdown is instant), then stops the server."""
        if self._loop is not None and self._loop.is_running():
            self._loop.call_soon_threadsafe(self._release_pollers)
        super().stop()

    # ---- plumbing --------------------------------------------------------------------------------

    def build_app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/bot{token}/{method}", self._handle_method)
        app.router.add_get("/file/bot{token}/{file_path:.+}", self._handle_file)
        return app

    def _canonical(self, method: str) -> str:
        return self._methods.get(method.lower(), (method, None))[0]

    def _token_error(self, token: str) -> ApiError | None:
        """Telegram's answer to a wrong token: 404 ``Not Found`` when it is not shaped like a bot
        token (``<bot id>:<secret>``), 401 ``Unauthorized`` when it is but is not valid."""
        if token == self.token:
            return None
        return ApiError(401, "Unauthorized") if TOKEN_SHAPE.fullmatch(token) else ApiError(404, "Not Found")

    async def _handle_method(self, request: web.Request) -> web.StreamResponse:
        if (error := self._token_error(request.match_info["token"])) is not None:
            return error.response()
        entry = self._methods.get(request.match_info["method"].lower())
        if entry is None:
            return ApiError(404, "Not Found").response()
        name, handler = entry
        try:
            params, files = await self._read_params(request)
        except ApiError as exc:
            return exc.response()
        recorded = [{k: v for k, v in f.items() if k != "data"} for f in files]
        with self._lock:
            self._calls.append(Call(time.monotonic(), name, params, recorded))
            faults = self._faults.get(name)
            fault = faults.popleft() if faults else None
            left = self._floods.get(name, 0.0) - time.monotonic()
            if fault is None and left > 0:
                wait = max(1, int(left + 0.999))
                fault = ApiError(429, f"Too Many Requests: retry after {wait}", {"retry_after": wait})
        if fault is not None:
            return fault.response()
        try:
            result = handler(params, files)
            if asyncio.iscoroutine(result):
                result = await result
        except ApiError as exc:
            return exc.response()
        await self.holds.gate(name)  # a held call took effect; its answer may never reach the bot
        return web.json_response({"ok": True, "result": result})

    async def _handle_file(self, request: web.Request) -> web.StreamResponse:
        if (error := self._token_error(request.match_info["token"])) is not None:
            return error.response()
        data = self.files.get(request.match_info["file_path"].removeprefix("files/"))
        if data is None or len(data) > self.download_limit:
            return ApiError(404, "Not Found").response()
        return web.Response(body=data, content_type="application/octet-stream")

    async def _read_params(self, request: web.Request) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        params: dict[str, Any] = dict(request.query)
        files: list[dict[str, Any]] = []
        if request.content_type == "application/json":
            try:
                body = await request.json() if request.can_read_body else {}
            except ValueError:
                raise _bad("can't parse JSON request body") from None
            params.update(body if isinstance(body, dict) else {})
        elif request.content_type in ("application/x-www-form-urlencoded", "multipart/form-data"):
            for key, value in (await request.post()).items():
                if isinstance(value, web.FileField):
                    data = value.file.read()
                    files.append({"name": key, "filename": value.filename, "size": len(data),
                                  "content_type": value.content_type, "data": data})
                else:
                    params[key] = value
        for key, value in list(params.items()):
            if key in _JSON_FIELDS and isinstance(value, str):
                try:
                    params[key] = json.loads(value)
                except ValueError:
                    raise _bad(f"can't parse {key} JSON object") from None
            elif key in _INT_FIELDS and isinstance(value, str) and re.fullmatch(r"-?\d+", value.strip()):
                params[key] = int(value)
            elif key in _BOOL_FIELDS and isinstance(value, str) and value.lower() in ("true", "false"):
                params[key] = value.lower() == "true"
        return params, files

    def _learn(self, update: dict[str, Any]) -> None:
        """Remembers chats and messages seen in an update (caller holds the lock); malformed ones
        (tests inject those too) are not Telegram's and are not learned."""
        for kind in ("message", "edited_message", "channel_post", "edited_channel_post"):
            msg = update.get(kind)
            if isinstance(msg, dict) and isinstance(msg.get("chat"), dict) and type(msg.get("message_id")) is int \
                    and type(msg["chat"].get("id")) is int:
                chat_id = msg["chat"]["id"]
                self._chats[chat_id] = msg["chat"]
                self._messages[(chat_id, msg["message_id"])] = copy.deepcopy(msg)
                self._last_message_id[chat_id] = max(self._last_message_id.get(chat_id, 0), msg["message_id"])

    def _is_own(self, msg: JSON) -> bool:
        sender = msg.get("from")
        return isinstance(sender, dict) and sender.get("id") == self.bot_id

    def _wake_pollers(self) -> None:
        for poller in self._pollers:
            poller.event.set()

    def _release_pollers(self) -> None:
        self._closing = True
        self._wake_pollers()

    def _chat(self, chat_id: Any) -> JSON:
        if chat_id in self._chats:
            return copy.deepcopy(self._chats[chat_id])
        if isinstance(chat_id, int) and chat_id > 0:
            return {"id": chat_id, "type": "private", "first_name": "User"}
        if isinstance(chat_id, int) and not str(chat_id).startswith("-100"):
            return {"id": chat_id, "type": "group", "title": "Group"}
        chat = {"id": chat_id, "type": "supergroup", "title": "Supergroup"}
        if chat_id in self.forum_chats:
            chat["is_forum"] = True
        return chat

    def _require_chat(self, params: dict[str, Any]) -> Any:
        chat_id = params.get("chat_id")
        if chat_id in (None, ""):
            raise _bad("chat_id is empty")
        if str(chat_id) in self.migrated:
            raise ApiError(400, "Bad Request: group chat was upgraded to a supergroup chat",
                           {"migrate_to_chat_id": self.migrated[str(chat_id)]})
        thread = params.get("message_thread_id")
        if thread is not None and self.forum_chats and chat_id not in self.forum_chats:
            raise _bad("message thread not found")
        return chat_id

    def _new_message(self, params: dict[str, Any], content: dict[str, Any]) -> JSON:
        chat_id = self._require_chat(params)
        with self._lock:
            message_id = self._last_message_id.get(chat_id, 0) + 1
            self._last_message_id[chat_id] = message_id
            msg: JSON = {"message_id": message_id, "from": self.bot_user(), "chat": self._chat(chat_id),
                         "date": int(time.time())}
            thread = params.get("message_thread_id")
            if thread is not None:
                msg["message_thread_id"] = thread
                if chat_id in self.forum_chats or msg["chat"].get("is_forum"):
                    msg["is_topic_message"] = True
            reply = params.get("reply_parameters")
            if not isinstance(reply, dict) and params.get("reply_to_message_id") is not None:
                reply = {"message_id": params["reply_to_message_id"]}
            if isinstance(reply, dict):
                quoted = self._messages.get((reply.get("chat_id", chat_id), reply.get("message_id")))
                if quoted is not None:
                    msg["reply_to_message"] = {k: v for k, v in quoted.items() if k != "reply_to_message"}
            msg.update({k: v for k, v in content.items() if v is not None})
            if isinstance(params.get("reply_markup"), dict):
                msg["reply_markup"] = params["reply_markup"]
            self._messages[(chat_id, message_id)] = msg
            return copy.deepcopy(msg)

    # ---- Bot API methods -------------------------------------------------------------------------

    def _true(self, params: JSON, files: list[JSON]) -> bool:
        return True

    def _get_me(self, params: JSON, files: list[JSON]) -> JSON:
        return {**self.bot_user(), "can_join_groups": True,
                "can_read_all_group_messages": self.can_read_all_group_messages,
                "supports_inline_queries": False}

    def _set_webhook(self, params: JSON, files: list[JSON]) -> bool:
        secret = params.get("secret_token")
        if secret and not re.fullmatch(r"[A-Za-z0-9_-]{1,256}", str(secret)):
            raise _bad("secret token contains unallowed characters")
        self.webhook_url, self.webhook_secret = str(params.get("url") or ""), secret or None
        if params.get("drop_pending_updates"):
            with self._lock:
                self._updates.clear()
        return True

    def _delete_webhook(self, params: JSON, files: list[JSON]) -> bool:
        return self._set_webhook({"drop_pending_updates": params.get("drop_pending_updates")}, files)

    def _get_webhook_info(self, params: JSON, files: list[JSON]) -> JSON:
        with self._lock:
            pending = len(self._updates)
        return {"url": self.webhook_url, "has_custom_certificate": False, "pending_update_count": pending}

    def _take_updates(self, offset: int, limit: int) -> list[dict[str, Any]]:
        with self._lock:
            if offset < 0:
                self._updates = self._updates[offset:]
            elif offset > 0:
                self._confirmed_offset = max(self._confirmed_offset, offset)
                self._updates = [q for q in self._updates if not (q.delivered and q.update_id < offset)]
            batch = self._updates[:limit]
            for queued in batch:
                queued.delivered = True
            return [copy.deepcopy(q.update) for q in batch]

    async def _get_updates(self, params: JSON, files: list[JSON]) -> list[dict[str, Any]]:
        """Long poll: terminates an overlapping older poll with 409, then waits ≤ ``timeout`` s."""
        if self.webhook_url:
            raise ApiError(409, _WEBHOOK_CONFLICT)
        offset = params.get("offset") if isinstance(params.get("offset"), int) else 0
        limit = min(max(params["limit"], 1), 100) if isinstance(params.get("limit"), int) else 100
        timeout = max(params["timeout"], 0) if isinstance(params.get("timeout"), int) else 0
        for older in self._pollers:
            older.terminated = True
            older.event.set()
        me = _Poller()
        self._pollers.append(me)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            while True:
                me.event.clear()
                if me.terminated:
                    raise ApiError(409, _POLL_CONFLICT)
                batch = self._take_updates(offset, limit)
                remaining = deadline - loop.time()
                if batch or remaining <= 0 or self._closing:
                    return batch
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(me.event.wait(), remaining)
        finally:
            self._pollers.remove(me)

    def _send_message(self, params: JSON, files: list[JSON]) -> JSON:
        text, entities = render(params.get("text"), params.get("parse_mode"), params.get("entities"))
        return self._new_message(params, {"text": text, "entities": entities})

    def _send_message_draft(self, params: JSON, files: list[JSON]) -> bool:
        self._require_chat(params)
        render(params.get("text"), params.get("parse_mode"), params.get("entities"))
        return True

    def _edit_message_text(self, params: JSON, files: list[JSON]) -> JSON:
        key = (params.get("chat_id"), params.get("message_id"))
        text, entities = render(params.get("text"), params.get("parse_mode"), params.get("entities"))
        with self._lock:
            msg = self._messages.get(key)
            if msg is None:
                raise _bad("message to edit not found")
            if not self._is_own(msg):
                raise _bad("message can't be edited")
            if "text" not in msg:
                raise _bad("there is no text in the message to edit")
            markup = params.get("reply_markup") if isinstance(params.get("reply_markup"), dict) else None
            if (text, entities, markup) == (msg["text"], msg.get("entities"), msg.get("reply_markup")):
                raise ApiError(400, _NOT_MODIFIED)
            msg["text"], msg["edit_date"] = text, int(time.time())
            for name, value in (("entities", entities), ("reply_markup", markup)):
                if value:
                    msg[name] = value
                else:
                    msg.pop(name, None)
            return copy.deepcopy(msg)

    def _delete_message(self, params: JSON, files: list[JSON]) -> bool:
        with self._lock:
            if self._messages.pop((params.get("chat_id"), params.get("message_id")), None) is None:
                raise _bad("message to delete not found")
        return True

    def _set_message_reaction(self, params: JSON, files: list[JSON]) -> bool:
        """setMessageReaction as the Bot API checks it: a known chat, ``reaction`` a list of at most one
        ``ReactionTypeEmoji`` for bots whose ``emoji`` is on Telegram's fixed list (else 400
        ``REACTION_INVALID``); ``[]`` or none removes the bot's reaction. Recorded in ``reactions``."""
        chat_id, message_id = params.get("chat_id"), params.get("message_id")
        if isinstance(chat_id, str) and re.fullmatch(r"-?\d+", chat_id):
            chat_id = int(chat_id)
        with self._lock:
            if chat_id not in self._chats:
                raise _bad("chat not found")
        reaction = params.get("reaction") or []
        if not isinstance(reaction, list) or len(reaction) > 1:
            raise _bad("REACTIONS_TOO_MANY")
        for item in reaction:
            if not isinstance(item, dict) or item.get("type") != "emoji" or item.get("emoji") not in REACTION_EMOJI:
                raise _bad("REACTION_INVALID")
        with self._lock:
            self.reactions[(int(chat_id), int(message_id or 0))] = [item["emoji"] for item in reaction]
        return True

    def _scope_key(self, params: JSON) -> str:
        """The menu key of ``scope`` (BotCommandScope; default ``{"type": "default"}``) plus
        ``language_code``: ``"all_private_chats"``, ``"chat:5550001"``, ``"default/de"``. Raises 400 as
        Telegram does for an unknown type, a chat scope without a known ``chat_id`` ("chat not found")
        or a bad language code."""
        scope = params.get("scope") or {"type": "default"}
        kind = scope.get("type") if isinstance(scope, dict) else None
        if kind not in _SCOPE_TYPES:
            raise _bad("unsupported bot command scope specified")
        key = str(kind)
        if kind in ("chat", "chat_administrators", "chat_member"):
            chat_id = scope.get("chat_id")
            if isinstance(chat_id, str) and re.fullmatch(r"-?\d+", chat_id):
                chat_id = int(chat_id)
            with self._lock:
                known = chat_id in self._chats
            if not known:
                raise _bad("chat not found")
            key = f"{kind}:{chat_id}"
            if kind == "chat_member":
                key += f":{scope.get('user_id')}"
        language = str(params.get("language_code") or "")
        if language and language not in ISO_639_1:
            raise _bad("invalid language code specified")
        return f"{key}/{language}" if language else key

    def _set_my_commands(self, params: JSON, files: list[JSON]) -> bool:
        """setMyCommands with the Bot API's checks (tdlib ``set_commands`` and the server's answers):
        at most 100 commands; each ``command`` 1-32 characters of ``a-z``, ``0-9`` and ``_`` (a
        leading ``/`` is dropped), unique in the list; each ``description`` 1-256 characters after
        trimming. Otherwise 400 with Telegram's description, and the menu stays as it was."""
        commands = params.get("commands")
        if not isinstance(commands, list):
            raise _bad("can't parse commands JSON object")
        key = self._scope_key(params)
        if len(commands) > MAX_COMMANDS:
            raise _bad("BOT_COMMANDS_TOO_MUCH")
        seen: set[str] = set()
        menu: list[dict[str, Any]] = []
        for item in commands:
            if not isinstance(item, dict) or "command" not in item:
                raise _bad("can't parse BotCommand: Can't find field \"command\"")
            if "description" not in item:
                raise _bad("can't parse BotCommand: Can't find field \"description\"")
            name = str(item["command"]).strip().removeprefix("/")
            description = str(item["description"]).strip()
            if not name:
                raise _bad("command must be non-empty")
            if len(name) > 32:
                raise _bad("command length must not exceed 32")
            if not description:
                raise _bad("command description must be non-empty")
            if len(description) > MAX_COMMAND_DESCRIPTION:
                raise _bad(f"command description length must not exceed {MAX_COMMAND_DESCRIPTION}")
            if not _COMMAND_RE.fullmatch(name) or name in seen:
                raise _bad("BOT_COMMAND_INVALID")
            seen.add(name)
            menu.append({"command": name, "description": description})
        with self._lock:
            self.commands[key] = menu
        return True

    def _get_my_commands(self, params: JSON, files: list[JSON]) -> list[dict[str, Any]]:
        key = self._scope_key(params)
        with self._lock:
            return copy.deepcopy(self.commands.get(key, []))

    def _delete_my_commands(self, params: JSON, files: list[JSON]) -> bool:
        key = self._scope_key(params)
        with self._lock:
            self.commands.pop(key, None)
        return True

    def menu(self, chat_id: int, *, admin: bool = False, language: str = "") -> list[str]:
        """The command names a Telegram client shows in ``chat_id``: ``menu_entries``' names."""
        return [c["command"] for c in self.menu_entries(chat_id, admin=admin, language=language)]

    def menu_entries(self, chat_id: int, *, admin: bool = False, language: str = "") -> list[dict[str, Any]]:
        """The commands (``{"command", "description"}``) a Telegram client whose language is
        ``language`` shows in ``chat_id``: the most specific non-empty scope wins, and within a
        scope the menu for the user's ``language_code`` before the one without (Bot API
        "Determining list of commands": chat > all_private_chats / all_chat_administrators >
        all_group_chats > default)."""
        chat = self._chat(chat_id)
        private = chat.get("type") == "private"
        keys = [f"chat:{chat_id}"]
        keys += ["all_private_chats"] if private else (["all_chat_administrators"] if admin else []) + [
            "all_group_chats"]
        with self._lock:
            for key in [*keys, "default"]:
                for variant in ([f"{key}/{language}"] if language else []) + [key]:
                    if self.commands.get(variant):
                        return copy.deepcopy(self.commands[variant])
        return []

    def _check_upload(self, kind: str, part: JSON) -> tuple[int, int] | None:
        """Telegram's rules for an uploaded file (Bot API sendPhoto / sendDocument, "Sending
        files"); returns a photo's ``(width, height)``."""
        data = part["data"]
        if not data:
            raise _bad("file must be non-empty")
        if len(data) > UPLOAD_MAX_BYTES:
            raise ApiError(413, "Request Entity Too Large")
        if kind != "photo":
            return None
        if len(data) > PHOTO_MAX_BYTES:
            raise _bad("PHOTO_SAVE_FILE_INVALID")
        try:  # Telegram decodes a photo to make its sizes: a damaged one it cannot (Telethon: "probably corrupt")
            with Image.open(io.BytesIO(data)) as image:
                width, height = image.size
                image.load()
        except Exception:
            raise _bad("IMAGE_PROCESS_FAILED") from None
        if width + height > PHOTO_MAX_SIDES or max(width, height) > PHOTO_MAX_RATIO * min(width, height):
            raise _bad("PHOTO_INVALID_DIMENSIONS")
        return width, height

    def _media(self, kind: str, params: JSON, files: list[JSON]) -> JSON:
        part = next((f for f in files if f["name"] == kind), None)
        if part is None and isinstance(params.get(kind), str) and params[kind].startswith("attach://"):
            part = next((f for f in files if f["name"] == params[kind][len("attach://"):]), None)
        if part is None and not isinstance(params.get(kind), str):
            raise _bad(f"there is no {kind} in the request")
        dimensions = self._check_upload(kind, part) if part is not None else None
        if part is not None or str(params[kind]).startswith(("http://", "https://", "attach://")):
            file_id = f"FAKE{kind}{next(self._file_ids):06d}"
            self.files[file_id] = part["data"] if part else b"fake-" + file_id.encode()
        else:
            file_id = str(params[kind])
        caption, entities = render(params.get("caption"), params.get("parse_mode"),
                                   params.get("caption_entities"), CAPTION_LIMIT, caption=True)
        size = len(self.files.get(file_id, b""))
        meta = {"file_id": file_id, "file_unique_id": f"U{file_id}"[:32], "file_size": size}
        if kind == "photo":
            width, height = dimensions or (640, 480)
            media: Any = [{**meta, "width": width, "height": height}]
        else:
            media = {**meta, "file_name": (part or {}).get("filename") or "document",
                     "mime_type": (part or {}).get("content_type") or "application/octet-stream"}
        content = {kind: media, "caption": caption or None, "caption_entities": entities}
        message = self._new_message(params, content)
        if part is not None:
            with self._lock:
                self.uploads.append({"method": "sendPhoto" if kind == "photo" else "sendDocument",
                                     "chat_id": message["chat"]["id"], "message_id": message["message_id"],
                                     "filename": part.get("filename"), "size": len(part["data"]),
                                     "sha256": hashlib.sha256(part["data"]).hexdigest(),
                                     "content_type": part.get("content_type"), "caption": caption or None})
        return message

    def _send_photo(self, params: JSON, files: list[JSON]) -> JSON:
        return self._media("photo", params, files)

    def _send_document(self, params: JSON, files: list[JSON]) -> JSON:
        return self._media("document", params, files)

    def _get_file(self, params: JSON, files: list[JSON]) -> JSON:
        """Bot API getFile: a file the bot may download (``files``) gets a ``file_path``; an unknown
        id is 400 "Bad Request: invalid file_id"; above ``download_limit`` (20 MB on the cloud Bot
        API) 400 "Bad Request: file is too big"."""
        file_id = str(params.get("file_id") or "")
        data = self.files.get(file_id)
        if not file_id or data is None:
            raise _bad("invalid file_id")
        if len(data) > self.download_limit:
            raise _bad("file is too big")
        return {"file_id": file_id, "file_unique_id": f"U{file_id}"[:32], "file_size": len(data),
                "file_path": f"files/{file_id}"}

    def add_file(self, file_id: str, data: bytes) -> str:
        """Makes ``data`` downloadable as ``file_id`` (what a user's upload is on Telegram's side)."""
        self.files[file_id] = data
        return file_id
