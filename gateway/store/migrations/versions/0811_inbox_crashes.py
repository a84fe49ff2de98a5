"""inbox.crashes, inbox.last_try: how often the gateway died while the row's turn ran (a crash-looping turn is given up)

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
        batch_op.add_column(sa.Column('last_try', sa.Boolean(), server_default=sa.text('false'), nullable=False))


def downgrade() -> None:
    with op.batch_alter_table('inbox') as batch_op:
        batch_op.drop_column('last_try')
        batch_op.drop_column('crashes')
