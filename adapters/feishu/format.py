"""Pure outbound formatting for Feishu/Lark: model Markdown -> ``post`` (rich text) messages, in parts.

Why a structured ``post`` and not an interactive card or the post ``md`` tag: a post is an ordinary chat
message (quotable, copyable, searchable); its elements render the same on every client version, while
card markdown needs card JSON 2.0 for code blocks and headings and the ``md`` tag's syntax support
varies by client. Mapping (Feishu open API: im/v1 message content, "post" rich text):

- paragraphs -> rows of ``text`` elements with ``style`` (``bold``, ``italic``, ``lineThrough``);
- links and images -> ``a`` elements (images are not uploaded: the link keeps the URL); only
  ``http(s)`` links: Feishu refuses a post with any other ``href`` (230001 "invalid href", "scheme not
  in scheme whitelist"), so a relative, ``#anchor``, ``file://`` or ``mailto:`` link is its text;
- fenced/indented code and tables -> a ``code_block`` element alone in its row (tables aligned);
- headings -> bold rows; lists -> rows prefixed ``•`` / ``1.``, nested lists indented; quotes -> ``> ``;
- inline code keeps its backticks (posts have no inline-code style); ``---`` -> ``hr``.

Size (Feishu open API: im/v1/messages create/reply, error 230025): a ``post``/``interactive`` request
body ≤ 30 KB, a ``text`` body ≤ 150 KB. ``content`` is a JSON string inside the JSON body, so sizes are
measured after both encodings; long replies are split between rows, and oversized rows (a huge code
block or paragraph) are cut at line breaks or spaces.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import pyromark

from adapters.text import safe_cut

POST_LIMIT_BYTES = 30 * 1024
"""Feishu: post/interactive message request body ≤ 30 KB."""
TEXT_LIMIT_BYTES = 150 * 1024
"""Feishu: text message request body ≤ 150 KB."""
BODY_OVERHEAD_BYTES = 512
"""Room for ``receive_id``/``msg_type``/``uuid``/``reply_in_thread`` around ``content`` in the body."""

_OPTIONS = pyromark.Options.ENABLE_TABLES | pyromark.Options.ENABLE_STRIKETHROUGH
_HTTP_LINK = re.compile(r"(?i)https?://\S")
"""The ``href`` values Feishu takes in a post's ``a`` element."""
_STYLE = {"Strong": "bold", "Emphasis": "italic", "Strikethrough": "lineThrough"}
_INDENT = "\u00a0" * 4  # leading ASCII spaces may be collapsed by clients; no-break spaces are kept
# Feishu post code_block ``language`` values (case-insensitive); others are sent without a language.
_LANGUAGES = {
    "python", "c", "cpp", "csharp", "go", "java", "kotlin", "swift", "php", "ruby", "rust", "javascript",
    "typescript", "bash", "shell", "sql", "json", "xml", "yaml", "html", "css", "markdown", "lua", "dart",
    "scala", "r", "perl", "powershell", "dockerfile", "makefile", "graphql", "thrift", "protobuf", "diff",
}
_ALIASES = {
    "py": "python", "js": "javascript", "ts": "typescript", "sh": "shell", "zsh": "shell", "console": "shell",
    "yml": "yaml", "c++": "cpp", "cs": "csharp", "c#": "csharp", "golang": "go", "rs": "rust", "md": "markdown",
    "kt": "kotlin", "rb": "ruby", "ps1": "powershell", "proto": "protobuf",
}

Element = dict[str, Any]
Row = list[Element]


@dataclass(frozen=True, slots=True)
class Part:
    """One message to send: ``msg_type`` (``post`` | ``text``) and its ``content`` JSON string."""

    msg_type: str
    content: str


@lru_cache(maxsize=4096)
def _char_cost(ch: str) -> int:
    """Bytes ``ch`` takes once JSON-encoded into ``content`` and again into the request body."""
    once = json.dumps(ch, ensure_ascii=False)[1:-1]
    return len(json.dumps(once, ensure_ascii=False)[1:-1].encode("utf-8"))


def encoded_size(value: Any) -> int:
    """Bytes ``value`` occupies in a request body after ``content`` double JSON encoding (UTF-8)."""
    return len(json.dumps(json.dumps(value, ensure_ascii=False), ensure_ascii=False).encode("utf-8"))


def _code_language(info: str) -> str | None:
    name = (info.split() or [""])[0].lower()
    name = _ALIASES.get(name, name)
    return name.upper() if name in _LANGUAGES else None


def _table_text(table: list[list[str]]) -> str:
    """Cells aligned in columns (a header rule after the first row), for a code block."""
    width = max((len(row) for row in table), default=0)
    rows = [row + [""] * (width - len(row)) for row in table]
    sizes = [max(len(row[i]) for row in rows) for i in range(width)]
    lines = [" | ".join(cell.ljust(sizes[i]) for i, cell in enumerate(row)).rstrip() for row in rows]
    if len(lines) > 1:
        lines.insert(1, "-+-".join("-" * size for size in sizes))
    return "\n".join(lines)


class _Renderer:
    """Walks pyromark (pulldown-cmark) events and builds post rows."""

    def __init__(self) -> None:
        self.rows: list[Row] = []
        self.row: Row | None = None
        self.styles: list[str] = []
        self.links: list[str] = []  # "" for a link Feishu would refuse: its text stays plain
        self.lists: list[list[int | None]] = []  # [next number or None for bullets]
        self.item_prefix: str | None = None  # bullet waiting for the item's first row
        self.item_depth = 0
        self.quote_depth = 0
        self.code: list[str] | None = None
        self.code_language: str | None = None
        self.table: list[list[str]] | None = None

    # -- rows ------------------------------------------------------------------------------------
    def flush(self) -> None:
        if self.row is not None:
            while self.row and self.row[-1].get("tag") == "text" and not self.row[-1]["text"].strip():
                self.row.pop()
            if any(el.get("tag") != "text" or el["text"].strip() for el in self.row):
                self.rows.append(self.row)
        self.row = None

    def _open_row(self) -> Row:
        if self.row is None:
            prefix = "> " * self.quote_depth
            if self.item_prefix is not None:
                prefix += _INDENT * max(0, self.item_depth - 1) + self.item_prefix
                self.item_prefix = None
            elif self.item_depth:
                prefix += _INDENT * self.item_depth
            self.row = [{"tag": "text", "text": prefix}] if prefix else []
        return self.row

    def add_text(self, text: str, *, plain: bool = False) -> None:
        if self.table is not None:
            if self.table and self.table[-1]:
                self.table[-1][-1] += text
            return
        if self.code is not None:
            self.code.append(text)
            return
        row = self._open_row()
        styles = [] if plain else sorted(set(self.styles))
        if self.links and self.links[-1]:
            element: Element = {"tag": "a", "text": text, "href": self.links[-1]}
        else:
            element = {"tag": "text", "text": text}
        if styles:
            element["style"] = styles
        last = row[-1] if row else None
        if last is not None and last.get("tag") == element["tag"] and last.get("href") == element.get("href") \
                and last.get("style") == element.get("style"):
            last["text"] += text  # merge runs of the same kind: smaller messages
        else:
            row.append(element)

    def add_block(self, element: Element) -> None:
        self.flush()
        self.rows.append([element])

    # -- events ----------------------------------------------------------------------------------
    def start(self, tag: Any) -> None:
        name, value = (next(iter(tag.items())) if isinstance(tag, dict) else (tag, None))
        if name in ("Paragraph", "Heading"):
            self.flush()
            if name == "Heading":
                self.styles.append("bold")
        elif name in _STYLE:
            self.styles.append(_STYLE[name])
        elif name in ("Link", "Image"):
            url = str(value.get("dest_url") or "")  # type: ignore[union-attr]
            self.links.append(url if _HTTP_LINK.match(url) else "")
        elif name == "BlockQuote":
            self.flush()
            self.quote_depth += 1
        elif name == "CodeBlock":
            self.flush()
            self.code = []
            fenced = value.get("Fenced") if isinstance(value, dict) else None
            self.code_language = _code_language(fenced) if fenced else None
        elif name == "List":
            self.flush()
            self.lists.append([value])
        elif name == "Item":
            self.flush()
            numbering = self.lists[-1] if self.lists else [None]
            if numbering[0] is None:
                self.item_prefix = "• " if len(self.lists) % 2 else "◦ "
            else:
                self.item_prefix = f"{numbering[0]}. "
                numbering[0] += 1
            self.item_depth = len(self.lists)
        elif name == "Table":
            self.flush()
            self.table = []
        elif name in ("TableHead", "TableRow") and self.table is not None:
            self.table.append([])
        elif name == "TableCell" and self.table:
            self.table[-1].append("")

    def end(self, tag: Any) -> None:
        name = next(iter(tag)) if isinstance(tag, dict) else tag
        if name in ("Paragraph", "Heading"):
            if name == "Heading" and self.styles:
                self.styles.pop()
            self.flush()
        elif name in _STYLE:
            if self.styles:
                self.styles.pop()
        elif name in ("Link", "Image"):
            if self.links:
                self.links.pop()
        elif name == "BlockQuote":
            self.flush()
            self.quote_depth = max(0, self.quote_depth - 1)
        elif name == "CodeBlock":
            text = "".join(self.code or ()).rstrip("\n")
            self.code = None
            block: Element = {"tag": "code_block", "text": text}
            if self.code_language:
                block["language"] = self.code_language
            self.add_block(block)
        elif name == "List":
            self.flush()
            if self.lists:
                self.lists.pop()
            self.item_depth = len(self.lists)
        elif name == "Item":
            self.flush()
            self.item_prefix = None
        elif name == "Table":
            table, self.table = self.table or [], None
            self.add_block({"tag": "code_block", "text": _table_text([[c.strip() for c in r] for r in table])})

    def feed(self, event: Any) -> None:
        if isinstance(event, str):  # unit events
            if event in ("SoftBreak", "HardBreak"):
                # A new line keeps the quote marker and the list item's indentation.
                continuation = "> " * self.quote_depth + _INDENT * self.item_depth
                self.add_text(" " if self.table is not None else "\n" + continuation, plain=True)
            elif event == "Rule":
                self.add_block({"tag": "hr"})
            return
        (kind, value), = event.items()
        if kind == "Start":
            self.start(value)
        elif kind == "End":
            self.end(value)
        elif kind == "Text":
            self.add_text(value)
        elif kind == "Code":
            self.add_text(f"`{value}`")
        elif kind in ("Html", "InlineHtml", "InlineMath", "DisplayMath"):
            self.add_text(value, plain=True)
        elif kind == "TaskListMarker":
            self.add_text("☑ " if value else "☐ ", plain=True)
        elif kind == "FootnoteReference":
            self.add_text(f"[^{value}]", plain=True)


def markdown_to_rows(markdown: str) -> list[Row]:
    """Model Markdown -> post rows (lists of post elements); empty for blank input."""
    renderer = _Renderer()
    for event in pyromark.events(markdown, options=_OPTIONS):
        renderer.feed(event)
    renderer.flush()
    return renderer.rows


def _cut(text: str, budget: int) -> int:
    """Index at which to cut ``text`` so the head costs ≤ ``budget`` bytes; prefers a line break,
    then a space, in the second half; never inside a character as the reader sees it
    (``adapters.text.safe_cut``) nor inside an ``&lt;``; never returns 0 for non-empty text."""
    total, end = 0, 0
    for end, ch in enumerate(text):  # noqa: B007 - end is used after the loop
        total += _char_cost(ch)
        if total > budget:
            break
    else:
        return len(text)
    end = max(end, 1)
    for sep in ("\n", " "):
        at = text.rfind(sep, 0, end)
        if at >= end // 2:
            return _outside_entity(text, safe_cut(text, at + 1))
    return _outside_entity(text, safe_cut(text, end))


def _outside_entity(text: str, at: int) -> int:
    """``at``, or the start of the ``&lt;`` it would cut (card markdown carries ``<`` as ``&lt;``,
    ``cards.card_parts``; a cut inside it showed ``&l`` and ``t;`` at the seam: found by a review)."""
    start = text.rfind("&", max(0, at - 3), at)
    return start if start > 0 and text.startswith("&lt;", start) else at


def split_text(text: str, budget: int) -> list[str]:
    """``text`` cut into pieces costing ≤ ``budget`` bytes each once encoded into a request body
    (cuts prefer line breaks, then spaces); ``[]`` for empty text."""
    pieces = []
    while text:
        at = _cut(text, budget)
        pieces.append(text[:at])
        text = text[at:]
    return pieces


def _split_row(row: Row, budget: int) -> list[Row]:
    """Cuts one row whose encoding exceeds ``budget`` into rows that fit."""
    if len(row) == 1 and row[0].get("tag") == "code_block":
        block = row[0]
        shell = encoded_size({**block, "text": ""}) + 2
        return [[{**block, "text": piece.rstrip("\n")}] for piece in split_text(block["text"], budget - shell)]
    rows: list[Row] = []
    current: Row = []
    used = 2
    for element in row:
        shell = encoded_size({**element, "text": ""}) + 1
        text = str(element.get("text") or "")
        for piece in split_text(text, budget - 2 - shell) if text else [""]:
            piece_element = {**element, "text": piece}
            size = shell + sum(_char_cost(ch) for ch in piece)
            if current and used + size > budget:
                rows.append(current)
                current, used = [], 2
            current.append(piece_element)
            used += size
    if current:
        rows.append(current)
    return rows


def _post(rows: list[Row]) -> str:
    return json.dumps({"zh_cn": {"title": "", "content": rows}}, ensure_ascii=False)


def pack_posts(rows: list[Row], limit: int = POST_LIMIT_BYTES) -> list[Part]:
    """Groups rows into ``post`` parts whose request body stays within ``limit`` bytes."""
    budget = limit - BODY_OVERHEAD_BYTES
    base = encoded_size({"zh_cn": {"title": "", "content": []}})
    parts: list[Part] = []
    current: list[Row] = []
    used = base
    for row in rows:
        size = encoded_size(row) + 1
        pieces = [row] if base + size <= budget else _split_row(row, budget - base - 1)
        for piece in pieces:
            size = encoded_size(piece) + 1
            if current and used + size > budget:
                parts.append(Part("post", _post(current)))
                current, used = [], base
            current.append(piece)
            used += size
    if current:
        parts.append(Part("post", _post(current)))
    return parts


def format_reply(markdown: str, limit: int = POST_LIMIT_BYTES) -> list[Part]:
    """Model Markdown -> the ``post`` parts to send, in order (empty list for blank text). Text that
    renders to nothing (``[](url)``, an empty quote) is sent as written, never dropped."""
    rows = markdown_to_rows(markdown)
    if not rows and markdown.strip():
        rows = [[{"tag": "text", "text": markdown.strip()}]]
    return pack_posts(rows, limit)


def format_plain(text: str, limit: int = TEXT_LIMIT_BYTES) -> list[Part]:
    """Plain text -> ``text`` parts (``{"text": ...}``) within ``limit`` bytes each; blank text -> []."""
    budget = limit - BODY_OVERHEAD_BYTES - encoded_size({"text": ""})
    text = _AT_TAG.sub("<\u200b", text)
    return [plain_text_part(piece) for piece in split_text(text, budget) if piece.strip()]


_AT_TAG = re.compile(r"<(?=\s*/?\s*at\b)", re.IGNORECASE)


def post_plain_text(content: str) -> str:
    """The text a ``post`` part shows (each row's elements, rows on their own lines; a rule as
    ``———``), for sending it again as a ``text`` message."""
    post = json.loads(content)
    rows = next(iter(post.values()))["content"]
    lines = ["———" if row and row[0].get("tag") == "hr" else "".join(str(el.get("text", "")) for el in row)
             for row in rows]
    return "\n".join(lines)


def plain_text_part(text: str) -> Part:
    """``text`` as a ``text`` message. A ``text`` message reads ``<at user_id="...">`` as a mention
    (Feishu open API: message content, text; ``<at user_id="all">`` pings the whole group), so an
    ``<at`` in the text is broken with a zero-width space: text the model wrote never pings."""
    return Part("text", json.dumps({"text": _AT_TAG.sub("<\u200b", text)}, ensure_ascii=False))
