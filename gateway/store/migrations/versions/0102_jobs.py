"""scheduled report jobs and their runs

Revision ID: 0102
Revises: 0003
"""

from alembic import op
import sqlalchemy as sa


revision = '0102'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('jobs',
    sa.Column('id', sa.String(length=16), nullable=False),
    sa.Column('owner', sa.String(length=255), nullable=False),
    sa.Column('owner_name', sa.String(length=255), nullable=False),
    sa.Column('owner_dm', sa.JSON(), nullable=True),
    sa.Column('target', sa.JSON(), nullable=False),
    sa.Column('schedule_kind', sa.String(length=16), nullable=False),
    sa.Column('schedule', sa.String(length=255), nullable=False),
    sa.Column('timezone', sa.String(length=64), nullable=False),
    sa.Column('prompt', sa.Text(), nullable=False),
    sa.Column('toolset', sa.String(length=64), nullable=False),
    sa.Column('enabled', sa.Boolean(), nullable=False),
    sa.Column('source', sa.String(length=255), nullable=True),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.Column('updated_at', sa.Float(), nullable=False),
    sa.Column('last_fire_at', sa.Float(), nullable=True),
    sa.Column('next_fire_at', sa.Float(), nullable=True),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('source')
    )
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_jobs_owner'), ['owner'], unique=False)

    op.create_table('job_runs',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('job_id', sa.String(length=16), nullable=False),
    sa.Column('scheduled_at', sa.Float(), nullable=False),
    sa.Column('trigger', sa.String(length=16), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('claimed_by', sa.String(length=128), nullable=True),
    sa.Column('claim_until', sa.Float(), nullable=False),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('session_id', sa.String(length=32), nullable=True),
    sa.Column('outbox_id', sa.Integer(), nullable=True),
    sa.Column('platform_message_ids', sa.JSON(), nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('started_at', sa.Float(), nullable=False),
    sa.Column('finished_at', sa.Float(), nullable=True),
    sa.Column('notified_at', sa.Float(), nullable=True),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('job_id', 'scheduled_at', name='uq_job_runs_job_scheduled')
    )
    with op.batch_alter_table('job_runs', schema=None) as batch_op:
        batch_op.create_index('ix_job_runs_outbox_id', ['outbox_id'], unique=False)
        batch_op.create_index('ix_job_runs_status_claim', ['status', 'claim_until'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('job_runs', schema=None) as batch_op:
        batch_op.drop_index('ix_job_runs_status_claim')
        batch_op.drop_index('ix_job_runs_outbox_id')

    op.drop_table('job_runs')
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_jobs_owner'))

    op.drop_table('jobs')
