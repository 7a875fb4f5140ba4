"""jobs on a cluster: nodes, GPUs per node, the job's own Slurm partition and options

Revision ID: 0009c
Revises: 0005s
Create Date: 2026-12-01 22:20:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009c"
down_revision = "0005s"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Plain columns: SQLite adds them in place (no table copy), and every job so far ran
    # on one host, as nodes = 1 says.
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("nodes", sa.Integer(), nullable=False, server_default="1"))
        batch_op.add_column(sa.Column("gpus_per_node", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("partition", sa.String(length=128), nullable=True))
        batch_op.add_column(sa.Column("slurm_options", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("slurm_options")
        batch_op.drop_column("partition")
        batch_op.drop_column("gpus_per_node")
        batch_op.drop_column("nodes")
