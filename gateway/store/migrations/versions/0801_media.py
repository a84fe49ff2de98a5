"""media: blobs (content-addressed bytes) and attachments (who uses which blob)

Revision ID: 0801
Revises: 0701
Create Date: 2026-12-02 09:00:00
"""

from alembic import op
import sqlalchemy as sa


revision = '0801'
down_revision = '0701'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('blobs',
    sa.Column('sha256', sa.String(length=64), nullable=False),
    sa.Column('size', sa.BigInteger(), nullable=False),
    sa.Column('mime_type', sa.String(length=255), nullable=False),
    sa.Column('data', sa.LargeBinary(), nullable=False),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('sha256')
    )
    if op.get_bind().dialect.name == 'postgresql':
        # bytea goes to the TOAST table above ~2 kB anyway; EXTERNAL skips the compression attempt
        # (media is compressed already) and keeps reads of a slice cheap.
        op.execute('ALTER TABLE blobs ALTER COLUMN data SET STORAGE EXTERNAL')
    op.create_table('attachments',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('sha256', sa.String(length=64), nullable=False),
    sa.Column('session_id', sa.String(length=32), nullable=True),
    sa.Column('owner_user_id', sa.String(length=32), nullable=True),
    sa.Column('turn_id', sa.String(length=64), nullable=True),
    sa.Column('role', sa.String(length=16), nullable=False),
    sa.Column('kind', sa.String(length=16), nullable=False),
    sa.Column('mime_type', sa.String(length=255), nullable=False),
    sa.Column('size', sa.BigInteger(), nullable=False),
    sa.Column('name', sa.String(length=255), nullable=True),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('attachments', schema=None) as batch_op:
        batch_op.create_index('ix_attachments_created', ['created_at'], unique=False)
        batch_op.create_index('ix_attachments_owner', ['owner_user_id'], unique=False)
        batch_op.create_index('ix_attachments_session', ['session_id'], unique=False)
        batch_op.create_index('ix_attachments_sha256', ['sha256'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('attachments', schema=None) as batch_op:
        batch_op.drop_index('ix_attachments_sha256')
        batch_op.drop_index('ix_attachments_session')
        batch_op.drop_index('ix_attachments_owner')
        batch_op.drop_index('ix_attachments_created')
    op.drop_table('attachments')
    op.drop_table('blobs')
