"""outbox files: the files the agent sends with a reply (send_file) and the outbox column carrying them

Revision ID: 0803
Revises: 0802
Create Date: 2026-12-02 12:00:00
"""

from alembic import op
import sqlalchemy as sa


revision = '0803'
down_revision = '0802'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('outbox_files',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('session_id', sa.String(length=32), nullable=False),
    sa.Column('turn_id', sa.String(length=64), nullable=False),
    sa.Column('call_id', sa.String(length=128), nullable=False),
    sa.Column('kind', sa.String(length=16), nullable=False),
    sa.Column('name', sa.String(length=255), nullable=False),
    sa.Column('mime_type', sa.String(length=255), nullable=False),
    sa.Column('size', sa.BigInteger(), nullable=False),
    sa.Column('sha256', sa.String(length=64), nullable=False),
    sa.Column('caption', sa.Text(), nullable=False),
    sa.Column('width', sa.Integer(), nullable=True),
    sa.Column('height', sa.Integer(), nullable=True),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('session_id', 'turn_id', 'call_id', name='uq_outbox_files_call')
    )
    with op.batch_alter_table('outbox', schema=None) as batch_op:
        batch_op.add_column(sa.Column('attachments', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('outbox', schema=None) as batch_op:
        batch_op.drop_column('attachments')
    op.drop_table('outbox_files')
