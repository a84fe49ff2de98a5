"""usage: tokens and cost of every model call, and the limit notices

Revision ID: 0808
Revises: 0806
Create Date: 2026-12-01 14:00:00

``usage`` holds one row per model call (written with the call's transcript message), summed per
user, chat and model per day and month by ``gateway.ops.usage``; ``limit_notices`` records that a
user or chat over a limit was told (once per period); ``ix_inbox_user_received`` counts a user's
messages of the last minute (``limits.user_messages_per_minute``).
"""

from alembic import op
import sqlalchemy as sa


revision = '0808'
down_revision = '0809'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('usage',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('call_key', sa.String(length=96), nullable=False),
    sa.Column('turn_id', sa.String(length=64), nullable=True),
    sa.Column('user_id', sa.String(length=32), nullable=True),
    sa.Column('chat_key', sa.String(length=255), nullable=False),
    sa.Column('session_key', sa.String(length=255), nullable=True),
    sa.Column('platform', sa.String(length=32), nullable=False),
    sa.Column('provider', sa.String(length=64), nullable=False),
    sa.Column('model', sa.String(length=128), nullable=False),
    sa.Column('day', sa.String(length=10), nullable=False),
    sa.Column('prompt_tokens', sa.Integer(), nullable=False),
    sa.Column('cached_tokens', sa.Integer(), nullable=False),
    sa.Column('completion_tokens', sa.Integer(), nullable=False),
    sa.Column('cost_usd', sa.Float(), nullable=False),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('call_key', name='uq_usage_call')
    )
    with op.batch_alter_table('usage', schema=None) as batch_op:
        batch_op.create_index('ix_usage_user_day', ['user_id', 'day'], unique=False)
        batch_op.create_index('ix_usage_chat_day', ['chat_key', 'day'], unique=False)
        batch_op.create_index('ix_usage_day', ['day'], unique=False)
    op.create_table('limit_notices',
    sa.Column('subject', sa.String(length=255), nullable=False),
    sa.Column('limit_name', sa.String(length=64), nullable=False),
    sa.Column('period', sa.String(length=32), nullable=False),
    sa.Column('inbox_id', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('subject', 'limit_name', 'period')
    )
    with op.batch_alter_table('inbox', schema=None) as batch_op:
        batch_op.create_index('ix_inbox_user_received', ['user_id', 'received_at'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('inbox', schema=None) as batch_op:
        batch_op.drop_index('ix_inbox_user_received')
    op.drop_table('limit_notices')
    with op.batch_alter_table('usage', schema=None) as batch_op:
        batch_op.drop_index('ix_usage_day')
        batch_op.drop_index('ix_usage_chat_day')
        batch_op.drop_index('ix_usage_user_day')
    op.drop_table('usage')
