"""group_messages: group messages not addressed to the bot, kept as group context

Revision ID: 0802
Revises: 0801
Create Date: 2026-12-02 09:00:00
"""

from alembic import op
import sqlalchemy as sa


revision = '0802'
down_revision = '0801'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('group_messages',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('platform', sa.String(length=32), nullable=False),
    sa.Column('tenant', sa.String(length=128), nullable=False),
    sa.Column('chat_id', sa.String(length=255), nullable=False),
    sa.Column('thread_id', sa.String(length=255), nullable=True),
    sa.Column('platform_message_id', sa.String(length=255), nullable=False),
    sa.Column('author', sa.String(length=255), nullable=False),
    sa.Column('text', sa.Text(), nullable=False),
    sa.Column('attachments', sa.JSON(), nullable=False),
    sa.Column('received_at', sa.Float(), nullable=False),
    sa.Column('stored_at', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('platform', 'tenant', 'platform_message_id', name='uq_group_messages_platform_message')
    )
    op.create_index('ix_group_messages_chat', 'group_messages', ['platform', 'tenant', 'chat_id', 'received_at'],
                    unique=False)
    op.create_index('ix_group_messages_stored_at', 'group_messages', ['stored_at'], unique=False)


def downgrade() -> None:
    op.drop_index('ix_group_messages_stored_at', table_name='group_messages')
    op.drop_index('ix_group_messages_chat', table_name='group_messages')
    op.drop_table('group_messages')
