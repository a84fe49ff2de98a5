"""Long-term memory in Chinese and Japanese, pure parts: how text becomes index words and terms,
the "remember" requests in both languages, the evidence check and restatements (issue 22)."""

from __future__ import annotations

import time

import pytest

from gateway.memory.promote import explicit_request, guess_type, restated, ungrounded
from gateway.memory.recall import RecallPolicy, rescore
from gateway.memory.store import Memory
from gateway.memory.terms import index_text, numbers, pair_terms, terms, words


def entry(id: int, text: str) -> Memory:
    return Memory(id, "user:u1", text, "fact", "user_explicit", 1.0, time.time(), None, 0, 2.0, None, [])


def test_a_run_of_chinese_becomes_characters_without_stop_words():
    assert terms("我喜欢喝乌龙茶") == {"喜", "欢", "喝", "乌", "龙", "茶"}  # "我": a stop word
    assert words("我最喜欢的颜色是什么？") == ["喜", "欢", "颜", "色"]  # 最, 的, 是, 什么 say nothing of the topic
    assert words("我的是什么？") == []
    assert terms("我的生日是3月14日") == {"生", "日", "3", "月", "14"}  # numbers stay numbers
    assert terms("記住我對花生過敏") == {"對", "花", "生", "過", "敏"}  # traditional too
    assert terms("ＶＳ Ｃｏｄｅ　３月") == {"vs", "code", "3", "月"}  # full width folded (NFKC)


def test_japanese_kana_become_pairs_and_a_lone_hiragana_is_dropped():
    assert terms("私はコーヒーが好きです") == {"コー", "ーヒ", "ヒー", "好"}  # き: okurigana; は, が, です: particles
    assert words("コーヒー") == ["コ", "ー", "ー", "ヒ", "ヒ", "ー"]  # the index holds characters
    assert terms("覚えておいて") == {"おい", "いて"}  # a stop word cuts the run, the rest still counts


def test_the_index_gets_every_cjk_character_as_its_own_word():
    assert index_text("我喜欢喝乌龙茶 Fedora 3月") == " 我  喜  欢  喝  乌  龙  茶  Fedora 3 月 "
    assert index_text("I live in Porto") == "I live in Porto"  # English goes to the engine unchanged
    assert pair_terms("我喜欢喝乌龙茶") == {"喜欢", "欢喝", "喝乌", "乌龙", "龙茶"}
    assert pair_terms("用户住在杭州") == {"用户", "住", "杭州"}  # "the user" is a word of its own


def test_a_one_character_question_finds_the_entry_whose_word_holds_it():
    entries = [entry(1, "我喜欢喝乌龙茶"), entry(2, "我的车是一辆红色的沃尔沃"), entry(3, "我住在杭州")]
    for query, wanted in [("茶", 1), ("喜欢", 1), ("乌龙茶怎么样", 1), ("我的车是什么颜色？", 2), ("我住哪儿？", 3)]:
        assert [s.memory.id for s in rescore(query, entries, time.time(), RecallPolicy())] == [wanted], query


@pytest.mark.parametrize(("text", "expected"), [
    ("记住我最喜欢的颜色是青绿色", "我最喜欢的颜色是青绿色"),
    ("请记住：我住在杭州", "我住在杭州"),
    ("记得我每周二晚上去跑步", "我每周二晚上去跑步"),
    ("帮我记一下，明天下午三点开会", "明天下午三点开会"),
    ("請記住我對花生過敏", "我對花生過敏"),
    ("别忘了发票要发PDF", "发票要发PDF"),
    ("记住：吃素", "吃素"),
    ("覚えて：私の誕生日は3月14日です", "私の誕生日は3月14日です"),
    ("覚えておいて、私はコーヒーが好き", "私はコーヒーが好き"),
    ("覚えておいてください。会議は毎週月曜日です", "会議は毎週月曜日です"),
    ("誕生日は3月14日だと覚えておいて", "誕生日は3月14日"),  # the verb last, as Japanese puts it
    ("犬の名前はポチって覚えといてね", "犬の名前はポチ"),
    ("记住了", None),  # "got it", nothing to remember
    ("记住这个！", None),
    ("记得我说过什么吗？", None),  # questions
    ("你还记得我说过什么吗", None),
    ("我记得你说过", None),  # not a request
    ("覚えていますか", None),
    ("私のこと覚えてる？", None),
    ("覚えておいて", None),  # the whole verb, nothing after it
    ("これを覚えておいて", None),
])
def test_remember_requests_in_chinese_and_japanese(text, expected):
    assert explicit_request(text) == expected


def test_entry_types_are_guessed_from_chinese_and_japanese_wording():
    assert guess_type("比起咖啡我更喜欢喝茶") == "preference"
    assert guess_type("我们决定每周三发版") == "decision"
    assert guess_type("我去年春天去过京都") == "episode"
    assert guess_type("私はコーヒーが好き") == "preference"
    assert guess_type("我姐姐叫李娜") == "fact"


@pytest.mark.parametrize(("claim", "evidence"), [
    ("用户对花生过敏", "我对花生过敏"),
    ("用户喜欢喝乌龙茶", "我最爱喝乌龙茶了"),
    ("用户的女儿叫小米", "我女儿名字是小米"),
    ("用户住在杭州", "我现在住杭州"),
    ("用户的狗叫旺财", "我家狗狗名字叫旺财"),
    ("用户的生日是3月14日", "对了，我生日是3月14号"),
    ("报告要用环比数据", "以后报告都用环比的数据吧"),
    ("ユーザーはコーヒーが好き", "私はコーヒーが大好きです"),
])
def test_a_chinese_or_japanese_entry_is_grounded_by_the_users_words(claim, evidence):
    assert ungrounded(claim, evidence) is None


@pytest.mark.parametrize(("claim", "evidence", "why"), [
    ("用户住在北京", "我住在杭州", "too few of its words"),
    ("用户的女儿叫小红", "我女儿名字是小米", "too few of its words"),  # a shared character is not a shared word
    ("用户的领导是刘强", "我的领导是王芳", "too few of its words"),
    ("用户不吃辣", "我不吃香菜的", "too few of its words"),
    ("用户的生日是5月20日", "我女儿今年5岁，我的生日是3月14日", "not the number 20"),
    ("The user's employee number is 4712", "my employee number is 4711", "not the number 4712"),
])
def test_a_changed_name_place_or_number_is_not_grounded(claim, evidence, why):
    assert ungrounded(claim, evidence) == why


def test_numbers_are_read_as_digits_without_leading_zeros():
    assert numbers("4.2M EUR, 09:30, ３月") == {"4", "2", "9", "30", "3"}


def test_a_restated_chinese_fact_is_recognised_and_a_new_value_is_not():
    existing = [entry(1, "我住在杭州"), entry(2, "我最喜欢的水果是草莓和蓝莓")]
    assert restated("我住在杭州。", existing).id == 1
    assert restated("我住在成都", existing) is None
    assert restated("我最喜欢的水果是草莓和芒果", existing) is None  # one fruit changed: a new entry
