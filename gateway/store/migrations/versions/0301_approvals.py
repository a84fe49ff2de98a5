"""approvals; outbox buttons

Revision ID: 0301
Revises: 0201
Create Date: 2026-11-30 04:10:00
"""

from alembic import op
import sqlalchemy as sa


revision = '0301'
down_revision = '0201'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('approvals',
    sa.Column('id', sa.String(length=16), nullable=False),
    sa.Column('session_key', sa.String(length=255), nullable=False),
    sa.Column('turn_id', sa.String(length=64), nullable=False),
    sa.Column('call_id', sa.String(length=128), nullable=False),
    sa.Column('requested_by', sa.String(length=32), nullable=True),
    sa.Column('tool', sa.String(length=128), nullable=False),
    sa.Column('summary', sa.Text(), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('decided_by', sa.String(length=32), nullable=True),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.Column('expires_at', sa.Float(), nullable=False),
    sa.Column('decided_at', sa.Float(), nullable=True),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('approvals', schema=None) as batch_op:
        batch_op.create_index('ix_approvals_key_status', ['session_key', 'status'], unique=False)
    with op.batch_alter_table('outbox', schema=None) as batch_op:
        batch_op.add_column(sa.Column('buttons', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('outbox', schema=None) as batch_op:
        batch_op.drop_column('buttons')
    with op.batch_alter_table('approvals', schema=None) as batch_op:
        batch_op.drop_index('ix_approvals_key_status')
    op.drop_table('approvals')
