"""``adapters.slack.format``: Markdown -> Slack mrkdwn, and chunking at safe boundaries."""

from __future__ import annotations

import pytest

from adapters.slack.format import MAX_CHUNK_CHARS, chunk_blocks, escape, format_reply, to_mrkdwn
from tests.fakes.slack import mrkdwn_problems


@pytest.mark.parametrize(("markdown", "mrkdwn"), [
    ("**bold** and __bold__", "*bold* and *bold*"),
    ("*it* and _it_", "_it_ and _it_"),
    ("~~gone~~", "~gone~"),
    ("`a < b && c`", "`a &lt; b &amp;&amp; c`"),
    ("[the docs](https://example.com/a?b=1&c=2)", "<https://example.com/a?b=1&amp;c=2|the docs>"),
    ("<https://example.com>", "<https://example.com>"),
    ("[x|y](https://e.com/p|q)", "<https://e.com/p%7Cq|x¦y>"),
    ("[relative](/path)", "relative"),
    ("# Title with **bold**", "*Title with bold*"),
    ("**Note:** text", "*Note:* text"),
    ("- one\n- two\n  1. a\n  2. b", "• one\n• two\n  1. a\n  2. b"),
    ("3. three\n4. four", "3. three\n4. four"),
    ("> quoted\n> text", "> quoted\n> text"),
    ("```python\nif a < b:\n    pass\n```", "```\nif a &lt; b:\n    pass\n```"),
    ("a & b <c> d > e", "a &amp; b &lt;c&gt; d &gt; e"),
    ("ask <@U0BOB00001> in <#C0OPS0001|ops>, not <!channel>",
     "ask <@U0BOB00001> in <#C0OPS0001|ops>, not &lt;!channel&gt;"),
    ("line one\nline two", "line one\nline two"),
    ("- [x] done\n- [ ] todo", "• ☑ done\n• ☐ todo"),
    ("above\n\n---\n\nbelow", "above\n\n──────────\n\nbelow"),
])
def test_markdown_to_mrkdwn(markdown: str, mrkdwn: str) -> None:
    assert to_mrkdwn(markdown) == mrkdwn
    assert mrkdwn_problems(mrkdwn) == []


def test_table_becomes_an_aligned_code_block() -> None:
    markdown = "| Name | Qty | Note |\n|:-----|----:|:----:|\n| apple | 3 | **fresh** & <ok> |\n| 梨 | 12 | x |"
    assert to_mrkdwn(markdown) == (
        "```\n"
        "Name  | Qty |     Note\n"
        "------+-----+-------------\n"
        "apple |   3 | fresh &amp; &lt;ok&gt;\n"
        "梨    |  12 |      x\n"
        "```"
    )


def test_validator_catches_raw_markdown() -> None:
    assert mrkdwn_problems("**bold** [a](http://b) a & b <oops>") == [
        "unescaped &", "malformed markup '<oops>'", "markdown bold", "markdown link"]
    assert "unclosed code fence" in mrkdwn_problems("```\ncode")
    assert "markdown table" in mrkdwn_problems("| a | b |")


def test_escape_only_three_characters() -> None:
    assert escape("<a href=\"x\">'&'</a>") == "&lt;a href=\"x\"&gt;'&amp;'&lt;/a&gt;"


def test_short_reply_is_one_chunk() -> None:
    assert format_reply("Hello **there**") == ["Hello *there*"]
    assert format_reply("a < b **not bold**", "plain") == ["a &lt; b **not bold**"]
    assert format_reply("   ") == []


def test_long_reply_is_cut_between_blocks_and_lines() -> None:
    paragraphs = [f"Paragraph {i}: " + "word & more " * 40 for i in range(40)]
    chunks = format_reply("\n\n".join(paragraphs), limit=1000)
    assert len(chunks) > 10
    for chunk in chunks:
        assert len(chunk) <= 1000
        assert mrkdwn_problems(chunk) == []
    joined = "\n\n".join(chunks)
    assert joined.count("Paragraph ") == 40 and joined.count("&amp;") == 40 * 40


def test_long_code_block_is_closed_and_reopened() -> None:
    code = "\n".join(f"line_{i} = {i} < {i + 1}" for i in range(400))
    chunks = format_reply(f"Here:\n\n```\n{code}\n```\n\nDone.", limit=1500)
    assert len(chunks) >= 5
    for chunk in chunks:
        assert len(chunk) <= 1500
        assert chunk.count("```") % 2 == 0, chunk[:80]
        assert mrkdwn_problems(chunk) == []
    body = "".join(chunks).replace("```", "").replace("Here:", "").replace("Done.", "")
    assert [line for line in body.split("\n") if line.strip()] == [
        line.replace("<", "&lt;") for line in code.split("\n")]


def test_a_cut_never_falls_inside_a_link_or_entity() -> None:
    text = " ".join(f"[link number {i} of many](https://example.com/{'x' * 30}/{i}) &" for i in range(200))
    chunks = format_reply(text, limit=500)
    assert len(chunks) > 5
    for chunk in chunks:
        assert len(chunk) <= 500
        assert mrkdwn_problems(chunk) == [], chunk


def test_unbreakable_text_is_hard_cut_within_the_limit() -> None:
    chunks = chunk_blocks(["x" * 2500], limit=1000)
    assert [len(c) for c in chunks] == [1000, 1000, 500]


def test_default_limit_fits_slack() -> None:
    chunks = format_reply("word " * 5000)
    assert len(chunks) == 7 and all(len(c) <= MAX_CHUNK_CHARS < 4000 for c in chunks)
