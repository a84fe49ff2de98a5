"""admin_sessions: revocable admin logins

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


def downgrade() -> None:
    op.drop_table('admin_sessions')
