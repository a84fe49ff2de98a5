"""A long reply cut into messages never splits a character as the reader sees it (a Unicode
extended grapheme cluster, UAX #29): Telegram (4,096 UTF-16 units), Slack (3,900 characters) and
Feishu (30 KB posts, cards) cut a run with no space or line break where the limit falls, and that
used to be inside a ZWJ emoji, a flag, a letter and its combining accent, an emoji and its skin
tone."""

from __future__ import annotations

import json

import pytest

from adapters.feishu.cards import card_parts
from adapters.feishu.format import format_plain
from adapters.feishu.format import format_reply as feishu_reply
from adapters.slack.format import format_reply as slack_reply
from adapters.telegram.format import format_reply as telegram_reply
from adapters.telegram.format import utf16_len
from adapters.text import is_boundary, safe_cut

FAMILY = "👨\u200d👩\u200d👧"  # one character on screen, 5 code points, 8 UTF-16 units
FLAG = "🇺🇸"  # two regional indicators
ACCENTED = "e\u0301"  # e + combining acute
THUMB = "👍🏽"  # emoji + skin tone modifier
KEYCAP = "1\ufe0f\u20e3"
HANGUL = "\u1112\u1161\u11ab"  # 한 as conjoining jamo (L V T)
CLUSTERS = [FAMILY, FLAG, ACCENTED, THUMB, KEYCAP, HANGUL]


def texts_of_telegram(text: str) -> list[str]:
    return [chunk.text for chunk in telegram_reply(text)]


def texts_of_slack(text: str) -> list[str]:
    return slack_reply(text, "plain")


def texts_of_feishu_post(text: str) -> list[str]:
    return ["".join(el["text"] for row in json.loads(p.content)["zh_cn"]["content"] for el in row)
            for p in feishu_reply(text)]


def texts_of_feishu_text(text: str) -> list[str]:
    return [json.loads(p.content)["text"] for p in format_plain(text, limit=20_000)]


def texts_of_feishu_card(text: str) -> list[str]:
    return [json.loads(p.content)["body"]["elements"][0]["text"]["content"] for p in card_parts(text, "plain")]


SPLITTERS = [texts_of_telegram, texts_of_slack, texts_of_feishu_post, texts_of_feishu_text, texts_of_feishu_card]


@pytest.mark.parametrize("cluster", CLUSTERS, ids=["zwj-family", "flag", "combining", "skin-tone", "keycap", "jamo"])
@pytest.mark.parametrize("split", SPLITTERS, ids=lambda f: f.__name__.removeprefix("texts_of_"))
def test_a_cut_never_splits_a_character(split, cluster):
    text = "a" + cluster * 12_000  # one run: no space or line break to cut at; "a" shifts the cuts
    pieces = split(text)
    assert len(pieces) > 1 and "".join(pieces) == text
    assert pieces[0].startswith("a") and pieces[0][1:].replace(cluster, "") == ""
    assert all(piece.replace(cluster, "") == "" for piece in pieces[1:])


def test_telegram_parts_still_fit_in_utf16_units():
    for piece in texts_of_telegram("a" + FAMILY * 3000):
        assert utf16_len(piece) <= 4096


def test_the_boundary_rules():
    assert not is_boundary(FAMILY, 1) and not is_boundary(FAMILY, 2) and is_boundary(FAMILY + "x", 5)
    assert not is_boundary(FLAG * 2, 1) and is_boundary(FLAG * 2, 2) and not is_boundary("x" + FLAG * 2, 4)
    assert not is_boundary("a\r\nb", 2) and is_boundary("ab", 1)
    assert safe_cut("x" + FAMILY, 4) == 1
    assert safe_cut("\u0301" * 100, 90) == 90  # no boundary near: cut where asked (progress)


@pytest.mark.parametrize("markdown", ["[](https://example.com/a)", ">", "  >  \n\n> "])
def test_a_reply_that_formats_to_nothing_is_sent_as_written(markdown):
    """A reply with text in it that the Markdown conversion turns into nothing (a link without a
    label, an empty quote) used to send nothing and count as delivered: it is sent as written."""
    assert [c.text for c in telegram_reply(markdown)] == [markdown.strip()]
    assert slack_reply(markdown) != []
    assert texts_of_feishu_post(markdown) == [markdown.strip()]


def test_blank_replies_still_send_nothing():
    assert telegram_reply(" \n ") == [] and slack_reply(" \n ") == [] and feishu_reply(" \n ") == []
