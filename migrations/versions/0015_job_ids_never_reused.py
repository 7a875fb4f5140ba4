"""job ids are never handed out twice: the jobs table gets AUTOINCREMENT

Without it SQLite gives a new row the highest id there is plus one, so the id of a
newest job whose row was deleted comes back. With it, ids only grow (``sqlite_sequence``
remembers the highest ever given), and the daemon raises that high-water mark at start
above every job folder it finds (a restored database's ids would otherwise restart
below folders of jobs submitted after the backup).

Revision ID: 0021j
Revises: 0010n
Create Date: 2026-12-02 05:30:00
"""

from __future__ import annotations

from alembic import op

revision = "0021j"
down_revision = "0010n"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # SQLite cannot add AUTOINCREMENT in place: batch mode copies the table (its CHECK,
    # indexes and foreign keys along); copying the rows sets sqlite_sequence to the
    # highest id.
    with op.batch_alter_table(
        "jobs", recreate="always", table_kwargs={"sqlite_autoincrement": True}
    ):
        pass


def downgrade() -> None:
    with op.batch_alter_table("jobs", recreate="always"):
        pass
