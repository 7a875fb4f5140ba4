"""The tables beside ``jobs``: sweeps, dependencies, events, attempts, leases, users..."""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    CheckConstraint,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    text,
)
from sqlalchemy.orm import Mapped, mapped_column

from ddpq.core.states import JobState
from ddpq.store.models.base import Base, state_type

# What a lease may be: a whole GPU, a port or a CPU core slot (a resource each,
# core.hostres), or a share of a GPU's memory (its bytes, and optionally how many jobs it
# lets share the GPU).
LEASE_CHECK = (
    "kind IN ('gpu', 'port', 'gpu_share', 'cpu') "
    "AND (kind = 'gpu_share') = (mem_bytes IS NOT NULL) "
    "AND (mem_bytes IS NULL OR mem_bytes > 0) "
    "AND (share_cap IS NULL OR (kind = 'gpu_share' AND share_cap >= 1))"
)


class Sweep(Base):
    """Jobs queued together: the product of parameters over a template, or an array.

    Its members are the jobs that point at it; their counts by state are read from them,
    never kept here (no second copy to drift).
    """

    __tablename__ = "sweeps"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(128))
    owner: Mapped[str] = mapped_column(String(64), index=True)
    submitted_at: Mapped[float] = mapped_column(Float)
    # The submission as the client sent it (a JobSubmit body), and what was swept.
    template: Mapped[dict[str, Any]] = mapped_column(JSON)
    params: Mapped[dict[str, list[str]]] = mapped_column(JSON)
    array: Mapped[str | None] = mapped_column(Text, nullable=True)
    size: Mapped[int] = mapped_column(Integer)
    # At most this many members hold leases at once (Slurm's %K); None: no cap.
    max_running: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # Where to POST one message once every member has ended (the members send none), and
    # when that was settled; as a job's notify_url (a secret maybe: never shown).
    notify_url: Mapped[str | None] = mapped_column(Text, nullable=True)
    notify_done_at: Mapped[float | None] = mapped_column(Float, nullable=True)

    __table_args__ = (
        # The notifier's question about sweeps, every second: which still owe a message.
        Index(
            "ix_sweeps_notify_pending",
            "id",
            sqlite_where=text("notify_url IS NOT NULL AND notify_done_at IS NULL"),
        ),
    )


class JobDependency(Base):
    __tablename__ = "job_dependencies"

    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    depends_on: Mapped[int] = mapped_column(
        ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True, index=True
    )
    # afterok (``--after``), afterany or afternotok (``core.deps.Kind``, migration 0023d).
    kind: Mapped[str] = mapped_column(String(16), default="afterok", server_default="afterok")


class SweepDependency(Base):
    """A job that waits for every member of a sweep to succeed (``after_sweeps``)."""

    __tablename__ = "sweep_dependencies"

    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    sweep_id: Mapped[int] = mapped_column(
        ForeignKey("sweeps.id", ondelete="CASCADE"), primary_key=True, index=True
    )
    kind: Mapped[str] = mapped_column(String(16), default="afterok", server_default="afterok")


class JobEvent(Base):
    """Every state change, with its time and reason."""

    __tablename__ = "job_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    at: Mapped[float] = mapped_column(Float)
    from_state: Mapped[JobState | None] = mapped_column(
        state_type("ck_job_events_from_state"), nullable=True
    )
    to_state: Mapped[JobState] = mapped_column(state_type("ck_job_events_to_state"))
    reason: Mapped[str] = mapped_column(Text, default="")


class Attempt(Base):
    """One launch of a job: its leases, how it ended."""

    __tablename__ = "attempts"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    number: Mapped[int] = mapped_column(Integer)
    gpus: Mapped[list[int]] = mapped_column(JSON)
    port: Mapped[int | None] = mapped_column(Integer, nullable=True)
    started_at: Mapped[float] = mapped_column(Float)
    ended_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    exit_signal: Mapped[int | None] = mapped_column(Integer, nullable=True)
    state: Mapped[JobState | None] = mapped_column(state_type("ck_attempts_state"), nullable=True)
    reason: Mapped[str] = mapped_column(Text, default="")
    # Which executor ran the attempt, and its handle for it (the local one: the shim's
    # "pid:start ticks"; Slurm: the job id): what finds the attempt again after a restart.
    # None until the launch has got that far; kept once the attempt has ended, for history.
    executor: Mapped[str | None] = mapped_column(String(16), nullable=True)
    handle: Mapped[str | None] = mapped_column(Text, nullable=True)
    # Sharing: what it reserved on each GPU (None: its GPUs were whole). Measured: the
    # most its processes held on any one of its GPUs at once, sampled through NVML while it
    # ran (None: never sampled, e.g. --fake-gpus). Bytes.
    gpu_mem_bytes: Mapped[int | None] = mapped_column(Integer, nullable=True)
    peak_mem_bytes: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # The host's CPUs it ran confined to (its cpuset; None: not confined) and the host
    # memory it held and was limited to (None: none). Bytes.
    cores: Mapped[list[int] | None] = mapped_column(JSON, nullable=True)
    ram_bytes: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # The most host memory its cgroup held (memory.peak; None: not read, store.host).
    peak_ram_bytes: Mapped[int | None] = mapped_column(Integer, nullable=True)


class Notification(Base):
    """One attempt to deliver a job's end, or a whole sweep's, to its URL: of exactly one."""

    __tablename__ = "notifications"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[int | None] = mapped_column(
        ForeignKey("jobs.id", ondelete="CASCADE"), index=True, nullable=True
    )
    sweep_id: Mapped[int | None] = mapped_column(
        ForeignKey("sweeps.id", ondelete="CASCADE"), index=True, nullable=True
    )
    attempt: Mapped[int] = mapped_column(Integer)
    at: Mapped[float] = mapped_column(Float)
    status: Mapped[int | None] = mapped_column(Integer, nullable=True)  # the HTTP answer
    error: Mapped[str] = mapped_column(Text, default="")  # why there was none, in words

    __table_args__ = (
        CheckConstraint(
            "(job_id IS NULL) <> (sweep_id IS NULL)", name="ck_notifications_job_or_sweep"
        ),
    )


class Lease(Base):
    """A GPU (whole, or a share of its memory), a port or a CPU core slot held by a job.

    The database itself guarantees, whatever the Python above it does: no two live jobs
    hold the same whole GPU or port (the partial unique index), and a GPU held whole holds
    no share (triggers of migration 0012m: ``tr_leases_*``, which also refuse shares past
    the GPU's memory or a ``share_cap``, and any change to a lease but its release). A
    batch migration that copies this table drops triggers: it must create them again.
    """

    __tablename__ = "leases"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    kind: Mapped[str] = mapped_column(String(16))  # gpu | port | gpu_share | cpu
    resource: Mapped[int] = mapped_column(Integer)
    acquired_at: Mapped[float] = mapped_column(Float)
    released_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    # gpu_share only: the bytes reserved on the GPU, and the most jobs it lets share it.
    mem_bytes: Mapped[int | None] = mapped_column(Integer, nullable=True)
    share_cap: Mapped[int | None] = mapped_column(Integer, nullable=True)

    __table_args__ = (
        Index(
            "uq_leases_live_resource",
            "kind",
            "resource",
            unique=True,
            sqlite_where=text("released_at IS NULL AND kind != 'gpu_share'"),
        ),
        Index(
            "uq_leases_live_share",
            "job_id",
            "resource",
            unique=True,
            sqlite_where=text("released_at IS NULL AND kind = 'gpu_share'"),
        ),
        Index(
            "ix_leases_live_share_gpu",
            "resource",
            sqlite_where=text("released_at IS NULL AND kind = 'gpu_share'"),
        ),
        CheckConstraint(LEASE_CHECK, name="ck_leases_kind"),
    )


class UserLimit(Base):
    """An admin's limit on one user's jobs (``core.limits``); the user ``*`` is everyone's
    default. None: no limit of this row's own."""

    __tablename__ = "user_limits"

    user: Mapped[str] = mapped_column(String(64), primary_key=True)
    max_gpus: Mapped[int | None] = mapped_column(Integer, nullable=True)
    max_jobs: Mapped[int | None] = mapped_column(Integer, nullable=True)
    updated_at: Mapped[float] = mapped_column(Float)

    __table_args__ = (
        CheckConstraint(
            "(max_gpus IS NULL OR max_gpus >= 0) AND (max_jobs IS NULL OR max_jobs >= 0)",
            name="ck_user_limits_counts",
        ),
    )


class GpuReservation(Base):
    """``gpus`` GPUs kept for ``user``'s jobs from ``start_at`` to ``end_at`` (core.limits)."""

    __tablename__ = "reservations"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    user: Mapped[str] = mapped_column(String(64))
    gpus: Mapped[int] = mapped_column(Integer)
    start_at: Mapped[float] = mapped_column(Float)
    end_at: Mapped[float] = mapped_column(Float, index=True)
    created_at: Mapped[float] = mapped_column(Float)
    created_by: Mapped[str] = mapped_column(String(64))

    __table_args__ = (
        CheckConstraint("gpus >= 1 AND end_at > start_at", name="ck_reservations_window"),
    )


class User(Base):
    __tablename__ = "users"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    is_admin: Mapped[bool] = mapped_column(Boolean, default=False)
    unix_user: Mapped[str | None] = mapped_column(String(64), nullable=True)
    created_at: Mapped[float] = mapped_column(Float)


class Token(Base):
    """A token a Unix account made for itself through the socket (`ddpq token create`), to
    be that account over TCP until it expires or is revoked. Stored as a SHA-256 hash."""

    __tablename__ = "tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    # The account's name and uid when it made the token: the token stops working if the
    # name comes to mean another uid (the account removed, another made under its name).
    owner: Mapped[str] = mapped_column(String(64), index=True)
    owner_uid: Mapped[int] = mapped_column(Integer)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    note: Mapped[str | None] = mapped_column(String(64), nullable=True)
    created_at: Mapped[float] = mapped_column(Float)
    expires_at: Mapped[float] = mapped_column(Float)


class DeviceSnapshot(Base):
    """The worker's latest view of one GPU, so the API can show it without NVML."""

    __tablename__ = "devices"

    index: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    uuid: Mapped[str] = mapped_column(String(96))
    name: Mapped[str] = mapped_column(String(128))
    fake: Mapped[bool] = mapped_column(Boolean)
    memory_total_mb: Mapped[int] = mapped_column(Integer)
    memory_used_mb: Mapped[int] = mapped_column(Integer)
    external: Mapped[bool] = mapped_column(Boolean)
    # [{"pid": int, "used_memory_mb": int | None}] of processes ddpq did not start
    external_processes: Mapped[list[dict[str, Any]]] = mapped_column(JSON)
    updated_at: Mapped[float] = mapped_column(Float)
    # Where it sits (migration 0022t): {"numa", "cpus", "links": [[index, word]],
    # "mig_profile", "parent"}; NULL for rows written before.
    hardware: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)


class OutsideUse(Base):
    """One interval of GPU use by processes in no ddpq job: one account (by uid) on one GPU,
    from its first sighting to its last (``core.usage``: sightings a minute apart or less
    extend it). Each account on a GPU is charged the whole GPU for it."""

    __tablename__ = "outside_use"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    # The process's real uid, and its account's name when it had one; both None: unknown.
    uid: Mapped[int | None] = mapped_column(Integer, nullable=True)
    account: Mapped[str | None] = mapped_column(String(64), nullable=True)
    gpu: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[float] = mapped_column(Float)
    ended_at: Mapped[float] = mapped_column(Float)

    __table_args__ = (
        # The sampler's question: this account's latest interval on this GPU.
        Index("ix_outside_use_gpu_uid_ended", "gpu", "uid", "ended_at"),
        # Reports and fair share: the intervals that reach into a window.
        Index("ix_outside_use_ended_at", "ended_at"),
    )


class RetentionTotal(Base):
    """What retention removed since the database was made, one row per kind (checkpoints,
    logs, rows): kept here, not in a process, so that `ddpq server` and `ddpq worker`
    apart, or a restarted daemon, report the same counters."""

    __tablename__ = "retention_totals"

    what: Mapped[str] = mapped_column(String(16), primary_key=True)
    jobs: Mapped[int] = mapped_column(Integer, default=0)
    bytes: Mapped[int] = mapped_column(Integer, default=0)


class RetentionPass(Base):
    """The janitor's latest pass: when, and what all job folders held after it (one row)."""

    __tablename__ = "retention_pass"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    at: Mapped[float] = mapped_column(Float)
    folder_bytes: Mapped[int] = mapped_column(Integer)
