"""``MemoryStore`` on SQLite (FTS5) and PostgreSQL (full-text): owner isolation, supersede chains,
forgetting, hits."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from gateway.memory.store import MemoryStore, NewMemory
from gateway.store.db import create_db_engine


@pytest.fixture
def memories(db_url):
    engine = create_db_engine(db_url)
    yield MemoryStore(engine)
    engine.dispose()


def test_keyword_search_is_stemmed_and_never_crosses_owners(memories):
    alice = memories.add(NewMemory("user:alice", "Alice reports sales figures every Monday", "fact", "user_explicit"))
    memories.add(NewMemory("user:bob", "Bob reports sales figures every Friday", "fact", "user_explicit"))
    memories.add(NewMemory("user:alice", "Alice is allergic to peanuts", "fact", "user_explicit"))
    found = memories.keyword_search("user:alice", ["report", "sale"])
    assert [m.id for m in found] == [alice.id]  # stems match ("report" ~ "reports"); Bob's never
    assert memories.keyword_search("user:carol", ["report", "sale"]) == []
    assert memories.keyword_search("user:alice", []) == []
    assert memories.keyword_search("user:alice", ["x'); DROP TABLE memories; --"]) == []  # not a word: ignored


def test_a_superseded_entry_is_not_found_but_stays_in_history(memories):
    old = memories.add(NewMemory("user:alice", "Report figures in year-on-year terms", "preference", "user_explicit"))
    new = memories.add(NewMemory("user:alice", "Report figures in month-on-month terms", "preference", "task"),
                       supersedes=[old.id])
    assert [m.id for m in memories.keyword_search("user:alice", ["report", "figures"])] == [new.id]
    history = memories.entries("user:alice")
    assert [(m.id, m.superseded_by) for m in history] == [(old.id, new.id), (new.id, None)]


def test_supersede_touches_only_the_owners_valid_entries(memories):
    bobs = memories.add(NewMemory("user:bob", "Bob likes tea", "preference", "user_explicit"))
    mine = memories.add(NewMemory("user:alice", "Alice likes coffee", "preference", "user_explicit"))
    newer = memories.add(NewMemory("user:alice", "Alice likes green tea", "preference", "task"),
                         supersedes=[bobs.id, mine.id])
    assert memories.get("user:bob", bobs.id).superseded_by is None
    assert memories.get("user:alice", mine.id).superseded_by == newer.id
    assert memories.get("user:alice", bobs.id) is None  # another owner's id reads as nothing


def test_forget_deletes_the_entry_and_the_older_versions_it_replaced(memories):
    first = memories.add(NewMemory("user:alice", "Home office in Leeds", "fact", "user_explicit"))
    second = memories.add(NewMemory("user:alice", "Home office in York", "fact", "user_explicit"),
                          supersedes=[first.id])
    other = memories.add(NewMemory("user:alice", "Works on the billing team", "fact", "user_explicit"))
    assert memories.forget("user:bob", second.id) == []  # not Bob's
    assert memories.forget("user:alice", second.id) == sorted([first.id, second.id])
    assert [m.id for m in memories.entries("user:alice")] == [other.id]
    assert memories.keyword_search("user:alice", ["office", "leeds", "york"]) == []  # gone from the index too
    assert memories.get("user:alice", second.id) is None and memories.forget("user:alice", second.id) == []
    with memories.engine.connect() as conn:  # the words are erased, not only hidden
        erased = conn.execute(text("SELECT count(*) FROM memories WHERE text LIKE :w"), {"w": "%office%"})
        assert erased.scalar_one() == 0


def test_an_id_is_never_reused_after_the_newest_entry_is_forgotten(memories):
    kept = memories.add(NewMemory("user:alice", "Works on the billing team", "fact", "user_explicit"))
    newest = memories.add(NewMemory("user:alice", "Home office in York", "fact", "user_explicit"))
    assert memories.forget("user:alice", newest.id) == [newest.id]
    later = memories.add(NewMemory("user:alice", "Prefers tea", "preference", "user_explicit"))
    assert later.id > newest.id  # SQLite would hand out the highest rowid again after a delete
    assert memories.forget("user:alice", newest.id) == []  # an old id finds nothing, not the newer entry
    assert [m.id for m in memories.entries("user:alice")] == [kept.id, later.id]
    assert memories.supersede("user:alice", [newest.id], later.id) == []


def test_hits_are_counted_and_restart_the_decay_clock(memories):
    entry = memories.add(NewMemory("user:alice", "Prefers metric units", "preference", "user_explicit"), now=100.0)
    memories.used([entry.id], now=200.0)
    memories.used([entry.id], now=300.0)
    stored = memories.get("user:alice", entry.id)
    assert (stored.hits, stored.last_used_at, stored.created_at) == (2, 300.0, 100.0)


def test_linking_moves_the_joining_users_entries_and_nobody_elses(memories):
    """``Directory.link``: the entries of the user who sent ``/link CODE`` (their own, and theirs in
    groups with per-member scope) move to the code's user in the link's transaction; other users'
    entries, a group's own and another member's stay."""
    from gateway.core.types import ChatAddress, InboundMessage, Sender
    from gateway.memory.store import member_suffix, move_user_entries, user_owner
    from gateway.sessions.directory import Directory

    directory = Directory(memories.engine, on_join=[move_user_entries])

    def user_of(platform: str, user: str) -> str:
        message = InboundMessage(ChatAddress(platform, "T1", user), f"m-{user}", "dm", Sender(user, user), "hi")
        return directory.identify(message).user_id

    telegram, slack, bob = user_of("telegram", "1001"), user_of("slack", "U1"), user_of("telegram", "1002")
    chat = "group:telegram:T1:chat:-100"
    for owner, said in [(user_owner(telegram), "Locker code is 8264"), (chat + member_suffix(telegram), "Desk 4"),
                        (user_owner(slack), "Bike is green"), (user_owner(bob), "Bob's locker is 1111"),
                        (chat, "Deploys on Friday"), (chat + member_suffix(bob), "Bob sits at desk 9")]:
        memories.add(NewMemory(owner, said, "fact", "user_explicit"))
    assert directory.link(directory.new_code(slack, "link"), telegram) == slack

    def texts(owner: str) -> list[str]:
        return [m.text for m in memories.entries(owner)]

    assert texts(user_owner(slack)) == ["Locker code is 8264", "Bike is green"]
    assert texts(chat + member_suffix(slack)) == ["Desk 4"]
    assert texts(user_owner(telegram)) == [] and texts(chat + member_suffix(telegram)) == []
    assert texts(user_owner(bob)) == ["Bob's locker is 1111"] and texts(chat) == ["Deploys on Friday"]
    assert texts(chat + member_suffix(bob)) == ["Bob sits at desk 9"]
