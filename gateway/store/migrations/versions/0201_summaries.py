"""summaries of older turns (context window compression)

Revision ID: 0201
Revises: 0102
"""

import sqlalchemy as sa
from alembic import op

revision = "0201"
down_revision = '0102'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "summaries",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("session_id", sa.String(length=32), nullable=False),
        sa.Column("covers_to_id", sa.Integer(), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("prompt_tokens", sa.Integer(), nullable=True),
        sa.Column("completion_tokens", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("summaries", schema=None) as batch_op:
        batch_op.create_index("ix_summaries_session_id_id", ["session_id", "id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("summaries", schema=None) as batch_op:
        batch_op.drop_index("ix_summaries_session_id_id")
    op.drop_table("summaries")
