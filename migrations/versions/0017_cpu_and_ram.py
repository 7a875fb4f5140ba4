"""CPU cores and host memory: what a job asks for (jobs.cpus, jobs.ram_bytes), what each
attempt held and used (attempts.cores, attempts.ram_bytes, attempts.peak_ram_bytes), and
core slots as leases (kind 'cpu')

The wider lease kind makes batch mode copy the leases table, which drops its triggers:
they are made again here as migration 0012m made them (the same guards, unchanged).

Revision ID: 0022c
Revises: 0022q
Create Date: 2026-12-02 12:45:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0022c"
down_revision = "0022q"
branch_labels = None
depends_on = None

_CHECK = (
    "AND (kind = 'gpu_share') = (mem_bytes IS NOT NULL) "
    "AND (mem_bytes IS NULL OR mem_bytes > 0) "
    "AND (share_cap IS NULL OR (kind = 'gpu_share' AND share_cap >= 1))"
)
NEW_CHECK = "kind IN ('gpu', 'port', 'gpu_share', 'cpu') " + _CHECK
OLD_CHECK = "kind IN ('gpu', 'port', 'gpu_share') " + _CHECK
_LIVE_SHARES = (
    "FROM leases WHERE kind = 'gpu_share' AND resource = NEW.resource AND released_at IS NULL"
)
# Migration 0012m's, as they are: a batch copy of the table drops them.
TRIGGERS = {
    "tr_leases_whole_gpu_alone": f"""
        CREATE TRIGGER tr_leases_whole_gpu_alone BEFORE INSERT ON leases
        WHEN NEW.kind = 'gpu' AND NEW.released_at IS NULL
             AND EXISTS (SELECT 1 {_LIVE_SHARES})
        BEGIN SELECT RAISE(ABORT, 'ddpq: a whole-GPU lease on a GPU that jobs share'); END
    """,
    "tr_leases_share_not_on_whole": """
        CREATE TRIGGER tr_leases_share_not_on_whole BEFORE INSERT ON leases
        WHEN NEW.kind = 'gpu_share' AND NEW.released_at IS NULL
             AND EXISTS (SELECT 1 FROM leases WHERE kind = 'gpu' AND resource = NEW.resource
                         AND released_at IS NULL)
        BEGIN SELECT RAISE(ABORT, 'ddpq: a share of a GPU that a job holds whole'); END
    """,
    "tr_leases_share_fits": f"""
        CREATE TRIGGER tr_leases_share_fits BEFORE INSERT ON leases
        WHEN NEW.kind = 'gpu_share' AND NEW.released_at IS NULL AND (
             NEW.mem_bytes + (SELECT coalesce(sum(mem_bytes), 0) {_LIVE_SHARES})
               > (SELECT memory_total_mb * 1048576 FROM devices WHERE "index" = NEW.resource)
             OR (SELECT count(*) {_LIVE_SHARES}) + 1
               > min(coalesce(NEW.share_cap, 1048576),
                     coalesce((SELECT min(share_cap) {_LIVE_SHARES}), 1048576)))
        BEGIN SELECT RAISE(ABORT, 'ddpq: a share past the GPU''s memory or a share cap'); END
    """,
    "tr_leases_only_released": """
        CREATE TRIGGER tr_leases_only_released BEFORE UPDATE ON leases
        WHEN NOT (OLD.released_at IS NULL AND NEW.released_at IS NOT NULL
                  AND NEW.job_id = OLD.job_id AND NEW.kind = OLD.kind
                  AND NEW.resource = OLD.resource AND NEW.acquired_at = OLD.acquired_at
                  AND NEW.mem_bytes IS OLD.mem_bytes AND NEW.share_cap IS OLD.share_cap)
        BEGIN SELECT RAISE(ABORT, 'ddpq: a lease never changes but to be released'); END
    """,
}


def _leases_check(check: str) -> None:
    for name in TRIGGERS:
        op.execute(f"DROP TRIGGER IF EXISTS {name}")
    with op.batch_alter_table("leases", schema=None, recreate="always") as batch_op:
        batch_op.drop_constraint("ck_leases_kind", type_="check")
        batch_op.create_check_constraint("ck_leases_kind", check)
    for ddl in TRIGGERS.values():
        op.execute(ddl)


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("cpus", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("ram_bytes", sa.Integer(), nullable=True))
    with op.batch_alter_table("attempts", schema=None) as batch_op:
        batch_op.add_column(sa.Column("cores", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("ram_bytes", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("peak_ram_bytes", sa.Integer(), nullable=True))
    _leases_check(NEW_CHECK)


def downgrade() -> None:
    # The older schema has no core leases: a live one would be lost with its guard.
    live = op.get_bind().scalar(
        sa.text("SELECT count(*) FROM leases WHERE kind = 'cpu' AND released_at IS NULL")
    )
    if live:
        raise RuntimeError(
            f"{live} CPU core leases are live: stop the jobs that hold cores before going "
            "back to a release that cannot count them"
        )
    op.execute("DELETE FROM leases WHERE kind = 'cpu'")
    _leases_check(OLD_CHECK)
    # Plain nullable columns: dropped in place (SQLite 3.35+), so that the jobs table is not
    # copied, which would lose its AUTOINCREMENT (0021j).
    for table, column in (
        ("attempts", "peak_ram_bytes"),
        ("attempts", "ram_bytes"),
        ("attempts", "cores"),
        ("jobs", "ram_bytes"),
        ("jobs", "cpus"),
    ):
        op.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
