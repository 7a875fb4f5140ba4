"""preemption: preemptible jobs, their signal, how often they were preempted and by whom;
"preempted" among the states an attempt may end in

Revision ID: 0006p
Revises: 0005n
Create Date: 2026-12-01 21:20:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006p"
down_revision = "0005n"
branch_labels = None
depends_on = None

BEFORE = ("queued", "held", "starting", "running", "succeeded", "failed", "cancelled", "timed_out")
AFTER = (*BEFORE, "preempted")
COLUMNS = (  # (table, column, nullable, constraint), as in 0002
    ("jobs", "state", False, "ck_jobs_state"),
    ("job_events", "from_state", True, "ck_job_events_from_state"),
    ("job_events", "to_state", False, "ck_job_events_to_state"),
    ("attempts", "state", True, "ck_attempts_state"),
)


def _typed(states: tuple[str, ...], constraint: str) -> sa.Enum:
    return sa.Enum(*states, name=constraint, native_enum=False, create_constraint=True, length=16)


def _states(old: tuple[str, ...], new: tuple[str, ...]) -> None:
    for table in ("jobs", "job_events", "attempts"):
        with op.batch_alter_table(table, schema=None) as batch_op:
            for name, column, nullable, constraint in COLUMNS:
                if name == table:
                    batch_op.alter_column(
                        column,
                        existing_type=_typed(old, constraint),
                        type_=_typed(new, constraint),
                        existing_nullable=nullable,
                    )


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("preemptible", sa.Boolean(), nullable=False, server_default="0")
        )
        batch_op.add_column(
            sa.Column("preempt_signal", sa.String(length=8), nullable=False, server_default="USR1")
        )
        batch_op.add_column(
            sa.Column("preemptions", sa.Integer(), nullable=False, server_default="0")
        )
        batch_op.add_column(sa.Column("stop_reason", sa.Text(), nullable=True))
    _states(BEFORE, AFTER)


def downgrade() -> None:
    # Attempts that ended preempted did not fail and were not cancelled: the nearest word
    # the older schema has for "stopped by ddpq, job requeued" is the requeued state.
    op.execute("UPDATE attempts SET state = 'queued' WHERE state = 'preempted'")
    _states(AFTER, BEFORE)
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("stop_reason")
        batch_op.drop_column("preemptions")
        batch_op.drop_column("preempt_signal")
        batch_op.drop_column("preemptible")
