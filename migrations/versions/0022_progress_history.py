"""Progress history and predicted starts (issue 25): what ``srpt-progress`` ranks by in
the daemon, and when each queued job is expected to start

``progress_samples``: the newest few progress records of each job (its fraction done as
``done`` of ``total``, at the daemon's clock, per attempt), bounded per job by the store
(``store.progress``), from which a job's own rate is measured. ``jobs.predicted_start``:
the worker's forecast of a queued job's start (NULL: unknown), refreshed every few passes.

Revision ID: 0023p
Revises: 0023d
Create Date: 2026-12-02 15:20:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0023p"
down_revision = "0023d"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "progress_samples",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column(
            "job_id", sa.Integer(), sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("done", sa.Float(), nullable=False),
        sa.Column("total", sa.Float(), nullable=False),
    )
    op.create_index("ix_progress_samples_job", "progress_samples", ["job_id", "id"])
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("predicted_start", sa.Float(), nullable=True))


def downgrade() -> None:
    # A plain nullable column: dropped in place, so jobs keeps its AUTOINCREMENT (0021j).
    op.execute("ALTER TABLE jobs DROP COLUMN predicted_start")
    op.drop_index("ix_progress_samples_job", table_name="progress_samples")
    op.drop_table("progress_samples")
