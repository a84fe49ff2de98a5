"""instances: which process holds each instance id, with its heartbeat

Revision ID: 0701
Revises: 0601
Create Date: 2026-12-01 09:00:00
"""

from alembic import op
import sqlalchemy as sa


revision = '0701'
down_revision = '0601'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('instances',
    sa.Column('id', sa.String(length=128), nullable=False),
    sa.Column('boot', sa.String(length=32), nullable=False),
    sa.Column('host', sa.String(length=255), nullable=False),
    sa.Column('pid', sa.Integer(), nullable=False),
    sa.Column('pid_scope', sa.String(length=255), nullable=False),
    sa.Column('pid_start', sa.String(length=32), nullable=True),
    sa.Column('started_at', sa.Float(), nullable=False),
    sa.Column('heartbeat_at', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )


def downgrade() -> None:
    op.drop_table('instances')
