"""inbox.crashes: how often the gateway died while the row's turn ran (a crash-looping turn is given up)

Revision ID: 0811
Revises: 0810
Create Date: 2026-12-06 05:40:00
"""

from alembic import op
import sqlalchemy as sa


revision = '0811'
down_revision = '0810'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('inbox') as batch_op:
        batch_op.add_column(sa.Column('crashes', sa.Integer(), server_default=sa.text('0'), nullable=False))


def downgrade() -> None:
    with op.batch_alter_table('inbox') as batch_op:
        batch_op.drop_column('crashes')
