"""``MemoryStore`` on SQLite (FTS5) and PostgreSQL (full-text): owner isolation, supersede chains,
forgetting, hits; Chinese and Japanese found by part of a word, through the index, also for
entries an older release wrote (migration ``0806``)."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from gateway.memory.store import MemoryStore, NewMemory
from gateway.memory.terms import index_text, words
from gateway.store.db import create_db_engine
from gateway.store.models import MemoryRow, table


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
        erased = conn.execute(text("SELECT count(*) FROM memories WHERE text LIKE :w OR search_text LIKE :w"),
                              {"w": "%office%"})
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


def find(memories, owner: str, query: str) -> list[str]:
    return [m.text for m in memories.keyword_search(owner, words(query))]


def test_chinese_and_japanese_are_found_by_part_of_a_word(memories):
    memories.add(NewMemory("user:alice", "我喜欢喝乌龙茶", "preference", "user_explicit"))
    memories.add(NewMemory("user:alice", "私はコーヒーが好きです", "preference", "user_explicit"))
    memories.add(NewMemory("user:alice", "我的车是一辆红色的沃尔沃", "fact", "user_explicit"))
    memories.add(NewMemory("user:bob", "我喜欢喝红茶", "preference", "user_explicit"))
    assert find(memories, "user:alice", "茶") == ["我喜欢喝乌龙茶"]  # one character of a three-character word
    assert find(memories, "user:alice", "喜欢") == ["我喜欢喝乌龙茶"]
    assert find(memories, "user:alice", "我开什么车？") == ["我的车是一辆红色的沃尔沃"]  # a word inside a run
    assert find(memories, "user:alice", "コーヒー") == ["私はコーヒーが好きです"]
    assert find(memories, "user:alice", "乌龙茶 coffee") == ["我喜欢喝乌龙茶"]
    assert find(memories, "user:alice", "我的是什么？") == []  # only stop words: nothing to look for
    assert find(memories, "user:bob", "乌龙茶") == ["我喜欢喝红茶"]  # never another owner's


def test_keyword_search_runs_on_the_full_text_index(memories):
    """The query the store sends is answered from the index: SQLite's FTS5 table, PostgreSQL's GIN
    index on the same expression (once the table is big enough for the planner to want it)."""
    from gateway.memory import store

    rows = [{"owner": "user:alice", "text": t, "search_text": index_text(t), "type": "fact", "source": "import",
             "confidence": 1.0, "created_at": 1.0, "hits": 0, "weight": 1.0, "evidence": []}
            for t in (f"第{n}条会议记录，编号{n}" for n in range(3000))]
    with memories.engine.begin() as conn:
        conn.execute(table(MemoryRow).insert(), rows)
    memories.add(NewMemory("user:alice", "我喜欢喝乌龙茶", "preference", "user_explicit"))
    params = {"owner": "user:alice", "limit": 50}
    with memories.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        if conn.dialect.name == "postgresql":
            conn.exec_driver_sql("VACUUM ANALYZE memories")
            plan = conn.execute(text(f"EXPLAIN {store._PG_SEARCH.element.text}"),
                                {**params, "query": "茶 | 龙"}).scalars()
        else:
            plan = conn.execute(text(f"EXPLAIN QUERY PLAN {store._SQLITE_SEARCH.element.text}"),
                                {**params, "query": '"茶" OR "龙"'}).all()
        plan = " ".join(str(line) for line in plan)
    assert ("ix_memories_fts" in plan) if conn.dialect.name == "postgresql" else ("VIRTUAL TABLE INDEX" in plan)
    assert find(memories, "user:alice", "乌龙茶") == ["我喜欢喝乌龙茶"]


def test_an_entry_without_analysis_is_analysed_at_start_and_a_stale_one_is_cleared(memories):
    """An entry stored without ``search_text`` (before migration 0806, or by an older release during
    a rolling upgrade) is found by its whole words on PostgreSQL and by every character once
    ``analyse_missing`` (run at start) fills it; a text changed without it (an older release's
    ``/forget``) clears the analysis, so no old words stay in the column or the index."""
    postgres = memories.engine.dialect.name == "postgresql"
    with memories.engine.begin() as conn:
        conn.execute(text("INSERT INTO memories (owner, text, type, source, confidence, created_at, hits, weight, "
                          "evidence) VALUES ('user:alice', :t, 'fact', 'import', 1, 1, 0, 1, '[]')"),
                     [{"t": f"Tea {n}: 我喜欢喝乌龙茶"} for n in range(3)])
    assert len(find(memories, "user:alice", "tea")) == (3 if postgres else 0)
    assert find(memories, "user:alice", "茶") == []
    assert memories.analyse_missing(batch=2) == 3 and memories.analyse_missing() == 0
    assert len(find(memories, "user:alice", "茶")) == len(find(memories, "user:alice", "tea")) == 3

    kept = memories.add(NewMemory("user:alice", "我的车是红色的沃尔沃", "fact", "user_explicit"))
    with memories.engine.begin() as conn:  # the older release's /forget: text emptied, search_text untouched
        conn.execute(text("UPDATE memories SET text = '', superseded_by = id WHERE id = :id"), {"id": kept.id})
        left = conn.execute(text("SELECT search_text FROM memories WHERE id = :id"), {"id": kept.id}).scalar_one()
        conn.execute(text("UPDATE memories SET superseded_by = NULL WHERE id = :id"), {"id": kept.id})
    assert left is None
    assert find(memories, "user:alice", "沃尔沃") == []  # gone from the index too
    assert memories.analyse_missing() == 1
    assert len(find(memories, "user:alice", "茶")) == 3
    with memories.engine.begin() as conn:
        if conn.dialect.name == "sqlite":  # the FTS5 index agrees with its content table
            conn.exec_driver_sql("INSERT INTO memories_fts(memories_fts, rank) VALUES ('integrity-check', 1)")
            conn.exec_driver_sql("INSERT INTO memories_fts(memories_fts) VALUES ('rebuild')")
    assert len(find(memories, "user:alice", "茶")) == 3


def test_the_migration_keeps_existing_entries_and_goes_back_cleanly(db_url):
    """Entries stored before migration 0806 are analysed at the next start and then found by part
    of a word; its downgrade restores the index over ``text``."""
    from alembic import command
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    from gateway.store.db import MIGRATIONS_DIR, sa_connection, write_tx
    from gateway.store.models import Base

    engine = create_db_engine(db_url)
    Base.metadata.drop_all(engine)
    with engine.begin() as conn:
        conn.exec_driver_sql("DROP TABLE IF EXISTS alembic_version")
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    before = ScriptDirectory.from_config(cfg).get_revision("0806").down_revision

    def migrate(step, target) -> None:
        with write_tx(engine) as conn:
            cfg.attributes["connection"] = sa_connection(conn)
            step(cfg, target)

    migrate(command.upgrade, before)
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO memories (owner, text, type, source, confidence, created_at, hits, weight, "
                          "evidence) VALUES ('user:alice', :t, 'fact', 'import', 1, 1, 0, 1, '[]')"),
                     [{"t": "我喜欢喝乌龙茶"}, {"t": "Alice reports sales figures"}])
    migrate(command.upgrade, "heads")
    memories = MemoryStore(engine)
    assert memories.analyse_missing() == 2
    assert find(memories, "user:alice", "茶") == ["我喜欢喝乌龙茶"]
    assert find(memories, "user:alice", "report") == ["Alice reports sales figures"]
    migrate(command.downgrade, "0806@-1")  # this migration only, whatever else is at head
    with engine.connect() as conn:
        if conn.dialect.name == "sqlite":
            found = conn.exec_driver_sql("SELECT rowid FROM memories_fts WHERE memories_fts MATCH 'report'").all()
        else:
            found = conn.exec_driver_sql("SELECT id FROM memories WHERE to_tsvector('english', text) @@ "
                                         "to_tsquery('english', 'report')").all()
    assert len(found) == 1
    migrate(command.upgrade, "heads")
    memories.analyse_missing()
    assert find(memories, "user:alice", "茶") == ["我喜欢喝乌龙茶"]
    engine.dispose()
