"""queue bounds: indexes for ``ddpq ls`` and the per-user caps on a long queue

``GET /v1/queue`` counts the matching jobs by (state, owner, sweep) and reads the first
rows of each group; the cap on waiting jobs counts one owner's queued and held jobs; a
folded sweep's counts group its members by state. Each is then a walk over one index
(the job id rides in every index entry), never over the jobs' rows: with 60,000 held
jobs of another user in the queue, ``ddpq ls`` costs what it costs on an empty one.

Revision ID: 0022q
Revises: 0021j
Create Date: 2026-12-02 13:00:00
"""

from __future__ import annotations

from alembic import op

revision = "0022q"
down_revision = "0021j"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_jobs_state_owner_sweep", "jobs", ["state", "owner", "sweep_id"])
    op.create_index("ix_jobs_sweep_state", "jobs", ["sweep_id", "state"])


def downgrade() -> None:
    op.drop_index("ix_jobs_sweep_state", table_name="jobs")
    op.drop_index("ix_jobs_state_owner_sweep", table_name="jobs")
