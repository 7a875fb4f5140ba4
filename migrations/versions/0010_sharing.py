"""sharing GPUs by memory, limits and reservations: what jobs reserve and were measured to
use, shared leases (and the triggers that keep them apart from whole ones), per-user limits,
GPU reservations

Revision ID: 0012m
Revises: 0009c
Create Date: 2026-12-02 12:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012m"
down_revision = "0009c"
branch_labels = None
depends_on = None

LEASE_CHECK = (
    "kind IN ('gpu', 'port', 'gpu_share') "
    "AND (kind = 'gpu_share') = (mem_bytes IS NOT NULL) "
    "AND (mem_bytes IS NULL OR mem_bytes > 0) "
    "AND (share_cap IS NULL OR (kind = 'gpu_share' AND share_cap >= 1))"
)
_LIVE_SHARES = (
    "FROM leases WHERE kind = 'gpu_share' AND resource = NEW.resource AND released_at IS NULL"
)
# The database's own guard, whatever the Python above it does: a GPU is held whole by one
# job, or shared by jobs whose reservations fit in its memory and within their share caps,
# never both; and a lease never changes but to be released.
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


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("gpu_mem_bytes", sa.Integer(), nullable=True))
        batch_op.add_column(
            sa.Column("gpu_mem_auto", sa.Boolean(), nullable=False, server_default="0")
        )
        batch_op.add_column(sa.Column("gpu_share", sa.Integer(), nullable=True))
        batch_op.add_column(
            sa.Column("oom_requeues", sa.Integer(), nullable=False, server_default="0")
        )
        batch_op.add_column(sa.Column("mem_key", sa.String(length=80), nullable=True))
        batch_op.create_index("ix_jobs_owner_mem_key", ["owner", "mem_key"], unique=False)
    with op.batch_alter_table("attempts", schema=None) as batch_op:
        batch_op.add_column(sa.Column("gpu_mem_bytes", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("peak_mem_bytes", sa.Integer(), nullable=True))
    # The CHECK and the wider kind make batch mode copy the table: the unique index is
    # made again, for whole GPUs and ports only.
    with op.batch_alter_table("leases", schema=None, recreate="always") as batch_op:
        batch_op.drop_index("uq_leases_live_resource")
        batch_op.alter_column("kind", existing_type=sa.String(length=8), type_=sa.String(length=16))
        batch_op.add_column(sa.Column("mem_bytes", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("share_cap", sa.Integer(), nullable=True))
        batch_op.create_check_constraint("ck_leases_kind", LEASE_CHECK)
        batch_op.create_index(
            "uq_leases_live_resource",
            ["kind", "resource"],
            unique=True,
            sqlite_where=sa.text("released_at IS NULL AND kind != 'gpu_share'"),
        )
        batch_op.create_index(
            "uq_leases_live_share",
            ["job_id", "resource"],
            unique=True,
            sqlite_where=sa.text("released_at IS NULL AND kind = 'gpu_share'"),
        )
        batch_op.create_index(
            "ix_leases_live_share_gpu",
            ["resource"],
            sqlite_where=sa.text("released_at IS NULL AND kind = 'gpu_share'"),
        )
    for ddl in TRIGGERS.values():
        op.execute(ddl)
    op.create_table(
        "user_limits",
        sa.Column("user", sa.String(length=64), nullable=False),
        sa.Column("max_gpus", sa.Integer(), nullable=True),
        sa.Column("max_jobs", sa.Integer(), nullable=True),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.CheckConstraint(
            "(max_gpus IS NULL OR max_gpus >= 0) AND (max_jobs IS NULL OR max_jobs >= 0)",
            name="ck_user_limits_counts",
        ),
        sa.PrimaryKeyConstraint("user"),
    )
    op.create_table(
        "reservations",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("user", sa.String(length=64), nullable=False),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("start_at", sa.Float(), nullable=False),
        sa.Column("end_at", sa.Float(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("created_by", sa.String(length=64), nullable=False),
        sa.CheckConstraint("gpus >= 1 AND end_at > start_at", name="ck_reservations_window"),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("reservations", schema=None) as batch_op:
        batch_op.create_index("ix_reservations_end_at", ["end_at"], unique=False)


def downgrade() -> None:
    conn = op.get_bind()
    live = conn.execute(
        sa.text("SELECT count(*) FROM leases WHERE kind = 'gpu_share' AND released_at IS NULL")
    ).scalar()
    if live:
        raise RuntimeError(
            f"{live} shared GPU leases are live: stop the jobs that share GPUs before going "
            "back to a release that cannot share them"
        )
    with op.batch_alter_table("reservations", schema=None) as batch_op:
        batch_op.drop_index("ix_reservations_end_at")
    op.drop_table("reservations")
    op.drop_table("user_limits")
    for name in TRIGGERS:
        op.execute(f"DROP TRIGGER IF EXISTS {name}")
    # Ended shares become the whole-GPU leases the older schema knows (history only).
    op.execute(
        "UPDATE leases SET kind = 'gpu', mem_bytes = NULL, share_cap = NULL "
        "WHERE kind = 'gpu_share'"
    )
    with op.batch_alter_table("leases", schema=None, recreate="always") as batch_op:
        batch_op.drop_index("ix_leases_live_share_gpu")
        batch_op.drop_index("uq_leases_live_share")
        batch_op.drop_index("uq_leases_live_resource")
        batch_op.drop_constraint("ck_leases_kind", type_="check")
        batch_op.drop_column("share_cap")
        batch_op.drop_column("mem_bytes")
        batch_op.alter_column("kind", existing_type=sa.String(length=16), type_=sa.String(length=8))
        batch_op.create_index(
            "uq_leases_live_resource",
            ["kind", "resource"],
            unique=True,
            sqlite_where=sa.text("released_at IS NULL"),
        )
    with op.batch_alter_table("attempts", schema=None) as batch_op:
        batch_op.drop_column("peak_mem_bytes")
        batch_op.drop_column("gpu_mem_bytes")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index("ix_jobs_owner_mem_key")
        batch_op.drop_column("mem_key")
        batch_op.drop_column("oom_requeues")
        batch_op.drop_column("gpu_share")
        batch_op.drop_column("gpu_mem_auto")
        batch_op.drop_column("gpu_mem_bytes")
