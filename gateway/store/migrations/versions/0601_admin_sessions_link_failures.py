"""admin_sessions: revocable admin logins; link_failures: wrong /link guesses

Revision ID: 0601
Revises: 0401
Create Date: 2026-11-30 06:40:00
"""

from alembic import op
import sqlalchemy as sa


revision = '0601'
down_revision = '0401'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('admin_sessions',
    sa.Column('id', sa.String(length=64), nullable=False),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.Column('expires_at', sa.Float(), nullable=False),
    sa.Column('revoked_at', sa.Float(), nullable=True),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_table('link_failures',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('user_id', sa.String(length=32), nullable=False),
    sa.Column('failed_at', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('link_failures', schema=None) as batch_op:
        batch_op.create_index('ix_link_failures_user_at', ['user_id', 'failed_at'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('link_failures', schema=None) as batch_op:
        batch_op.drop_index('ix_link_failures_user_at')
    op.drop_table('link_failures')
    op.drop_table('admin_sessions')
