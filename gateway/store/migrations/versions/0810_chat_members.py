"""chat_members: who has written from which chat (filled from the inbox); session_addresses dropped

The scheduler's permission and address look-ups read chat_members instead of scanning the inbox's
JSON, so settled inbox rows can be deleted after database.keep_settled_days. session_addresses was
written on every turn and read nowhere.

Revision ID: 0810
Revises: 0808
Create Date: 2026-12-06 02:45:00
"""

from alembic import op
import sqlalchemy as sa


revision = '0810'
down_revision = '0808'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'chat_members',
        sa.Column('platform', sa.String(length=32), nullable=False),
        sa.Column('tenant', sa.String(length=128), nullable=False),
        sa.Column('chat_id', sa.String(length=255), nullable=False),
        sa.Column('user_id', sa.String(length=255), nullable=False),
        sa.Column('chat_type', sa.String(length=16), nullable=False),
        sa.Column('first_seen_at', sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint('platform', 'tenant', 'chat_id', 'user_id'),
    )
    with op.batch_alter_table('chat_members') as batch_op:
        batch_op.create_index('ix_chat_members_chat', ['platform', 'chat_id'], unique=False)
        batch_op.create_index('ix_chat_members_user', ['platform', 'tenant', 'user_id', 'chat_type'], unique=False)
    inbox = sa.table('inbox', sa.column('platform', sa.String), sa.column('tenant', sa.String),
                     sa.column('payload', sa.JSON), sa.column('received_at', sa.Float))
    members = sa.table('chat_members', sa.column('platform'), sa.column('tenant'), sa.column('chat_id'),
                       sa.column('user_id'), sa.column('chat_type'), sa.column('first_seen_at'))
    chat_id = inbox.c.payload[('address', 'chat_id')].as_string()
    user_id = inbox.c.payload[('sender', 'user_id')].as_string()
    chat_type = inbox.c.payload['chat_type'].as_string()
    seen = (sa.select(inbox.c.platform, inbox.c.tenant, chat_id, user_id, sa.func.min(chat_type),
                      sa.func.min(inbox.c.received_at))
            .where(chat_id.is_not(None), user_id.is_not(None), chat_type.is_not(None))
            .group_by(inbox.c.platform, inbox.c.tenant, chat_id, user_id))
    op.execute(members.insert().from_select(
        ['platform', 'tenant', 'chat_id', 'user_id', 'chat_type', 'first_seen_at'], seen))
    op.drop_table('session_addresses')


def downgrade() -> None:
    op.create_table(
        'session_addresses',
        sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
        sa.Column('session_id', sa.String(length=32), nullable=False),
        sa.Column('chat_key', sa.String(length=255), nullable=False),
        sa.Column('address', sa.JSON(), nullable=False),
        sa.Column('last_used_at', sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint('id'),
        sa.UniqueConstraint('session_id', 'chat_key', name='uq_session_address'),
    )
    with op.batch_alter_table('chat_members') as batch_op:
        batch_op.drop_index('ix_chat_members_user')
        batch_op.drop_index('ix_chat_members_chat')
    op.drop_table('chat_members')
