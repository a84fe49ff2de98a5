"""Long-term memory, pure parts: words and similarity, the explicit "remember" rule, rescoring's
threshold, the token budget (whole entries, best first), the evidence check, the JSON schema."""

from __future__ import annotations

import pytest

from agent.tokens import text_tokens
from gateway.memory.promote import (
    Candidate,
    TurnMessage,
    evidence_problem,
    explicit_request,
    guess_type,
    parse_proposal,
)
from gateway.memory.recall import BLOCK_HEADER, RecallPolicy, Scored, effective_weight, fill_budget, rescore
from gateway.memory.service import owner_for
from gateway.memory.store import Memory, NewMemory
from gateway.memory.terms import similarity, terms, words

NOW = 1_800_000_000.0


def entry(id: int, text: str, type: str = "fact", weight: float = 1.0, hits: int = 0, age_days: float = 0.0,
          last_used_days: float | None = None) -> Memory:
    created = NOW - age_days * 86400
    used = None if last_used_days is None else NOW - last_used_days * 86400
    return Memory(id, "user:u1", text, type, "user_explicit", 1.0, created, used, hits, weight, None, [])


@pytest.mark.parametrize(("text", "expected"), [
    ("remember that I am vegan", "I am vegan"),
    ("Please remember: report figures in year-on-year terms", "Report figures in year-on-year terms"),
    ("don't forget my sister is called Ana", "My sister is called Ana"),
    ("记住：我喜欢喝茶", "我喜欢喝茶"),
    ("remember when we met?", None),  # a question, not a request
    ("do you remember my name", None),
    ("I remember that film", None),
    ("remember", None),
    ("Please remember that", None),  # nothing to remember: no "That" entry
    ("remember this!", None),
    ("Remember that.", None),
    ("remember: ", None),
    ("Remember that the office closes at 6", "The office closes at 6"),
])
def test_explicit_requests_are_recognised_without_a_model(text, expected):
    assert explicit_request(text) == expected


def test_entry_types_are_guessed_from_wording():
    assert guess_type("I prefer tea over coffee") == "preference"
    assert guess_type("we decided to ship on Fridays") == "decision"
    assert guess_type("I visited Lisbon last year") == "episode"
    assert guess_type("My sister is called Ana") == "fact"


def test_words_drop_stop_words_and_terms_are_stemmed():
    assert words("What is my favourite colour?") == ["favourite", "colour"]
    assert terms("reports reporting") == {"report"}
    assert terms("year-on-year") == {"year"}
    assert terms("我喜欢茶") == {"喜", "欢", "茶"}  # characters, stop words ("我") dropped
    assert similarity(terms("favourite colour"), terms("My favourite colour is teal")) > 0.8
    assert similarity(terms("favourite colour"), terms("I live in Berlin")) == 0.0


def test_owner_is_the_user_in_a_dm_and_the_chat_in_a_group_across_its_threads():
    assert owner_for("dm:abc") == "user:abc"
    assert owner_for("telegram:7:chat:-100:thread:77") == "group:telegram:7:chat:-100"
    assert owner_for("telegram:7:chat:-100") == "group:telegram:7:chat:-100"
    assert owner_for("slack:T1:chat:C1:thread:1.2:user:u9") == "group:slack:T1:chat:C1:user:u9"


def test_rescoring_drops_entries_under_the_threshold_and_ranks_by_similarity_then_importance():
    policy = RecallPolicy(threshold=0.3, relative=0.0)
    candidates = [entry(1, "My favourite colour is teal"), entry(2, "I live in Berlin"),
                  entry(3, "My favourite colour is teal, not blue", weight=3.0, hits=5),
                  entry(4, "The colour of my car is red")]
    scored = rescore("what is my favourite colour?", candidates, NOW, policy)
    # 3 is a little less similar than 1 but weighs more and was used: it ranks first; 4 shares one word.
    assert [s.memory.id for s in scored] == [3, 1, 4]
    assert all(s.score >= 0.3 for s in scored)
    # The relative cut keeps only entries near the best one.
    tight = rescore("what is my favourite colour?", candidates, NOW, RecallPolicy(threshold=0.3, relative=0.9))
    assert {s.memory.id for s in tight} <= {1, 3}
    # Nothing relevant: nothing at all (importance never lifts an unrelated entry).
    assert rescore("when is the train to Porto?", [entry(5, "I am vegan", weight=3.0, hits=50)], NOW, policy) == []


def test_unused_entries_decay_in_weight():
    fresh, stale = entry(1, "x", weight=2.0, last_used_days=0), entry(2, "x", weight=2.0, last_used_days=60)
    assert effective_weight(fresh, NOW, 30) == pytest.approx(2.0)
    assert effective_weight(stale, NOW, 30) == pytest.approx(0.5)
    scored = rescore("x tea", [entry(1, "tea x", weight=2.0, last_used_days=0),
                               entry(2, "tea x", weight=2.0, last_used_days=60)], NOW, RecallPolicy(relative=0))
    assert [s.memory.id for s in scored] == [1, 2] and scored[0].score > scored[1].score


def test_the_budget_takes_whole_entries_best_first_and_skips_what_does_not_fit():
    long = "a fairly long entry " * 30
    scored = [Scored(entry(1, "short best"), 0.9, 0.9), Scored(entry(2, long), 0.8, 0.8),
              Scored(entry(3, "short third"), 0.7, 0.7), Scored(entry(4, "short fourth"), 0.6, 0.6)]
    block = fill_budget(scored, budget_tokens=80)
    assert block.ids == (1, 3, 4)  # the long one does not fit and is skipped whole; smaller ones still do
    assert text_tokens(block.text) <= 80
    lines = block.text.splitlines()
    assert lines[0] == BLOCK_HEADER and lines[1].startswith("- (fact, ") and lines[1].endswith("short best [#1]")
    assert fill_budget(scored, budget_tokens=text_tokens(BLOCK_HEADER) + 2).text == ""  # nothing fits: no block


def test_the_evidence_check_needs_cited_user_messages_or_tool_results_that_state_the_entry():
    turn = [TurnMessage(10, "user", "From now on please report sales month-on-month"),
            TurnMessage(11, "tool", "Quarterly revenue: 4.2M EUR, up 12% on the year"),
            TurnMessage(12, "assistant", "The user is a premium customer")]

    def check(text, evidence):
        return evidence_problem(Candidate(text=text, type="fact", evidence=evidence), turn)

    assert check("Report sales month-on-month", [10]) is None
    assert check("Quarterly revenue was 4.2M EUR", [11]) is None
    assert check("Report sales month-on-month", []) == "cites no evidence"
    assert "not a user message or tool result" in check("The user is a premium customer", [12])
    assert "not a user message or tool result" in check("Report sales month-on-month", [99])
    assert check("The user's password is hunter2", [10]) == "its evidence does not state it (too few of its words)"


def test_proposals_must_match_the_fixed_schema():
    parsed = parse_proposal('```json\n{"memories": [{"text": "Likes tea", "type": "preference", '
                            '"evidence": [3], "confidence": 0.8, "supersedes": [1]}]}\n```')
    assert parsed.memories[0].supersedes == [1] and parsed.memories[0].evidence == [3]
    assert parse_proposal('{"memories": []}').memories == []
    for bad in ("not json", '{"memories": [{"text": "x y z", "type": "rumour", "evidence": [1]}]}',
                '{"memories": [{"text": "Likes tea", "type": "fact", "evidence": [1], "extra": 1}]}', "[]"):
        with pytest.raises(ValueError, match="not the expected JSON"):
            parse_proposal(bad)


def test_bad_entries_are_refused_with_a_clear_error():
    with pytest.raises(ValueError, match="memory type must be one of"):
        NewMemory("user:u1", "text", "rumour", "task")
    with pytest.raises(ValueError, match="needs text"):
        NewMemory("user:u1", "  ", "fact", "task")
    assert NewMemory("user:u1", "x" * 500, "fact", "task").text == "x" * 500
    with pytest.raises(ValueError, match="a memory entry holds at most 500 characters, this one has 14,999"):
        NewMemory("user:u1", "x" * 14_999, "fact", "import")


def test_a_restated_fact_is_recognised_and_a_new_one_is_not():
    from gateway.memory.promote import restated

    existing = [entry(1, "My employee number is 4711"), entry(2, "I live in Porto")]
    assert restated("my employee number is 4711", existing).id == 1
    assert restated("My employee number is 9032", existing) is None
