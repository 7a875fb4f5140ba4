"""retention: what the janitor removed (counters for /metrics) and its latest pass

Revision ID: 0005r
Revises: 0006p
Create Date: 2026-12-02 10:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005r"
down_revision = "0006p"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "retention_totals",
        sa.Column("what", sa.String(length=16), nullable=False),
        sa.Column("jobs", sa.Integer(), nullable=False),
        sa.Column("bytes", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("what"),
    )
    op.create_table(
        "retention_pass",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("folder_bytes", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )


def downgrade() -> None:
    op.drop_table("retention_pass")
    op.drop_table("retention_totals")
