"""chat_settings: settings admins set in a chat; sessions.settings: what a session was created with

Revision ID: 0807
Revises: 0806
Create Date: 2026-12-01 14:00:00

``chat_settings`` holds ``/model``, ``/persona`` and ``/busy`` per chat (stronger than the
``[[chats]]`` rules of the configuration). ``sessions.settings`` records the route, toolset and
persona a session was created with, so a change applies to the chat's next session and the
running one keeps its byte-identical system prompt and tools; existing sessions get ``NULL``
(the defaults, as before).
"""

from alembic import op
import sqlalchemy as sa


revision = '0807'
down_revision = '0806'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('chat_settings',
    sa.Column('platform', sa.String(length=32), nullable=False),
    sa.Column('tenant', sa.String(length=128), nullable=False),
    sa.Column('chat_id', sa.String(length=255), nullable=False),
    sa.Column('route', sa.String(length=64), nullable=True),
    sa.Column('persona', sa.Text(), nullable=True),
    sa.Column('busy_policy', sa.String(length=16), nullable=True),
    sa.Column('updated_by', sa.String(length=255), nullable=False),
    sa.Column('updated_at', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('platform', 'tenant', 'chat_id')
    )
    op.add_column('sessions', sa.Column('settings', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('sessions', schema=None) as batch_op:
        batch_op.drop_column('settings')
    op.drop_table('chat_settings')
