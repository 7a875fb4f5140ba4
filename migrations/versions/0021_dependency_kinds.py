"""Slurm's dependency kinds (issue 26): afterany and afternotok beside afterok, singleton

``job_dependencies.kind`` and ``sweep_dependencies.kind`` (afterok, afterany or afternotok;
every existing row is afterok, which ``--after`` always meant), ``jobs.singleton`` (false
for existing jobs) and the index a singleton's wait is found by (owner, name, state).

Revision ID: 0023d
Revises: 0023w
Create Date: 2026-12-02 15:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0023d"
down_revision = "0023w"
branch_labels = None
depends_on = None

_KIND = "afterok"


def upgrade() -> None:
    for table in ("job_dependencies", "sweep_dependencies"):
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("kind", sa.String(16), nullable=False, server_default=_KIND))
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("singleton", sa.Boolean(), nullable=False, server_default="0"))
    op.create_index("ix_jobs_owner_name_state", "jobs", ["owner", "name", "state"])


# Waiting jobs the older schema could not keep as they are: one waiting with afterany or
# afternotok would read as afterok (and be cancelled when its job fails), and a held
# singleton has nothing the older daemon would ever release it for.
_UNKEPT = """
SELECT count(*) FROM jobs WHERE state IN ('queued', 'held') AND (singleton = 1
    OR id IN (SELECT job_id FROM job_dependencies WHERE kind != 'afterok')
    OR id IN (SELECT job_id FROM sweep_dependencies WHERE kind != 'afterok'))
"""


def downgrade() -> None:
    unkept = op.get_bind().execute(sa.text(_UNKEPT)).scalar_one()
    if unkept:
        raise RuntimeError(
            f"cannot downgrade: {unkept} waiting job(s) use --dependency afterany, "
            "afternotok or singleton, which the older version would change; cancel or "
            "release them first"
        )
    # Plain columns without an index or constraint on them: SQLite (3.35+) drops them in
    # place, so no table is copied (jobs keeps its AUTOINCREMENT, 0021j).
    op.drop_index("ix_jobs_owner_name_state", table_name="jobs")
    op.execute("ALTER TABLE jobs DROP COLUMN singleton")
    op.execute("ALTER TABLE sweep_dependencies DROP COLUMN kind")
    op.execute("ALTER TABLE job_dependencies DROP COLUMN kind")
