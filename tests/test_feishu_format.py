"""Unit tests of ``adapters.feishu.format``: Markdown -> Feishu ``post`` rows and size-bounded parts."""

from __future__ import annotations

import json

import pytest

from adapters.feishu.format import (
    POST_LIMIT_BYTES,
    TEXT_LIMIT_BYTES,
    format_plain,
    format_reply,
    markdown_to_rows,
    post_plain_text,
)

NBSP4 = "\u00a0" * 4


def _body_size(content: str, msg_type: str) -> int:
    """Size of the request body lark-oapi sends (httpx: compact JSON, ensure_ascii=False)."""
    body = {"receive_id": "oc_" + "x" * 32, "msg_type": msg_type, "content": content, "uuid": "in123456:0:p99"}
    return len(json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode())


def _texts(rows: list[list[dict]]) -> str:
    return "\n".join("".join(el.get("text", "") for el in row) for row in rows)


@pytest.mark.parametrize(("markdown", "rows"), [
    ("plain words", [[{"tag": "text", "text": "plain words"}]]),
    ("a **b** *c* ~~d~~ `e`", [[
        {"tag": "text", "text": "a "}, {"tag": "text", "text": "b", "style": ["bold"]},
        {"tag": "text", "text": " "}, {"tag": "text", "text": "c", "style": ["italic"]},
        {"tag": "text", "text": " "}, {"tag": "text", "text": "d", "style": ["lineThrough"]},
        {"tag": "text", "text": " `e`"}]]),
    ("***both***", [[{"tag": "text", "text": "both", "style": ["bold", "italic"]}]]),
    ("see [docs](https://example.com/d?x=1)", [[
        {"tag": "text", "text": "see "}, {"tag": "a", "text": "docs", "href": "https://example.com/d?x=1"}]]),
    ("see [**bold link**](https://e.com)", [[
        {"tag": "text", "text": "see "},
        {"tag": "a", "text": "bold link", "href": "https://e.com", "style": ["bold"]}]]),
    ("## Heading", [[{"tag": "text", "text": "Heading", "style": ["bold"]}]]),
    ("```py\nx = 1\n```", [[{"tag": "code_block", "text": "x = 1", "language": "PYTHON"}]]),
    ("```weird-lang\nx\n```", [[{"tag": "code_block", "text": "x"}]]),
    ("    indented code", [[{"tag": "code_block", "text": "indented code"}]]),
    ("- a\n- b\n  - c\n\n1. x\n2. y", [
        [{"tag": "text", "text": "• a"}], [{"tag": "text", "text": "• b"}],
        [{"tag": "text", "text": f"{NBSP4}◦ c"}],
        [{"tag": "text", "text": "1. x"}], [{"tag": "text", "text": "2. y"}]]),
    ("3. three\n4. four", [[{"tag": "text", "text": "3. three"}], [{"tag": "text", "text": "4. four"}]]),
    ("> q1\n> q2", [[{"tag": "text", "text": "> q1\n> q2"}]]),
    ("- item\n  more", [[{"tag": "text", "text": f"• item\n{NBSP4}more"}]]),
    ("one\ntwo", [[{"tag": "text", "text": "one\ntwo"}]]),
    ("**a\nb**", [[{"tag": "text", "text": "a", "style": ["bold"]}, {"tag": "text", "text": "\n"},
                   {"tag": "text", "text": "b", "style": ["bold"]}]]),
    ("a\n\n---\n\nb", [[{"tag": "text", "text": "a"}], [{"tag": "hr"}], [{"tag": "text", "text": "b"}]]),
    ("| k | v |\n|---|---|\n| apple | 3 |", [[{"tag": "code_block", "text": "k     | v\n------+--\napple | 3"}]]),
    ("![chart](https://e.com/c.png)", [[{"tag": "a", "text": "chart", "href": "https://e.com/c.png"}]]),
    # Feishu refuses a post whose ``a`` has any other href (230001 "invalid href"): text instead.
    ("[rd](./README.md) [s](#setup) [f](file:///tmp/x) <a@b.co> [j](javascript:x) [h](HTTP://E.COM)", [[
        {"tag": "text", "text": "rd s f a@b.co j "}, {"tag": "a", "text": "h", "href": "HTTP://E.COM"}]]),
    ("", []),
    ("   \n\n", []),
])
def test_markdown_to_rows(markdown: str, rows: list) -> None:
    assert markdown_to_rows(markdown) == rows


def test_reply_is_one_zh_cn_post() -> None:
    parts = format_reply("Hello **there**")
    assert len(parts) == 1 and parts[0].msg_type == "post"
    content = json.loads(parts[0].content)
    assert content == {"zh_cn": {"title": "", "content": [[
        {"tag": "text", "text": "Hello "}, {"tag": "text", "text": "there", "style": ["bold"]}]]}}


def test_long_reply_is_split_between_rows_within_30kb() -> None:
    paragraphs = [f"Paragraph {i}: " + "词语 and words " * 40 for i in range(200)]
    parts = format_reply("\n\n".join(paragraphs))
    assert len(parts) > 3
    rows = [row for part in parts for row in json.loads(part.content)["zh_cn"]["content"]]
    assert _texts(rows) == "\n".join(p.rstrip() for p in paragraphs)
    for part in parts:
        assert _body_size(part.content, "post") <= POST_LIMIT_BYTES


def test_huge_code_block_and_paragraph_are_cut() -> None:
    code = "\n".join(f'print("line {i}", "\\\\ quoted")' for i in range(3000))
    para = "x" * 70_000
    parts = format_reply(f"```python\n{code}\n```\n\n{para}")
    blocks = []
    texts = []
    for part in parts:
        assert _body_size(part.content, "post") <= POST_LIMIT_BYTES
        for row in json.loads(part.content)["zh_cn"]["content"]:
            for element in row:
                (blocks if element["tag"] == "code_block" else texts).append(element)
    assert all(b["language"] == "PYTHON" for b in blocks) and len(blocks) > 5
    assert "\n".join(b["text"] for b in blocks) == code  # cut at line ends, nothing lost
    assert "".join(t["text"] for t in texts) == para


def test_plain_text_parts_within_150kb() -> None:
    text = "一二三四五 " * 60_000  # 1 MB of UTF-8
    parts = format_plain(text)
    assert len(parts) >= 6 and {p.msg_type for p in parts} == {"text"}
    assert "".join(json.loads(p.content)["text"] for p in parts) == text
    for part in parts:
        assert _body_size(part.content, "text") <= TEXT_LIMIT_BYTES
    assert format_plain("  ") == []


def test_plain_text_never_carries_a_mention_tag() -> None:
    """A ``text`` message reads ``<at user_id="all"></at>`` as a mention of everyone (Feishu open
    API, text content): text sent as ``text`` (plain replies, the fallback of a refused post) has
    each ``<at`` broken by a zero-width space, the words unchanged."""
    [part] = format_plain('ping <at user_id="all"></at> and < AT user_id="ou_1">x</at>, a <b> stays')
    text = json.loads(part.content)["text"]
    assert "<at" not in text.lower() and "< at" not in text.lower()
    assert text.replace("\u200b", "") == 'ping <at user_id="all"></at> and < AT user_id="ou_1">x</at>, a <b> stays'


def test_a_post_reads_back_as_the_text_it_shows() -> None:
    [part] = format_reply("Use **bold** and `code`:\n\n```py\nx = 1\n```\n\n---\n\n[docs](https://e.com)")
    assert post_plain_text(part.content) == "Use bold and `code`:\nx = 1\n———\ndocs"
