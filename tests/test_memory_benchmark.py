"""Recall benchmark (issue 10): 55 facts and preferences told over 11 sessions, then 55 questions,
each in a fresh session, through the real gateway (Telegram DMs against the loopback fakes).

The injected memory block is read from the model requests. Precision = injected entries that
answer the question / all injected entries; recall = questions whose entry was injected /
questions. Keyword path only (no embeddings). A second user tells facts on the same topics with
other values and asks too: no entry of one user may ever reach the other's requests.
"""

from __future__ import annotations

import re

from tests.conftest import gateway_config, start_gateway
from tests.fakes import openai as oa
from tests.helpers import wait_until
from tests.test_memory_e2e import memory_lines, newest_user, owner_of_dm_for, turn_requests
from tests.test_sessions_e2e import tg_command
from tests.test_telegram_e2e import dm_update, sends_to

PRECISION_FLOOR = 0.9
RECALL_FLOOR = 0.9

# (what the user says, a question it answers)
FACTS = [
    ("remember my favourite colour is teal", "what is my favourite colour?"),
    ("remember that I live in Porto", "which city do I live in?"),
    ("remember my sister is called Ana", "what is my sister's name?"),
    ("remember I am allergic to peanuts", "what am I allergic to?"),
    ("remember my dog is a beagle named Rex", "what breed is my dog?"),
    ("remember I prefer tea over coffee", "do I prefer tea or coffee?"),
    ("remember my employee number is 4711", "what is my employee number?"),
    ("remember I work on the billing team", "which team do I work on?"),
    ("remember my manager is Priya", "who is my manager?"),
    ("remember I report sales figures in EUR", "which currency should my sales figures be in?"),
    ("remember my birthday is on 14 March", "when is my birthday?"),
    ("remember my car is a red Volvo", "what car do I drive?"),
    ("remember I speak Portuguese and English", "which languages do I speak?"),
    ("remember my laptop runs Fedora Linux", "what operating system is on my laptop?"),
    ("remember I play the cello in an orchestra", "which instrument do I play?"),
    ("remember my favourite book is Dune", "what is my favourite book?"),
    ("remember my favourite food is ramen", "what is my favourite food?"),
    ("remember the quarterly review is every first Monday", "when is the quarterly review?"),
    ("remember our team standup is at 9:30", "what time is our standup?"),
    ("remember I use VS Code as my editor", "which code editor do I use?"),
    ("remember my wife's name is Clara", "what is my wife called?"),
    ("remember my son Leo is 7 years old", "how old is my son?"),
    ("remember I go running every Tuesday and Thursday", "on which days do I go running?"),
    ("remember I hate phone calls before 10am", "can I get a phone call at 9am?"),
    ("remember my gym is Fitness Hut in Boavista", "which gym do I go to?"),
    ("remember my flat has two bedrooms", "how many bedrooms does my flat have?"),
    ("remember my preferred airline is TAP", "which airline do I prefer?"),
    ("remember my passport expires in June 2027", "when does my passport expire?"),
    ("remember I am vegetarian", "am I vegetarian or do I eat meat?"),
    ("remember my bank is Millennium BCP", "which bank am I with?"),
    ("remember the project deadline is 15 December", "when is the project deadline?"),
    ("remember our main client is Acme Logistics", "who is our main client?"),
    ("remember the staging server is staging.acme.internal", "what is the staging server's address?"),
    ("remember we decided to release on Wednesdays", "on which weekday do we release?"),
    ("remember the budget for Q1 is 40k EUR", "how big is the Q1 budget?"),
    ("remember I support the football club FC Porto", "which football club do I support?"),
    ("remember I take the 8:15 train to work", "which train do I take in the morning?"),
    ("remember my dentist is Dr. Sousa", "who is my dentist?"),
    ("remember my home insurance renews in April", "when does my home insurance renew?"),
    ("remember I am learning Japanese", "which language am I learning?"),
    ("remember my GitHub handle is alice-dev", "what is my GitHub handle?"),
    ("remember I like my reports short, one page at most", "how many pages should my reports have?"),
    ("remember my weekly one-on-one with Priya is on Fridays", "which day is my weekly one-on-one?"),
    ("remember the office wifi network is acme-guest", "what is the office wifi called?"),
    ("remember I was born in Coimbra", "where was I born?"),
    ("remember my blood type is O negative", "what is my blood type?"),
    ("remember we agreed on PostgreSQL for the new billing service", "which database for the new service?"),
    ("remember my shoe size is 38", "what shoe size do I wear?"),
    ("remember I visited Kyoto last spring", "when did I visit Kyoto?"),
    ("remember my favourite movie is Spirited Away", "what is my favourite movie?"),
    ("remember my partner's parents live in Lyon", "where do my partner's parents live?"),
    ("remember the VPN password rotates every 90 days", "how often does the VPN password rotate?"),
    ("remember to send invoices as PDF files, never Word", "in which file format do I want invoices?"),
    ("remember my timezone is Europe/Lisbon", "what timezone am I in?"),
    ("remember our product is called Nimbus", "what is our product called?"),
]

OTHER_USER = [  # the same topics, other values
    "remember my favourite colour is orange", "remember that I live in Madrid", "remember my sister is called Eva",
    "remember my employee number is 9032", "remember my manager is Tom", "remember my car is a blue Fiat",
    "remember my birthday is on 2 July", "remember my dentist is Dr. Brown", "remember my bank is Santander",
    "remember our main client is Globex", "remember I am allergic to cats", "remember my shoe size is 44",
]
OTHER_QUESTIONS = ["what is my favourite colour?", "which city do I live in?", "what is my employee number?",
                   "who is my manager?", "who is our main client?", "what is my shoe size?"]


async def test_recall_precision_and_recall_over_many_sessions_with_two_users(
        tmp_path, fake_telegram, fake_openai, running):
    assert len(FACTS) >= 50
    fake_openai.reset()
    fake_openai.responder = lambda req: oa.text("ok")
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai, fake_telegram), running)
    alice, bob = 5562001, 5562002
    ids = iter(range(20000, 30000))

    async def say(user: int, lines: list[str], replies: int) -> None:
        for line in lines:
            command = line.startswith("/")
            fake_telegram.inject(tg_command(line, next(ids), user) if command else dm_update(line, next(ids), user))
        await wait_until(lambda: len(sends_to(fake_telegram, user)) >= replies, timeout=60, what="replies")

    # Alice tells her facts over 11 sessions of 5.
    told: list[str] = []
    for start in range(0, len(FACTS), 5):
        told += ["/new"] + [said for said, _ in FACTS[start:start + 5]]
    await say(alice, told, len(told))
    owner_a = owner_of_dm_for(gateway, "telegram", alice)
    entries_a = gateway.memory.memories.entries(owner_a)
    assert len(entries_a) == len(FACTS)  # every "remember ..." was stored, none twice
    entry_of = {}
    for n, (said, _) in enumerate(FACTS):
        (entry,) = [m for m in entries_a if m.text.lower() in said.lower()]
        entry_of[n] = entry.id

    # Bob tells his and asks (his requests never carry Alice's entries).
    before = len(turn_requests(fake_openai))
    bob_lines = ["/new", *OTHER_USER] + [line for q in OTHER_QUESTIONS for line in ("/new", q)]
    await say(bob, bob_lines, len(bob_lines))
    bob_requests = turn_requests(fake_openai)[before:]
    owner_b = owner_of_dm_for(gateway, "telegram", bob)
    bob_ids = {m.id for m in gateway.memory.memories.entries(owner_b)}
    assert len(bob_ids) == len(OTHER_USER)
    bob_seen = {int(i) for r in bob_requests for i in re.findall(r"\[#(\d+)\]$", newest_user(r), re.M)}
    assert bob_seen and bob_seen <= bob_ids

    # Alice asks each question in a fresh session.
    before = len(turn_requests(fake_openai))
    asked = [line for _, question in FACTS for line in ("/new", question)]
    await say(alice, asked, len(told) + len(asked))
    requests = turn_requests(fake_openai)[before:]
    assert len(requests) == len(FACTS)

    injected_total = relevant_injected = 0
    misses, noise = [], []
    alice_ids = set(entry_of.values())
    for n, request in enumerate(requests):
        (_, question) = FACTS[n]
        assert newest_user(request).endswith(question)
        got = [int(re.search(r"\[#(\d+)\]$", line).group(1)) for line in memory_lines(newest_user(request))]
        assert set(got) <= alice_ids, "an entry of another user was injected"
        injected_total += len(got)
        relevant_injected += entry_of[n] in got
        if entry_of[n] not in got:
            misses.append(question)
        noise += [(question, i) for i in got if i != entry_of[n]]
    precision = relevant_injected / injected_total
    recall = relevant_injected / len(FACTS)
    print(f"\nmemory recall benchmark (keyword path): {len(FACTS)} facts, {len(FACTS)} questions, "
          f"precision {precision:.3f}, recall {recall:.3f}, {injected_total} entries injected; "
          f"missed: {misses}; extra: {len(noise)}")
    assert precision >= PRECISION_FLOOR, (precision, noise)
    assert recall >= RECALL_FLOOR, (recall, misses)
