"""one notification per sweep: a sweep's URL and when its message was settled, and
notification attempts that belong to a sweep instead of a job

Revision ID: 0010n
Revises: 0017t
Create Date: 2026-12-02 12:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010n"
down_revision = "0017t"
branch_labels = None
depends_on = None

PENDING = sa.text("notify_url IS NOT NULL AND notify_done_at IS NULL")
ONE_OF = "(job_id IS NULL) <> (sweep_id IS NULL)"
# A member whose own message is still owed (before: every member carried the sweep's URL).
_MEMBER_OWED = (
    "jobs.sweep_id = sweeps.id AND jobs.notify_url IS NOT NULL AND jobs.notify_done_at IS NULL"
)


def upgrade() -> None:
    # Plain columns and a partial index: SQLite adds them in place.
    with op.batch_alter_table("sweeps", schema=None) as batch_op:
        batch_op.add_column(sa.Column("notify_url", sa.Text(), nullable=True))
        batch_op.add_column(sa.Column("notify_done_at", sa.Float(), nullable=True))
        batch_op.create_index(
            "ix_sweeps_notify_pending", ["id"], unique=False, sqlite_where=PENDING
        )
    # A job_id that may be null, a foreign key and a CHECK: batch mode copies the table
    # (it holds no other CHECK to keep; its job_id foreign key is copied along).
    with op.batch_alter_table("notifications", schema=None) as batch_op:
        batch_op.alter_column("job_id", existing_type=sa.Integer(), nullable=True)
        batch_op.add_column(sa.Column("sweep_id", sa.Integer(), nullable=True))
        batch_op.create_foreign_key(
            "fk_notifications_sweep_id_sweeps", "sweeps", ["sweep_id"], ["id"], ondelete="CASCADE"
        )
        batch_op.create_index("ix_notifications_sweep_id", ["sweep_id"], unique=False)
        batch_op.create_check_constraint("ck_notifications_job_or_sweep", sa.text(ONE_OF))
    # A sweep under way keeps its URL, now its own: the members still owing a message hand
    # it over and send nothing, and the sweep sends one when all of them have ended.
    op.execute(
        f"UPDATE sweeps SET notify_url = (SELECT max(jobs.notify_url) FROM jobs "
        f"WHERE {_MEMBER_OWED}) WHERE EXISTS (SELECT 1 FROM jobs WHERE {_MEMBER_OWED})"
    )
    op.execute(
        "UPDATE jobs SET notify_url = NULL "
        "WHERE sweep_id IS NOT NULL AND notify_url IS NOT NULL AND notify_done_at IS NULL"
    )


def downgrade() -> None:
    # Back to one message per member: a sweep whose message is still owed gives its URL
    # to its members that have none; a sweep's own attempts have no job to belong to.
    op.execute(
        "UPDATE jobs SET notify_url = (SELECT sweeps.notify_url FROM sweeps "
        "WHERE sweeps.id = jobs.sweep_id) WHERE jobs.notify_url IS NULL AND jobs.sweep_id IN "
        "(SELECT id FROM sweeps WHERE notify_url IS NOT NULL AND notify_done_at IS NULL)"
    )
    op.execute("DELETE FROM notifications WHERE sweep_id IS NOT NULL")
    with op.batch_alter_table("notifications", schema=None) as batch_op:
        batch_op.drop_constraint("ck_notifications_job_or_sweep", type_="check")
        batch_op.drop_index("ix_notifications_sweep_id")
        batch_op.drop_constraint("fk_notifications_sweep_id_sweeps", type_="foreignkey")
        batch_op.drop_column("sweep_id")
        batch_op.alter_column("job_id", existing_type=sa.Integer(), nullable=False)
    with op.batch_alter_table("sweeps", schema=None) as batch_op:
        batch_op.drop_index("ix_sweeps_notify_pending", sqlite_where=PENDING)
        batch_op.drop_column("notify_done_at")
        batch_op.drop_column("notify_url")
