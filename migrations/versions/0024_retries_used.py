"""Retries used, counted (``jobs.retries_used``): a failure that was retried adds one.
Before, a job's attempt number stood for it, so every free requeue (a port clash, a lost
launch, a preemption, a launch put off for a full disk) used up one of its ``--retries``.
Existing jobs start with what their attempts say, less those free requeues.

Revision ID: 0025r
Revises: 0024e
Create Date: 2026-12-05 10:10:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0025r"
down_revision = "0024e"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(
            sa.Column("retries_used", sa.Integer(), nullable=False, server_default="0")
        )
    op.execute(
        "UPDATE jobs SET retries_used = MAX(0, MIN(max_retries, attempt - 1 - port_retries"
        " - relaunches - preemptions - oom_requeues)) WHERE attempt > 1"
    )


def downgrade() -> None:
    # A plain column: dropped in place, so jobs keeps its AUTOINCREMENT (0021j).
    op.execute("ALTER TABLE jobs DROP COLUMN retries_used")
