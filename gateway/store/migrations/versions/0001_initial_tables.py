"""initial tables

Revision ID: 0001
Revises: 
Create Date: 2026-11-30 03:01:44.351693
"""

from alembic import op
import sqlalchemy as sa


revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:

    op.create_table('inbox',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('platform', sa.String(length=32), nullable=False),
    sa.Column('tenant', sa.String(length=128), nullable=False),
    sa.Column('platform_message_id', sa.String(length=255), nullable=False),
    sa.Column('session_key', sa.String(length=255), nullable=False),
    sa.Column('payload', sa.JSON(), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('received_at', sa.Float(), nullable=False),
    sa.Column('finished_at', sa.Float(), nullable=True),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('platform', 'tenant', 'platform_message_id', name='uq_inbox_platform_message')
    )
    with op.batch_alter_table('inbox', schema=None) as batch_op:
        batch_op.create_index('ix_inbox_key_status_id', ['session_key', 'status', 'id'], unique=False)
        batch_op.create_index('ix_inbox_status', ['status'], unique=False)

    op.create_table('lanes',
    sa.Column('key', sa.String(length=255), nullable=False),
    sa.Column('session_id', sa.String(length=32), nullable=True),
    sa.Column('lease_owner', sa.String(length=128), nullable=True),
    sa.Column('lease_until', sa.Float(), nullable=False),
    sa.Column('generation', sa.Integer(), nullable=False),
    sa.PrimaryKeyConstraint('key')
    )
    op.create_table('messages',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('session_id', sa.String(length=32), nullable=False),
    sa.Column('turn_id', sa.String(length=64), nullable=True),
    sa.Column('role', sa.String(length=16), nullable=False),
    sa.Column('content', sa.Text(), nullable=True),
    sa.Column('tool_calls', sa.JSON(), nullable=True),
    sa.Column('tool_call_id', sa.String(length=128), nullable=True),
    sa.Column('name', sa.String(length=128), nullable=True),
    sa.Column('meta', sa.JSON(), nullable=True),
    sa.Column('platform_message_id', sa.String(length=255), nullable=True),
    sa.Column('prompt_tokens', sa.Integer(), nullable=True),
    sa.Column('completion_tokens', sa.Integer(), nullable=True),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('messages', schema=None) as batch_op:
        batch_op.create_index('ix_messages_session_id_id', ['session_id', 'id'], unique=False)

    op.create_table('outbox',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('idempotency_key', sa.String(length=128), nullable=False),
    sa.Column('session_id', sa.String(length=32), nullable=True),
    sa.Column('session_key', sa.String(length=255), nullable=True),
    sa.Column('chat_key', sa.String(length=255), nullable=False),
    sa.Column('generation', sa.Integer(), nullable=False),
    sa.Column('address', sa.JSON(), nullable=False),
    sa.Column('text', sa.Text(), nullable=False),
    sa.Column('reply_to_id', sa.String(length=255), nullable=True),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('next_attempt_at', sa.Float(), nullable=False),
    sa.Column('claimed_by', sa.String(length=128), nullable=True),
    sa.Column('claim_until', sa.Float(), nullable=False),
    sa.Column('platform_message_ids', sa.JSON(), nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.Column('sent_at', sa.Float(), nullable=True),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('idempotency_key')
    )
    with op.batch_alter_table('outbox', schema=None) as batch_op:
        batch_op.create_index('ix_outbox_chat_status', ['chat_key', 'status', 'id'], unique=False)
        batch_op.create_index('ix_outbox_status_next', ['status', 'next_attempt_at'], unique=False)

    op.create_table('sessions',
    sa.Column('id', sa.String(length=32), nullable=False),
    sa.Column('key', sa.String(length=255), nullable=False),
    sa.Column('system_prompt', sa.Text(), nullable=False),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.Column('updated_at', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('sessions', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_sessions_key'), ['key'], unique=False)




def downgrade() -> None:

    with op.batch_alter_table('sessions', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_sessions_key'))

    op.drop_table('sessions')
    with op.batch_alter_table('outbox', schema=None) as batch_op:
        batch_op.drop_index('ix_outbox_status_next')
        batch_op.drop_index('ix_outbox_chat_status')

    op.drop_table('outbox')
    with op.batch_alter_table('messages', schema=None) as batch_op:
        batch_op.drop_index('ix_messages_session_id_id')

    op.drop_table('messages')
    op.drop_table('lanes')
    with op.batch_alter_table('inbox', schema=None) as batch_op:
        batch_op.drop_index('ix_inbox_status')
        batch_op.drop_index('ix_inbox_key_status_id')

    op.drop_table('inbox')

