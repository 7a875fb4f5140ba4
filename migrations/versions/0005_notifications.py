"""notifications: a job's URL to POST its end to, and every attempt to deliver it

Revision ID: 0005n
Revises: 0004
Create Date: 2026-12-01 21:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005n"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("notify_url", sa.Text(), nullable=True))
        batch_op.add_column(sa.Column("notify_done_at", sa.Float(), nullable=True))
        batch_op.create_index(
            "ix_jobs_notify_pending",
            ["id"],
            unique=False,
            sqlite_where=sa.text("notify_url IS NOT NULL AND notify_done_at IS NULL"),
        )
    op.create_table(
        "notifications",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("status", sa.Integer(), nullable=True),
        sa.Column("error", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("notifications", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_notifications_job_id"), ["job_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("notifications", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_notifications_job_id"))
    op.drop_table("notifications")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index(
            "ix_jobs_notify_pending",
            sqlite_where=sa.text("notify_url IS NOT NULL AND notify_done_at IS NULL"),
        )
        batch_op.drop_column("notify_done_at")
        batch_op.drop_column("notify_url")
