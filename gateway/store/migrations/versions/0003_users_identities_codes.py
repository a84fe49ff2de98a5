"""users identities codes

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30 03:44:47.836976
"""

from alembic import op
import sqlalchemy as sa


revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:

    op.create_table('codes',
    sa.Column('code', sa.String(length=16), nullable=False),
    sa.Column('kind', sa.String(length=16), nullable=False),
    sa.Column('user_id', sa.String(length=32), nullable=False),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.Column('expires_at', sa.Float(), nullable=False),
    sa.Column('used_at', sa.Float(), nullable=True),
    sa.PrimaryKeyConstraint('code')
    )
    with op.batch_alter_table('codes', schema=None) as batch_op:
        batch_op.create_index('ix_codes_user_kind', ['user_id', 'kind', 'created_at'], unique=False)

    op.create_table('identities',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('user_id', sa.String(length=32), nullable=False),
    sa.Column('platform', sa.String(length=32), nullable=False),
    sa.Column('tenant', sa.String(length=128), nullable=False),
    sa.Column('platform_user_id', sa.String(length=128), nullable=False),
    sa.Column('display_name', sa.String(length=255), nullable=True),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.Column('linked_at', sa.Float(), nullable=True),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('platform', 'tenant', 'platform_user_id', name='uq_identity')
    )
    with op.batch_alter_table('identities', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_identities_user_id'), ['user_id'], unique=False)

    op.create_table('session_addresses',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('session_id', sa.String(length=32), nullable=False),
    sa.Column('chat_key', sa.String(length=255), nullable=False),
    sa.Column('address', sa.JSON(), nullable=False),
    sa.Column('last_used_at', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('session_id', 'chat_key', name='uq_session_address')
    )
    op.create_table('users',
    sa.Column('id', sa.String(length=32), nullable=False),
    sa.Column('approved', sa.Boolean(), nullable=False),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('inbox', schema=None) as batch_op:
        batch_op.add_column(sa.Column('user_id', sa.String(length=32), nullable=True))

    with op.batch_alter_table('sessions', schema=None) as batch_op:
        batch_op.add_column(sa.Column('owner_user_id', sa.String(length=32), nullable=True))
        batch_op.add_column(sa.Column('title', sa.String(length=120), nullable=True))
        batch_op.create_index(batch_op.f('ix_sessions_owner_user_id'), ['owner_user_id'], unique=False)




def downgrade() -> None:

    with op.batch_alter_table('sessions', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_sessions_owner_user_id'))
        batch_op.drop_column('title')
        batch_op.drop_column('owner_user_id')

    with op.batch_alter_table('inbox', schema=None) as batch_op:
        batch_op.drop_column('user_id')

    op.drop_table('users')
    op.drop_table('session_addresses')
    with op.batch_alter_table('identities', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_identities_user_id'))

    op.drop_table('identities')
    with op.batch_alter_table('codes', schema=None) as batch_op:
        batch_op.drop_index('ix_codes_user_kind')

    op.drop_table('codes')

