"""Pure outbound formatting for Slack: model Markdown -> mrkdwn text, in chunks.

Slack renders its own markup in a message's ``text`` (Slack: "Formatting text for app surfaces"):
``*bold*``, ``_italic_``, ``~strike~``, `` `code` ``, fenced code blocks, ``>`` quotes and links
``<url|label>``; standard Markdown (``**x**``, ``[t](u)``, headings, tables) is shown literally, so
it is converted here. Only ``&``, ``<`` and ``>`` are escaped (as ``&amp; &lt; &gt;``). Headings
become bold lines, lists get ``•``/``1.`` markers, tables become an aligned code block.

Chunks stay ≤ ``MAX_CHUNK_CHARS`` characters (Slack Web API: chat.postMessage truncates ``text``
beyond 40,000 characters and recommends ≤ 4,000) and are cut between blocks, then at line breaks,
then at spaces, never inside a link, an entity or a character as the reader sees it
(``adapters.text.safe_cut``); a code block that must be cut is closed at the cut and reopened in
the next chunk. Parsing is CommonMark + GFM tables/strikethrough (pyromark,
i.e. pulldown-cmark).
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, field
from typing import Any

import pyromark

from adapters.text import safe_cut

MAX_CHUNK_CHARS = 3900
FENCE = "```"
_OPTIONS = pyromark.Options.ENABLE_TABLES | pyromark.Options.ENABLE_STRIKETHROUGH | pyromark.Options.ENABLE_TASKLISTS
# Slack user/channel mentions the model may write on purpose; kept as markup. Broadcasts
# (<!here>, <!channel>) are deliberately not kept: a model must not be able to ping everyone.
_KEEP_MARKUP = re.compile(r"<[@#][UWC][A-Z0-9]+(?:\|[^<>|]*)?>")
_LINK_SCHEMES = ("http://", "https://", "mailto:", "ftp://", "slack://")
_ENTITY_OR_LINK = re.compile(r"&(?:amp|lt|gt);|<[^<>\n]*>")


def escape(text: str) -> str:
    """Escapes ``&``, ``<`` and ``>`` (the only characters Slack asks to escape in ``text``)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _escape_text(text: str) -> str:
    """``escape`` except for ``<@U…>``/``<#C…>`` mentions, which stay live markup."""
    out, last = [], 0
    for match in _KEEP_MARKUP.finditer(text):
        out.append(escape(text[last:match.start()]))
        out.append(match.group(0))
        last = match.end()
    out.append(escape(text[last:]))
    return "".join(out)


@dataclass
class _Node:
    """A parsed Markdown element: ``tag`` (e.g. ``"Paragraph"``, ``"Link"``), its data, children
    (nodes or leaf events such as ``{"Text": ...}``, ``"SoftBreak"``)."""

    tag: str
    data: Any = None
    children: list[Any] = field(default_factory=list)


def _tag_of(start: Any) -> tuple[str, Any]:
    if isinstance(start, str):
        return start, None
    (tag, data), = start.items()
    return tag, data


def parse(markdown: str) -> _Node:
    """Markdown -> a tree of ``_Node`` (root tag ``"Document"``)."""
    root = _Node("Document")
    stack = [root]
    for event in pyromark.events(markdown, options=_OPTIONS):
        if isinstance(event, dict) and "Start" in event:
            node = _Node(*_tag_of(event["Start"]))
            stack[-1].children.append(node)
            stack.append(node)
        elif isinstance(event, dict) and "End" in event:
            if len(stack) > 1:
                stack.pop()
        else:
            stack[-1].children.append(event)
    return root


def _wrap(inner: str, marker: str) -> str:
    """``marker + inner + marker`` with surrounding whitespace moved outside (Slack does not
    render ``*bold *``)."""
    core = inner.strip()
    if not core:
        return inner
    lead = inner[: len(inner) - len(inner.lstrip())]
    trail = inner[len(inner.rstrip()):]
    return f"{lead}{marker}{core}{marker}{trail}"


def _link_target(url: str) -> str:
    return escape(url).replace("|", "%7C").replace(" ", "%20")


class _Renderer:
    """Renders a parsed tree to mrkdwn block strings."""

    def inline(self, items: list[Any], *, plain: bool = False, in_bold: bool = False) -> str:
        """Inline content. ``plain`` gives unescaped text without markup (table cells, labels)."""
        out: list[str] = []
        for item in items:
            if isinstance(item, str):  # SoftBreak, HardBreak, Rule
                out.append("\n" if item in ("SoftBreak", "HardBreak") else "")
            elif isinstance(item, _Node):
                out.append(self._inline_node(item, plain, in_bold))
            elif "Text" in item:
                out.append(item["Text"] if plain else _escape_text(item["Text"]))
            elif "Code" in item:
                out.append(item["Code"] if plain else f"`{escape(item['Code'])}`")
            elif "InlineHtml" in item or "Html" in item:
                raw = item.get("InlineHtml", item.get("Html", ""))
                if re.fullmatch(r"<br\s*/?>", raw.strip(), re.IGNORECASE):
                    out.append("\n")
                else:
                    out.append(raw if plain else escape(raw))
            elif "TaskListMarker" in item:
                out.append("☑ " if item["TaskListMarker"] else "☐ ")
            elif "FootnoteReference" in item:
                out.append(f"[{item['FootnoteReference']}]")
            else:  # math and other extensions that are off: show their source text
                out.extend(str(v) for v in item.values())
        return "".join(out)

    def _inline_node(self, node: _Node, plain: bool, in_bold: bool) -> str:
        if node.tag in ("Strong", "Emphasis", "Strikethrough"):
            bold = in_bold or node.tag == "Strong"
            inner = self.inline(node.children, plain=plain, in_bold=bold)
            if plain or (node.tag == "Strong" and in_bold):
                return inner
            return _wrap(inner, {"Strong": "*", "Emphasis": "_", "Strikethrough": "~"}[node.tag])
        if node.tag in ("Link", "Image"):
            url = str(node.data.get("dest_url", ""))
            label = self.inline(node.children, plain=True).strip()
            if node.data.get("link_type") == "Email" and not url.startswith("mailto:"):
                url = f"mailto:{url}"
            if plain:
                return label or url
            if not url.lower().startswith(_LINK_SCHEMES):
                return escape(label or url)
            if not label or label in (url, url.removeprefix("mailto:")):
                return f"<{_link_target(url)}>"
            return f"<{_link_target(url)}|{escape(label).replace('|', '¦')}>"
        return self.inline(node.children, plain=plain, in_bold=in_bold)

    def blocks(self, items: list[Any]) -> list[str]:
        """Block strings for a container's children; loose inline runs become paragraphs."""
        out: list[str] = []
        run: list[Any] = []

        def flush() -> None:
            if run:
                text = self.inline(run).strip()
                if text:
                    out.append(text)
                run.clear()

        for item in items:
            if isinstance(item, _Node) and item.tag in _BLOCK_TAGS:
                flush()
                text = self.block(item)
                if text.strip():
                    out.append(text)
            elif item == "Rule":
                flush()
                out.append("──────────")
            elif isinstance(item, dict) and "Html" in item:
                run.append({"Text": item["Html"]})
            else:
                run.append(item)
        flush()
        return out

    def block(self, node: _Node) -> str:
        if node.tag == "Paragraph":
            return self.inline(node.children).strip()
        if node.tag == "Heading":
            inner = self.inline(node.children, in_bold=True).strip()
            return _wrap(inner, "*") if inner else ""
        if node.tag == "BlockQuote":
            inner = "\n\n".join(self.blocks(node.children))
            return "\n".join(f"> {line}" if line else ">" for line in inner.split("\n"))
        if node.tag == "CodeBlock":
            code = "".join(c.get("Text", "") for c in node.children if isinstance(c, dict))
            return f"{FENCE}\n{escape(code.rstrip(chr(10)))}\n{FENCE}"
        if node.tag == "List":
            return self._list(node)
        if node.tag == "Table":
            return self._table(node)
        if node.tag == "HtmlBlock":
            raw = "".join(c.get("Html", c.get("Text", "")) for c in node.children if isinstance(c, dict))  # type: ignore[misc]
            return escape(raw.strip())
        return "\n\n".join(self.blocks(node.children))

    def _list(self, node: _Node) -> str:
        start = node.data if isinstance(node.data, int) else None
        lines: list[str] = []
        items = [c for c in node.children if isinstance(c, _Node) and c.tag == "Item"]
        tight = all(not any(isinstance(c, _Node) and c.tag == "Paragraph" for c in i.children) for i in items)
        for index, item in enumerate(items):
            marker = f"{start + index}." if start is not None else "•"
            body = ("\n" if tight else "\n\n").join(self.blocks(item.children)) or ""
            pad = " " * (len(marker) + 1)
            first, *rest = body.split("\n")
            lines.append(f"{marker} {first}".rstrip())
            lines.extend(f"{pad}{line}" if line else "" for line in rest)
        return "\n".join(lines)

    def _table(self, node: _Node) -> str:
        rows: list[list[str]] = []
        header_rows = 0
        for part in node.children:
            if not isinstance(part, _Node):
                continue
            if part.tag == "TableHead":  # the head holds its cells directly
                rows.append(self._cells(part))
                header_rows = 1
            elif part.tag == "TableRow":
                rows.append(self._cells(part))
        if not rows:
            return ""
        columns = max(len(r) for r in rows)
        rows = [r + [""] * (columns - len(r)) for r in rows]
        widths = [max(_width(r[c]) for r in rows) for c in range(columns)]
        aligns = list(node.data or ()) + ["None"] * columns
        lines = [" | ".join(_pad(cell, widths[c], aligns[c]) for c, cell in enumerate(row)).rstrip() for row in rows]
        if header_rows:
            lines.insert(1, "-+-".join("-" * w for w in widths))
        return f"{FENCE}\n{escape(chr(10).join(lines))}\n{FENCE}"

    def _cells(self, row: _Node) -> list[str]:
        return [" ".join(self.inline(c.children, plain=True).split()) for c in row.children
                if isinstance(c, _Node) and c.tag == "TableCell"]


_BLOCK_TAGS = {"Paragraph", "Heading", "BlockQuote", "CodeBlock", "List", "Table", "HtmlBlock",
               "FootnoteDefinition", "DefinitionList", "DefinitionListTitle", "DefinitionListDefinition",
               "MetadataBlock"}


def _width(text: str) -> int:
    """Display width in a monospace font: wide (CJK) characters count 2, combining marks 0."""
    return sum(0 if unicodedata.combining(ch) else 2 if unicodedata.east_asian_width(ch) in "WF" else 1
               for ch in text)


def _pad(text: str, width: int, align: str) -> str:
    gap = width - _width(text)
    if align == "Right":
        return " " * gap + text
    if align == "Center":
        return " " * (gap // 2) + text + " " * (gap - gap // 2)
    return text + " " * gap


def to_mrkdwn_blocks(markdown: str) -> list[str]:
    """Model Markdown -> mrkdwn, one string per top-level block (paragraph, list, code, table...)."""
    return _Renderer().blocks(parse(markdown).children)


def to_mrkdwn(markdown: str) -> str:
    """Model Markdown -> one mrkdwn string (blocks separated by a blank line)."""
    return "\n\n".join(to_mrkdwn_blocks(markdown))


def _safe_cut(text: str, limit: int) -> int:
    """Index ≤ ``limit`` to cut ``text`` at: after a line break, else after a space (keeping the
    piece at least half full), never inside ``<…>`` or an ``&…;`` entity; a hard cut otherwise."""
    protected = [(m.start(), m.end()) for m in _ENTITY_OR_LINK.finditer(text, 0, limit + 64)]

    def inside(index: int) -> bool:
        return any(start < index < end for start, end in protected)

    for sep in ("\n", " "):
        cut = text.rfind(sep, 0, limit)
        while cut > limit // 2 and inside(cut + 1):
            cut = text.rfind(sep, 0, cut)
        if cut > limit // 2:
            return cut + 1
    cut = limit
    for start, end in protected:
        if start < cut < end:
            cut = start
    return cut if cut > 0 else limit


def _split_text(text: str, limit: int) -> list[str]:
    pieces = []
    while len(text) > limit:
        cut = safe_cut(text, _safe_cut(text, limit))
        pieces.append(text[:cut].rstrip())
        text = text[cut:].lstrip("\n")
    if text.strip():
        pieces.append(text)
    return [p for p in pieces if p.strip()]


def _split_code(block: str, limit: int) -> list[str]:
    """A fenced block too long for one message -> several, each closed and reopened."""
    body = block[len(FENCE) + 1 : -(len(FENCE) + 1)]
    room = limit - 2 * (len(FENCE) + 1)
    return [f"{FENCE}\n{piece}\n{FENCE}" for piece in _split_text(body, room)]


def chunk_blocks(blocks: list[str], limit: int = MAX_CHUNK_CHARS) -> list[str]:
    """Packs rendered blocks into messages of at most ``limit`` characters, in order: whole blocks
    together (blank line between), an oversized block split by ``_split_code``/``_split_text``."""
    pieces: list[str] = []
    for block in blocks:
        if len(block) <= limit:
            pieces.append(block)
        elif block.startswith(FENCE + "\n") and block.endswith("\n" + FENCE):
            pieces.extend(_split_code(block, limit))
        else:
            pieces.extend(_split_text(block, limit))
    chunks: list[str] = []
    for piece in pieces:
        if chunks and len(chunks[-1]) + 2 + len(piece) <= limit:
            chunks[-1] += "\n\n" + piece
        else:
            chunks.append(piece)
    return chunks


def format_reply(text: str, fmt: str = "markdown", limit: int = MAX_CHUNK_CHARS) -> list[str]:
    """The ``text`` values to post, in order: Markdown converted to mrkdwn (``fmt="markdown"``) or
    plain text escaped (``fmt="plain"``), chunked ≤ ``limit`` characters; no empty chunk. Text that
    the conversion turns into nothing (a lone ``#``, an empty heading) is sent as written (escaped), never
    dropped."""
    if fmt == "markdown":
        try:
            blocks = to_mrkdwn_blocks(text)
        except Exception:  # a parser fault must not lose the reply
            blocks = [escape(text)]
        if not any(block.strip() for block in blocks):
            blocks = [escape(text.strip())]
    else:
        blocks = [escape(text)]
    return [chunk for chunk in chunk_blocks(blocks, limit) if chunk.strip()]
