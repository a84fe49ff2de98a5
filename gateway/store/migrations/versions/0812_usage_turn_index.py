"""usage.turn_id indexed: a turn resumed after a restart reads what it spent already

Revision ID: 0812
Revises: 0811
Create Date: 2026-12-06 20:50:00
"""

from alembic import op


revision = '0812'
down_revision = '0811'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index('ix_usage_turn', 'usage', ['turn_id'])


def downgrade() -> None:
    op.drop_index('ix_usage_turn', table_name='usage')
