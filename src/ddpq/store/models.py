"""Tables. Times are UNIX epoch seconds (REAL): plain numbers the pure core can use."""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    CheckConstraint,
    Enum,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from ddpq.core.states import JobState


class Base(DeclarativeBase):
    pass


def state_type(constraint: str) -> Enum:
    """A job state column: ``JobState`` in Python, its value as text in SQLite, and a CHECK
    constraint named ``constraint`` so that no other word can be stored, whatever the SQL."""
    return Enum(
        JobState,
        name=constraint,
        native_enum=False,
        create_constraint=True,
        length=16,
        validate_strings=True,
        values_callable=lambda states: [s.value for s in states],
    )


class Job(Base):
    __tablename__ = "jobs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(128))
    owner: Mapped[str] = mapped_column(String(64), index=True)
    command: Mapped[list[str]] = mapped_column(JSON)
    cwd: Mapped[str] = mapped_column(Text)
    env: Mapped[dict[str, str]] = mapped_column(JSON, default=dict)
    launcher: Mapped[str] = mapped_column(String(16), default="plain")  # plain | torchrun
    gpus: Mapped[int] = mapped_column(Integer)
    priority: Mapped[int] = mapped_column(Integer, default=0)
    time_limit_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    max_retries: Mapped[int] = mapped_column(Integer, default=0)
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    port_retries: Mapped[int] = mapped_column(Integer, default=0)
    # Preemptible: it may be asked to checkpoint (with this signal) and go back to the queue.
    preemptible: Mapped[bool] = mapped_column(Boolean, default=False, server_default="0")
    preempt_signal: Mapped[str] = mapped_column(String(8), default="USR1", server_default="USR1")
    preemptions: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # Where jobs run on Slurm (docs/slurm.md): hosts, GPUs on each (None: all on one), the
    # job's own partition and extra #SBATCH options. The local executor runs nodes=1 only.
    nodes: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    gpus_per_node: Mapped[int | None] = mapped_column(Integer, nullable=True)
    partition: Mapped[str | None] = mapped_column(String(128), nullable=True)
    slurm_options: Mapped[list[str] | None] = mapped_column(JSON, nullable=True)
    # Who or what asked for the stop in stop_request ("preempted by alice").
    stop_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    # Launches cut short before the job ran, requeued for free (core.disposition bounds them).
    relaunches: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    user_hold: Mapped[bool] = mapped_column(Boolean, default=False)

    state: Mapped[JobState] = mapped_column(state_type("ck_jobs_state"), index=True)
    reason: Mapped[str] = mapped_column(Text, default="")
    submitted_at: Mapped[float] = mapped_column(Float)
    started_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    ended_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    not_before: Mapped[float | None] = mapped_column(Float, nullable=True)
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    exit_signal: Mapped[int | None] = mapped_column(Integer, nullable=True)

    stop_request: Mapped[str | None] = mapped_column(String(16), nullable=True)
    stop_sent_at: Mapped[float | None] = mapped_column(Float, nullable=True)

    job_dir: Mapped[str | None] = mapped_column(Text, nullable=True)
    progress: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    sched_latency_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    # Where to POST a message when the job ends (may hold a webhook's secret: never shown),
    # and when that was settled: delivered, or given up. Pending: a URL and no time.
    notify_url: Mapped[str | None] = mapped_column(Text, nullable=True)
    notify_done_at: Mapped[float | None] = mapped_column(Float, nullable=True)

    # A member of a sweep: which, its index there (the array index, or its place in the
    # product of the parameters) and its parameters' values. None for a plain job.
    sweep_id: Mapped[int | None] = mapped_column(
        ForeignKey("sweeps.id", ondelete="CASCADE"), nullable=True
    )
    sweep_index: Mapped[int | None] = mapped_column(Integer, nullable=True)
    sweep_params: Mapped[dict[str, str] | None] = mapped_column(JSON, nullable=True)

    __table_args__ = (
        Index("ix_jobs_state_priority", "state", "priority"),
        # The notifier's question, every second: which ended jobs still owe a message.
        Index(
            "ix_jobs_notify_pending",
            "id",
            sqlite_where=text("notify_url IS NOT NULL AND notify_done_at IS NULL"),
        ),
        Index("ix_jobs_sweep", "sweep_id", "sweep_index"),
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


class SweepDependency(Base):
    """A job that waits for every member of a sweep to succeed (``after_sweeps``)."""

    __tablename__ = "sweep_dependencies"

    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    sweep_id: Mapped[int] = mapped_column(
        ForeignKey("sweeps.id", ondelete="CASCADE"), primary_key=True, index=True
    )


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
    """A GPU or port held by a job.

    The partial unique index is the guarantee that no two live jobs hold the
    same GPU or port, whatever the Python above it does.
    """

    __tablename__ = "leases"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    kind: Mapped[str] = mapped_column(String(8))  # gpu | port
    resource: Mapped[int] = mapped_column(Integer)
    acquired_at: Mapped[float] = mapped_column(Float)
    released_at: Mapped[float | None] = mapped_column(Float, nullable=True)

    __table_args__ = (
        Index(
            "uq_leases_live_resource",
            "kind",
            "resource",
            unique=True,
            sqlite_where=text("released_at IS NULL"),
        ),
    )


class User(Base):
    __tablename__ = "users"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    is_admin: Mapped[bool] = mapped_column(Boolean, default=False)
    unix_user: Mapped[str | None] = mapped_column(String(64), nullable=True)
    created_at: Mapped[float] = mapped_column(Float)


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
