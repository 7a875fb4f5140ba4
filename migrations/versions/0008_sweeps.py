"""sweeps and arrays: the sweeps table, each member's sweep, index and parameters, and
jobs that wait for a whole sweep

Revision ID: 0005s
Revises: 0005r
Create Date: 2026-12-02 10:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005s"
down_revision = "0005r"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "sweeps",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("owner", sa.String(length=64), nullable=False),
        sa.Column("submitted_at", sa.Float(), nullable=False),
        sa.Column("template", sa.JSON(), nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("array", sa.Text(), nullable=True),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("max_running", sa.Integer(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("sweeps", schema=None) as batch_op:
        batch_op.create_index("ix_sweeps_owner", ["owner"], unique=False)
    op.create_table(
        "sweep_dependencies",
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("sweep_id", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["sweep_id"], ["sweeps.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("job_id", "sweep_id"),
    )
    with op.batch_alter_table("sweep_dependencies", schema=None) as batch_op:
        batch_op.create_index("ix_sweep_dependencies_sweep_id", ["sweep_id"], unique=False)
    # The foreign key makes batch mode copy the jobs table (SQLite cannot add one in
    # place); the copy keeps the state CHECK constraint, which the tests check.
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("sweep_id", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("sweep_index", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("sweep_params", sa.JSON(), nullable=True))
        batch_op.create_foreign_key(
            "fk_jobs_sweep_id_sweeps", "sweeps", ["sweep_id"], ["id"], ondelete="CASCADE"
        )
        batch_op.create_index("ix_jobs_sweep", ["sweep_id", "sweep_index"], unique=False)


def downgrade() -> None:
    # Members become plain jobs: their rows, states and histories stay.
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index("ix_jobs_sweep")
        batch_op.drop_constraint("fk_jobs_sweep_id_sweeps", type_="foreignkey")
        batch_op.drop_column("sweep_params")
        batch_op.drop_column("sweep_index")
        batch_op.drop_column("sweep_id")
    with op.batch_alter_table("sweep_dependencies", schema=None) as batch_op:
        batch_op.drop_index("ix_sweep_dependencies_sweep_id")
    op.drop_table("sweep_dependencies")
    with op.batch_alter_table("sweeps", schema=None) as batch_op:
        batch_op.drop_index("ix_sweeps_owner")
    op.drop_table("sweeps")
