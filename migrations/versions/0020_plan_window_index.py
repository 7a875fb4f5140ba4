"""plan window index: the scheduling pass reads the head of each shape of queued job

The worker's pass reads, of the queued jobs that never ran, the first 256 of each shape
(every column the planner reads, ``store.jobs.queued_for_planning``). Ranked by a window
function over this index, in its order, SQLite walks index entries only: no sort, and
the rows of a 10,000-job flood are never read, only those of its first 256.

Revision ID: 0023w
Revises: 0023h
Create Date: 2026-12-02 15:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0023w"
down_revision = "0023h"
branch_labels = None
depends_on = None

# As in store.models.job.PLAN_SHAPE_INDEX on the day this was written (a migration never
# follows the model later on).
COLUMNS = [
    "state",
    "owner",
    "priority",
    "gpus",
    "launcher",
    "sweep_id",
    "gpu_mem_bytes",
    "gpu_share",
    "gpu_mem_auto",
    "mem_key",
    "gpu_link",
    "gpu_type",
    "cpus",
    "ram_bytes",
    "time_limit_s",
    "attempt",
    "submitted_at",
    "id",
]


def upgrade() -> None:
    op.create_index("ix_jobs_plan_shape", "jobs", COLUMNS)
    # The queued jobs no pass has given a reason yet: those past the window are told why
    # they wait through this, without a walk over the queue.
    where = sa.text("state = 'queued' AND reason = ''")
    op.create_index("ix_jobs_unplanned", "jobs", ["id"], sqlite_where=where)


def downgrade() -> None:
    op.drop_index("ix_jobs_unplanned", table_name="jobs")
    op.drop_index("ix_jobs_plan_shape", table_name="jobs")
