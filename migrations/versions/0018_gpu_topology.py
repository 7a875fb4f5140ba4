"""GPU topology (issue 24): jobs ask for a link class and a GPU type; devices say where
they sit

``jobs.gpu_link`` (NV, PIX, PXB, PHB, NODE or SYS: the worst link its GPUs may have among
them) and ``jobs.gpu_type`` (a model name or MIG profile its GPUs' names must contain);
``devices.hardware``: each GPU's NUMA node, CPUs, links and MIG profile/parent, as JSON.
All nullable: existing jobs ask for neither, existing rows are rewritten by the worker.

Revision ID: 0022t
Revises: 0022c
Create Date: 2026-12-02 12:50:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0022t"
down_revision = "0022c"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("gpu_link", sa.String(8), nullable=True))
        batch.add_column(sa.Column("gpu_type", sa.String(64), nullable=True))
    with op.batch_alter_table("devices") as batch:
        batch.add_column(sa.Column("hardware", sa.JSON(), nullable=True))


def downgrade() -> None:
    # Plain nullable columns, no index or constraint on them: SQLite (3.35+) drops them in
    # place, so neither table is copied (devices has a trigger that a copy would break;
    # jobs keeps its AUTOINCREMENT, 0021j).
    op.execute("ALTER TABLE devices DROP COLUMN hardware")
    op.execute("ALTER TABLE jobs DROP COLUMN gpu_type")
    op.execute("ALTER TABLE jobs DROP COLUMN gpu_link")
