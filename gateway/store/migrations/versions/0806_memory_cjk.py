"""memories.search_text: Chinese and Japanese found by character in the full-text index

Revision ID: 0806
Revises: 0803
Create Date: 2026-12-02 09:00:00

Both engines' default tokenizers keep a run of CJK characters as one token ("我喜欢喝乌龙茶"), so
a part of it never matched. The index now covers ``search_text``, the text with each CJK character
standing alone (``gateway.memory.terms.index_text``), which ``MemoryStore`` writes with the text
and, for rows that have none (every existing row after this migration, a row an older release
writes during a rolling upgrade), fills at the gateway's start (``MemoryStore.analyse_missing``).
Until then a row is indexed by its ``text`` on PostgreSQL (``coalesce``) and not at all on SQLite
(one process: the start that migrates also analyses, before anything is searched). A ``text``
changed without its ``search_text`` (an older release's ``/forget``, a hand edit) clears it, so no
stale words stay in the column or the index; SQLite's trigger relies on ``recursive_triggers``
being off (the default).
"""

from alembic import op
import sqlalchemy as sa


revision = '0806'
down_revision = '0803'
branch_labels = None
depends_on = None

_FTS_TOKENIZE = "tokenize='porter unicode61 remove_diacritics 2'"
_STALE = "new.text IS NOT old.text AND new.search_text IS old.search_text"


def upgrade() -> None:
    if op.get_bind().dialect.name == 'postgresql':
        op.add_column('memories', sa.Column('search_text', sa.Text(), nullable=True))
        op.execute("DROP INDEX IF EXISTS ix_memories_fts")
        op.execute("CREATE INDEX ix_memories_fts ON memories "
                   "USING GIN (to_tsvector('english', coalesce(search_text, text)))")
        op.execute("CREATE OR REPLACE FUNCTION memories_search_text_stale() RETURNS trigger LANGUAGE plpgsql AS $$ "
                   "BEGIN IF NEW.text IS DISTINCT FROM OLD.text AND NEW.search_text IS NOT DISTINCT FROM "
                   "OLD.search_text THEN NEW.search_text := NULL; END IF; RETURN NEW; END $$")
        op.execute("CREATE TRIGGER memories_search_text_stale BEFORE UPDATE OF text ON memories "
                   "FOR EACH ROW EXECUTE FUNCTION memories_search_text_stale()")
        return
    for trigger in ('memories_fts_insert', 'memories_fts_delete', 'memories_fts_update'):
        op.execute(f"DROP TRIGGER IF EXISTS {trigger}")
    op.execute("DROP TABLE IF EXISTS memories_fts")
    op.add_column('memories', sa.Column('search_text', sa.Text(), nullable=True))
    # External-content FTS5 index over memories.search_text, kept in step by triggers.
    op.execute("CREATE VIRTUAL TABLE memories_fts USING fts5(search_text, content='memories', "
               f"content_rowid='id', {_FTS_TOKENIZE})")
    op.execute("CREATE TRIGGER memories_fts_insert AFTER INSERT ON memories BEGIN "
               "INSERT INTO memories_fts(rowid, search_text) VALUES (new.id, new.search_text); END")
    op.execute("CREATE TRIGGER memories_fts_delete AFTER DELETE ON memories BEGIN "
               "INSERT INTO memories_fts(memories_fts, rowid, search_text) VALUES ('delete', old.id, old.search_text); "
               "END")
    op.execute("CREATE TRIGGER memories_fts_update AFTER UPDATE OF text, search_text ON memories BEGIN "
               "INSERT INTO memories_fts(memories_fts, rowid, search_text) VALUES ('delete', old.id, old.search_text); "
               f"INSERT INTO memories_fts(rowid, search_text) VALUES (new.id, CASE WHEN {_STALE} THEN NULL "
               "ELSE new.search_text END); "
               f"UPDATE memories SET search_text = NULL WHERE id = new.id AND {_STALE} "
               "AND new.search_text IS NOT NULL; END")
    op.execute("INSERT INTO memories_fts(memories_fts) VALUES ('rebuild')")  # every row in, none with words yet


def downgrade() -> None:
    sqlite = op.get_bind().dialect.name != 'postgresql'
    if sqlite:
        for trigger in ('memories_fts_insert', 'memories_fts_delete', 'memories_fts_update'):
            op.execute(f"DROP TRIGGER IF EXISTS {trigger}")
        op.execute("DROP TABLE IF EXISTS memories_fts")
    else:
        op.execute("DROP TRIGGER IF EXISTS memories_search_text_stale ON memories")
        op.execute("DROP FUNCTION IF EXISTS memories_search_text_stale()")
        op.execute("DROP INDEX IF EXISTS ix_memories_fts")
    with op.batch_alter_table('memories', schema=None) as batch_op:
        batch_op.drop_column('search_text')
    if sqlite:  # 0401's index over text
        op.execute(f"CREATE VIRTUAL TABLE memories_fts USING fts5(text, content='memories', content_rowid='id', "
                   f"{_FTS_TOKENIZE})")
        op.execute("CREATE TRIGGER memories_fts_insert AFTER INSERT ON memories BEGIN "
                   "INSERT INTO memories_fts(rowid, text) VALUES (new.id, new.text); END")
        op.execute("CREATE TRIGGER memories_fts_delete AFTER DELETE ON memories BEGIN "
                   "INSERT INTO memories_fts(memories_fts, rowid, text) VALUES ('delete', old.id, old.text); END")
        op.execute("CREATE TRIGGER memories_fts_update AFTER UPDATE OF text ON memories BEGIN "
                   "INSERT INTO memories_fts(memories_fts, rowid, text) VALUES ('delete', old.id, old.text); "
                   "INSERT INTO memories_fts(rowid, text) VALUES (new.id, new.text); END")
        op.execute("INSERT INTO memories_fts(memories_fts) VALUES ('rebuild')")
    else:
        op.execute("CREATE INDEX ix_memories_fts ON memories USING GIN (to_tsvector('english', text))")
