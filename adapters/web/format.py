"""Markdown -> safe HTML for the web chat (pure).

markdown-it-py with raw HTML off: ``<script>`` written by the model (or pasted by a user) is
escaped and shows as text. Its link check refuses ``javascript:``, ``vbscript:``, ``file:`` and
``data:`` URLs; images are off (no remote fetches from the reader's browser).
"""

from __future__ import annotations

import html

from markdown_it import MarkdownIt

_markdown = MarkdownIt("commonmark", {"html": False, "breaks": True}).enable("table").enable("strikethrough") \
    .disable("image")


def markdown_html(text: str) -> str:
    """HTML for an assistant message written in markdown; raw HTML in ``text`` is escaped."""
    return _markdown.render(text)


def plain_html(text: str) -> str:
    """HTML for plain text (user messages, previews): escaped; the page keeps line breaks."""
    return html.escape(text)
