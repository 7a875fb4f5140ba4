"""tokens that Unix accounts make for themselves through the socket (ids, owner, expiry),
and the account a job runs as when its submission proved one

Revision ID: 0017t
Revises: 0016i
Create Date: 2026-12-03 10:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017t"
down_revision = "0016i"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "tokens",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("owner", sa.String(length=64), nullable=False),
        sa.Column("owner_uid", sa.Integer(), nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("note", sa.String(length=64), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("expires_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("token_hash"),
    )
    with op.batch_alter_table("tokens", schema=None) as batch_op:
        batch_op.create_index("ix_tokens_owner", ["owner"], unique=False)
    # A nullable column without a default: SQLite adds it in place, no copy of the table.
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("run_as", sa.String(length=64), nullable=True))


def downgrade() -> None:
    # Jobs that ran as their submitter's proven account go back to the owner's mapping
    # (users.unix_user): under the older schema a job runs as that, or fails to launch.
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("run_as")
    with op.batch_alter_table("tokens", schema=None) as batch_op:
        batch_op.drop_index("ix_tokens_owner")
    op.drop_table("tokens")
