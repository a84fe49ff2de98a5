"""memories: long-term memory entries with full-text search

Revision ID: 0401
Revises: 0301
Create Date: 2026-11-30 05:40:00
"""

from alembic import op
import sqlalchemy as sa


revision = '0401'
down_revision = '0301'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('memories',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('owner', sa.String(length=255), nullable=False),
    sa.Column('text', sa.Text(), nullable=False),
    sa.Column('type', sa.String(length=16), nullable=False),
    sa.Column('source', sa.String(length=16), nullable=False),
    sa.Column('confidence', sa.Float(), nullable=False),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.Column('last_used_at', sa.Float(), nullable=True),
    sa.Column('hits', sa.Integer(), nullable=False),
    sa.Column('weight', sa.Float(), nullable=False),
    sa.Column('superseded_by', sa.Integer(), nullable=True),
    sa.Column('evidence', sa.JSON(), nullable=False),
    sa.Column('embedding', sa.JSON(), nullable=True),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('memories', schema=None) as batch_op:
        batch_op.create_index('ix_memories_owner_superseded', ['owner', 'superseded_by'], unique=False)
    if op.get_bind().dialect.name == 'postgresql':
        op.execute("CREATE INDEX ix_memories_fts ON memories USING GIN (to_tsvector('english', text))")
    else:
        # External-content FTS5 index over memories.text, kept in step by triggers.
        op.execute("DROP TABLE IF EXISTS memories_fts")  # a leftover of a table dropped outside Alembic
        op.execute("CREATE VIRTUAL TABLE memories_fts USING fts5(text, content='memories', content_rowid='id', "
                   "tokenize='porter unicode61 remove_diacritics 2')")
        op.execute("CREATE TRIGGER memories_fts_insert AFTER INSERT ON memories BEGIN "
                   "INSERT INTO memories_fts(rowid, text) VALUES (new.id, new.text); END")
        op.execute("CREATE TRIGGER memories_fts_delete AFTER DELETE ON memories BEGIN "
                   "INSERT INTO memories_fts(memories_fts, rowid, text) VALUES ('delete', old.id, old.text); END")
        op.execute("CREATE TRIGGER memories_fts_update AFTER UPDATE OF text ON memories BEGIN "
                   "INSERT INTO memories_fts(memories_fts, rowid, text) VALUES ('delete', old.id, old.text); "
                   "INSERT INTO memories_fts(rowid, text) VALUES (new.id, new.text); END")


def downgrade() -> None:
    if op.get_bind().dialect.name == 'postgresql':
        op.execute("DROP INDEX IF EXISTS ix_memories_fts")
    else:
        for trigger in ('memories_fts_insert', 'memories_fts_delete', 'memories_fts_update'):
            op.execute(f"DROP TRIGGER IF EXISTS {trigger}")
        op.execute("DROP TABLE IF EXISTS memories_fts")
    with op.batch_alter_table('memories', schema=None) as batch_op:
        batch_op.drop_index('ix_memories_owner_superseded')
    op.drop_table('memories')
