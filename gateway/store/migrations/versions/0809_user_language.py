"""users.language: the locale a user chose with /language

Revision ID: 0809
Revises: 0806
Create Date: 2026-12-01 13:50:00
"""

from alembic import op
import sqlalchemy as sa


revision = '0809'
down_revision = '0807'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('users') as batch_op:
        batch_op.add_column(sa.Column('language', sa.String(length=16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('users') as batch_op:
        batch_op.drop_column('language')
