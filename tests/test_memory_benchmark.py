"""Recall benchmark (issues 10 and 22), in English and in Chinese, on SQLite and on PostgreSQL:
per language, 55 facts and preferences told over 11 sessions, then 55 questions, each in a fresh
session, through the real gateway (Telegram DMs against the loopback fakes; ``tests/memory_facts.py``).

The injected memory block is read from the model requests. Precision = injected entries that
answer the question / all injected entries; recall = questions whose entry was injected /
questions. Keyword path only (no embeddings). Per language a second user tells facts on the same
topics with other values and asks too; no entry of one user may ever reach another user's
request (four users share the gateway). One gateway per backend runs both languages at once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import pytest

from gateway.store.db import create_db_engine, upgrade
from gateway.store.sql import Store
from tests.conftest import gateway_config
from tests.fakes import openai as oa
from tests.helpers import wait_until
from tests.memory_facts import FACTS, FACTS_ZH, OTHER_QUESTIONS, OTHER_QUESTIONS_ZH, OTHER_USER, OTHER_USER_ZH
from tests.test_memory_e2e import memory_lines, newest_user, owner_of_dm_for, turn_requests
from tests.test_sessions_e2e import tg_command
from tests.test_telegram_e2e import dm_update, sends_to

PRECISION_FLOOR = 0.9
RECALL_FLOOR = 0.9

SETS = {"en": (FACTS, OTHER_USER, OTHER_QUESTIONS), "zh": (FACTS_ZH, OTHER_USER_ZH, OTHER_QUESTIONS_ZH)}
USERS = {"en": (5562001, 5562002), "zh": (5562011, 5562012)}
"""Per language: the user whose recall is measured, the second user (same topics, other values)."""


@dataclass
class Outcome:
    """One language's figures on one backend."""

    facts: int
    questions: int = 0
    stored: int = 0
    injected: int = 0
    relevant: int = 0
    misses: list[str] = field(default_factory=list)
    noise: list[tuple[str, str]] = field(default_factory=list)
    unmatched: list[str] = field(default_factory=list)
    """Facts not stored as exactly one entry holding the words after "remember"."""
    second_user_stored: int = 0
    second_user_hits: int = 0


def injected_ids(request: dict) -> list[int]:
    return [int(re.search(r"\[#(\d+)\]$", line).group(1)) for line in memory_lines(newest_user(request))]


def said(request: dict) -> str:
    return newest_user(request).splitlines()[-1]


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
async def outcomes(request, tmp_path_factory, fake_telegram, fake_openai):
    """Runs the benchmark of both languages on one gateway of the backend: the backend's name, per
    language its ``Outcome``, and the (request text, entry id) pairs where an entry reached another
    user's request."""
    from gateway.app.gateway import Gateway
    from gateway.app.wiring import build_adapters

    tmp = tmp_path_factory.mktemp(f"bench-{request.param}")
    database = {}
    if request.param == "postgres":
        url = request.getfixturevalue("pg_database")
        engine = create_db_engine(url)
        upgrade(engine)
        Store(engine).purge_all()
        engine.dispose()
        database = {"url": url}
    fake_openai.reset()
    fake_openai.responder = lambda req: oa.text("ok")
    config = gateway_config(tmp, fake_openai, fake_telegram, database=database or {"url": f"sqlite:///{tmp / 'g.db'}"})
    gateway = Gateway(config, build_adapters(config))
    await gateway.start()
    try:
        yield (request.param, *await run_benchmark(gateway, fake_telegram, fake_openai))
    finally:
        await gateway.stop()


async def run_benchmark(gateway, fake_telegram, fake_openai) -> tuple[dict[str, Outcome], list[tuple[str, int]]]:
    ids = iter(range(20000, 90000))
    expected: dict[int, int] = {}

    def say(user: int, lines: list[str]) -> None:
        for line in lines:
            command = line.startswith("/")
            fake_telegram.inject(tg_command(line, next(ids), user) if command else dm_update(line, next(ids), user))
        # the fakes serve the module: replies of an earlier backend's run are already there
        expected[user] = expected.get(user, len(sends_to(fake_telegram, user))) + len(lines)

    async def replies() -> None:
        await wait_until(lambda: all(len(sends_to(fake_telegram, u)) >= n for u, n in expected.items()),
                         timeout=240, what="replies")

    # Phase 1, every user at once: the first user of each language tells their facts over 11
    # sessions of 5; the second tells theirs and asks their questions.
    sender: dict[str, int] = {}
    for lang, (facts, other, other_questions) in SETS.items():
        first, second = USERS[lang]
        told = [line for start in range(0, len(facts), 5) for line in ["/new", *(s for s, _ in facts[start:start + 5])]]
        theirs = ["/new", *other] + [line for q in other_questions for line in ("/new", q)]
        say(first, told)
        say(second, theirs)
        sender |= {line: first for line in told} | {line: second for line in theirs}
    await replies()
    phase_one = turn_requests(fake_openai)

    owned: dict[int, set[int]] = {}
    out: dict[str, Outcome] = {}
    entry_of: dict[str, dict[int, int]] = {}
    for lang, (facts, _, _) in SETS.items():
        first, second = USERS[lang]
        entries = gateway.memory.memories.entries(owner_of_dm_for(gateway, "telegram", first))
        theirs = gateway.memory.memories.entries(owner_of_dm_for(gateway, "telegram", second))
        owned[first], owned[second] = {m.id for m in entries}, {m.id for m in theirs}
        out[lang] = Outcome(facts=len(facts), stored=len(entries), second_user_stored=len(theirs))
        entry_of[lang] = {}
        for n, (line, _) in enumerate(facts):  # each entry is the request's words after "remember"
            matching = [m.id for m in entries if m.text.lower() in line.lower()]
            if len(matching) == 1:
                entry_of[lang][n] = matching[0]
            else:
                out[lang].unmatched.append(line)
        second_requests = [r for r in phase_one if sender.get(said(r)) == second]
        out[lang].second_user_hits = len({i for r in second_requests for i in injected_ids(r)})

    # Phase 2: the first user of each language asks each question in a fresh session.
    asked: dict[str, tuple[str, int]] = {}
    for lang, (facts, _, _) in SETS.items():
        first, _ = USERS[lang]
        say(first, [line for _, question in facts for line in ("/new", question)])
        asked |= {question: (lang, n) for n, (_, question) in enumerate(facts)}
    await replies()
    phase_two = turn_requests(fake_openai)[len(phase_one):]
    asker = {question: USERS[lang][0] for question, (lang, _) in asked.items()}

    crossed = [(said(r), i) for phase, who in ((phase_one, sender), (phase_two, asker)) for r in phase
               for i in injected_ids(r) if i not in owned.get(who.get(said(r), -1), set())]
    for request in phase_two:
        lang, n = asked[said(request)]
        outcome, wanted = out[lang], entry_of[lang].get(n)
        got = injected_ids(request)
        outcome.questions += 1
        outcome.injected += len(got)
        outcome.relevant += wanted in got
        if wanted not in got:
            outcome.misses.append(SETS[lang][0][n][1])
        outcome.noise += [(SETS[lang][0][n][1], f"#{i}") for i in got if i != wanted]
    return out, crossed


@pytest.mark.timeout(420)
@pytest.mark.parametrize("lang", ["en", "zh"])
def test_recall_precision_and_recall_over_many_sessions_with_two_users(outcomes, lang):
    backend, results, crossed = outcomes
    outcome = results[lang]
    assert outcome.facts >= 55
    assert outcome.stored == outcome.facts  # every "remember ..." / "记住…" was stored, none twice
    assert outcome.unmatched == []
    assert outcome.second_user_stored == len(SETS[lang][1])
    assert outcome.second_user_hits > 0  # the second user's questions find their own entries
    assert crossed == [], "an entry of one user reached another user's request"
    assert outcome.questions == outcome.facts
    precision = outcome.relevant / outcome.injected
    recall = outcome.relevant / outcome.facts
    print(f"\nmemory recall benchmark ({lang}, {backend}, keyword path): {outcome.facts} facts, "
          f"{outcome.questions} questions, precision {precision:.3f}, recall {recall:.3f}, "
          f"{outcome.injected} entries injected, 0 cross-owner; missed: {outcome.misses}; extra: {len(outcome.noise)}")
    assert precision >= PRECISION_FLOOR, (precision, outcome.noise)
    assert recall >= RECALL_FLOOR, (recall, outcome.misses)
