"""Elastic jobs (issue 25 item 4): ``jobs.gpus_max``, the most GPUs a job submitted with a
range (``--gpus 2-4``) may be given (NULL: a fixed size, ``gpus``), and ``jobs.resize_to``,
the size its next attempt takes while the worker grows or shrinks it (NULL otherwise).

Revision ID: 0024e
Revises: 0023p
Create Date: 2026-12-02 21:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0024e"
down_revision = "0023p"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("gpus_max", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("resize_to", sa.Integer(), nullable=True))


def downgrade() -> None:
    # Plain nullable columns: dropped in place, so jobs keeps its AUTOINCREMENT (0021j).
    op.execute("ALTER TABLE jobs DROP COLUMN resize_to")
    op.execute("ALTER TABLE jobs DROP COLUMN gpus_max")
