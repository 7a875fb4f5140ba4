"""job states as a typed column: a CHECK constraint admits only ddpq's state names

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01 19:40:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

# The names as they were when this revision was written: a migration must not change
# meaning when the code's enum grows later (that would be a migration of its own).
STATES = ("queued", "held", "starting", "running", "succeeded", "failed", "cancelled", "timed_out")

# (table, column, nullable, constraint name)
COLUMNS = (
    ("jobs", "state", False, "ck_jobs_state"),
    ("job_events", "from_state", True, "ck_job_events_from_state"),
    ("job_events", "to_state", False, "ck_job_events_to_state"),
    ("attempts", "state", True, "ck_attempts_state"),
)


def _typed(constraint: str) -> sa.Enum:
    return sa.Enum(*STATES, name=constraint, native_enum=False, create_constraint=True, length=16)


def upgrade() -> None:
    # SQLite cannot add a CHECK constraint in place: batch mode copies each table.
    for table in ("jobs", "job_events", "attempts"):
        with op.batch_alter_table(table, schema=None) as batch_op:
            for name, column, nullable, constraint in COLUMNS:
                if name == table:
                    batch_op.alter_column(
                        column,
                        existing_type=sa.String(length=16),
                        type_=_typed(constraint),
                        existing_nullable=nullable,
                    )


def downgrade() -> None:
    for table in ("jobs", "job_events", "attempts"):
        with op.batch_alter_table(table, schema=None) as batch_op:
            for name, column, nullable, constraint in COLUMNS:
                if name == table:
                    batch_op.alter_column(
                        column,
                        existing_type=_typed(constraint),
                        type_=sa.String(length=16),
                        existing_nullable=nullable,
                    )
