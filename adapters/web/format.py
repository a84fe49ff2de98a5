"""Markdown -> safe HTML for the web chat (pure).

markdown-it-py with raw HTML off: ``<script>`` written by the model (or pasted by a user) is
escaped and shows as text. Its link check refuses ``javascript:``, ``vbscript:``, ``file:`` and
``data:`` URLs; images are off (no remote fetches from the reader's browser).
"""

from __future__ import annotations

import html

from markdown_it import MarkdownIt

from gateway.core.files import human_size

_markdown = MarkdownIt("commonmark", {"html": False, "breaks": True}).enable("table").enable("strikethrough") \
    .disable("image")


def markdown_html(text: str) -> str:
    """HTML for an assistant message written in markdown; raw HTML in ``text`` is escaped."""
    return _markdown.render(text)


def plain_html(text: str) -> str:
    """HTML for plain text (user messages, previews): escaped; the page keeps line breaks."""
    return html.escape(text)


INLINE_IMAGE_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})
"""Raster formats the page shows inline; anything else (SVG included: it can carry script) is a download."""


def attachment_html(attachment: dict[str, object], url: str) -> str:
    """HTML for one file the agent sent: an inline image (PNG, JPEG, GIF, WebP) opening full size,
    or a download link with the file's name and size; the caption (markdown) under it. Every value
    is escaped; ``url`` is the file's signed address on this server."""
    name = str(attachment.get("name") or "file")
    caption = str(attachment.get("caption") or "")
    href = html.escape(url, quote=True)
    label = html.escape(name)
    below = f'<figcaption>{markdown_html(caption)}</figcaption>' if caption.strip() else ""
    if attachment.get("kind") == "image" and attachment.get("mime_type") in INLINE_IMAGE_TYPES:
        return (f'<figure class="sent-file image"><a href="{href}" target="_blank" rel="noopener">'
                f'<img src="{href}" alt="{html.escape(name, quote=True)}" loading="lazy"></a>{below}</figure>')
    size = attachment.get("size")
    shown = f" <small>({human_size(size)})</small>" if isinstance(size, int) else ""
    return (f'<figure class="sent-file document"><a href="{href}" download="{html.escape(name, quote=True)}">'
            f'📎 {label}</a>{shown}{below}</figure>')

