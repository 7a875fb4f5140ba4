"""an executor's handle per attempt, instead of the shim's pid on the job

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01 20:10:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("attempts", schema=None) as batch_op:
        batch_op.add_column(sa.Column("executor", sa.String(length=16), nullable=True))
        batch_op.add_column(sa.Column("handle", sa.Text(), nullable=True))
    # Jobs running across the upgrade keep their shim: its identity moves to the attempt.
    op.execute(
        """
        UPDATE attempts SET executor = 'local',
            handle = (SELECT jobs.shim_pid || ':' || jobs.shim_start_ticks FROM jobs
                      WHERE jobs.id = attempts.job_id AND jobs.attempt = attempts.number
                        AND jobs.shim_pid IS NOT NULL AND jobs.shim_start_ticks IS NOT NULL)
        """
    )
    op.execute("UPDATE attempts SET executor = NULL WHERE handle IS NULL")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("shim_start_ticks")
        batch_op.drop_column("shim_pid")


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("shim_pid", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("shim_start_ticks", sa.Integer(), nullable=True))
    # Only the local executor's handles have a shim to give back.
    op.execute(
        """
        UPDATE jobs SET
            shim_pid = (SELECT CAST(substr(a.handle, 1, instr(a.handle, ':') - 1) AS INTEGER)
                        FROM attempts a WHERE a.job_id = jobs.id AND a.number = jobs.attempt
                          AND a.executor = 'local' AND a.handle IS NOT NULL),
            shim_start_ticks = (SELECT CAST(substr(a.handle, instr(a.handle, ':') + 1) AS INTEGER)
                        FROM attempts a WHERE a.job_id = jobs.id AND a.number = jobs.attempt
                          AND a.executor = 'local' AND a.handle IS NOT NULL)
        """
    )
    with op.batch_alter_table("attempts", schema=None) as batch_op:
        batch_op.drop_column("handle")
        batch_op.drop_column("executor")
