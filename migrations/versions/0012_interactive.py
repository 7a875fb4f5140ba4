"""interactive sessions: the flag, the idle limit, and since when a job's GPUs are idle

Revision ID: 0016i
Revises: 0012u
Create Date: 2026-12-03 10:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016i"
down_revision = "0012u"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("interactive", sa.Boolean(), nullable=False, server_default="0")
        )
        batch_op.add_column(sa.Column("idle_s", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("idle_since", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("idle_warned_at", sa.Float(), nullable=True))


def downgrade() -> None:
    # A session's row stays a job (it ran a shell); only what made it interactive goes.
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("idle_warned_at")
        batch_op.drop_column("idle_since")
        batch_op.drop_column("idle_s")
        batch_op.drop_column("interactive")
