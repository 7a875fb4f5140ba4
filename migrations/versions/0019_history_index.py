"""history: indexes for ``ddpq history`` (issue 26)

``GET /v1/history`` lists finished jobs newest first, in a window of end times, for one
owner or for everyone, a page at a time. Each is a walk down one index in end-time order
(the job id rides in every entry, so the order by (ended_at, id) is the index's own) and
stops at the page's last row: with 100,000 finished jobs a page costs what it costs on ten.

Revision ID: 0023h
Revises: 0022t
Create Date: 2026-12-02 15:30:00
"""

from __future__ import annotations

from alembic import op

revision = "0023h"
down_revision = "0022t"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_jobs_ended", "jobs", ["ended_at"])
    op.create_index("ix_jobs_owner_ended", "jobs", ["owner", "ended_at"])


def downgrade() -> None:
    op.drop_index("ix_jobs_owner_ended", table_name="jobs")
    op.drop_index("ix_jobs_ended", table_name="jobs")
