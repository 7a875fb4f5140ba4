"""outside use: intervals of GPU use by processes in no ddpq job, per account and GPU

Revision ID: 0012u
Revises: 0012m
Create Date: 2026-12-09 10:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012u"
down_revision = "0012m"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "outside_use",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("uid", sa.Integer(), nullable=True),
        sa.Column("account", sa.String(length=64), nullable=True),
        sa.Column("gpu", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=False),
        sa.Column("ended_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("outside_use", schema=None) as batch_op:
        batch_op.create_index(
            "ix_outside_use_gpu_uid_ended", ["gpu", "uid", "ended_at"], unique=False
        )
        batch_op.create_index("ix_outside_use_ended_at", ["ended_at"], unique=False)


def downgrade() -> None:
    # The history of outside use goes with it; jobs, attempts and users are untouched.
    op.drop_table("outside_use")
