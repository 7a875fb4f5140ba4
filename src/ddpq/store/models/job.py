"""The jobs table, and the one mapping between its columns and ``core.spec.JobSpec``."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import fields
from typing import Any, get_origin, get_type_hints

from sqlalchemy import JSON, Boolean, Float, ForeignKey, Index, Integer, String, Text, text
from sqlalchemy.orm import Mapped, mapped_column

from ddpq.core.spec import JobSpec
from ddpq.core.states import JobState
from ddpq.store.models.base import Base, state_type

# The queued jobs' shapes in the order the planning window ranks them (``_SHAPE`` in
# ``store.jobs``, which must list the same columns in the same order), then submission.
PLAN_SHAPE_INDEX = (
    "state",
    "owner",
    "priority",
    "gpus",
    "launcher",
    "sweep_id",
    "gpu_mem_bytes",
    "gpu_share",
    "gpu_mem_auto",
    "mem_key",
    "gpu_link",
    "gpu_type",
    "cpus",
    "ram_bytes",
    "time_limit_s",
    "attempt",
    "submitted_at",
    "id",
)

# Literal, not bound: SQLite uses a partial index only for a WHERE that names its values.
UNPLANNED = "state = 'queued' AND reason = ''"


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
    # Failures retried so far (of max_retries): free requeues use none (migration 0025r).
    retries_used: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
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
    # The Unix account the job runs as under a root daemon with --auth, when the request
    # that submitted it proved it: the caller of the Unix socket (SO_PEERCRED), or a token
    # that account made for itself. None: the account its owner is mapped to (users.unix_user).
    run_as: Mapped[str | None] = mapped_column(String(64), nullable=True)

    # Sharing GPUs by memory (core.sharing): the bytes it reserves on each GPU (None: it
    # takes them whole), or ``auto`` (learned from earlier runs); at most this many jobs on
    # a GPU it is on; requeues on whole GPUs after running out of memory sharing.
    gpu_mem_bytes: Mapped[int | None] = mapped_column(Integer, nullable=True)
    gpu_mem_auto: Mapped[bool] = mapped_column(Boolean, default=False, server_default="0")
    gpu_share: Mapped[int | None] = mapped_column(Integer, nullable=True)
    oom_requeues: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # Which earlier jobs are "the same job" for ``auto``: "name:<name>" when it was given
    # one, else "cmd:<hash of its command>" (a derived name such as "python" says little).
    mem_key: Mapped[str | None] = mapped_column(String(80), nullable=True)
    # An interactive session (``ddpq shell``): its shim holds a terminal, and it is ended
    # once its GPUs have been unused for idle_s (None: never). idle_since: when the worker
    # first saw its GPUs idle (any job on GPUs; None while in use); idle_warned_at: when
    # its terminal was told it will be ended (core.interactive).
    interactive: Mapped[bool] = mapped_column(Boolean, default=False, server_default="0")
    idle_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    idle_since: Mapped[float | None] = mapped_column(Float, nullable=True)
    idle_warned_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    # Hardware asked for (core.topology, migration 0022t): a link class, a model/MIG name.
    gpu_link: Mapped[str | None] = mapped_column(String(8), nullable=True)
    gpu_type: Mapped[str | None] = mapped_column(String(64), nullable=True)
    # The host's CPU cores and memory (bytes) it asked for (--cpus, --mem); None: the
    # daemon's defaults, applied when it is placed (core.hostres).
    cpus: Mapped[int | None] = mapped_column(Integer, nullable=True)
    ram_bytes: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # --dependency singleton (core.deps, migration 0023d): waits for earlier jobs of its
    # owner and name to end.
    singleton: Mapped[bool] = mapped_column(Boolean, default=False, server_default="0")
    # When the worker expects it to start while it is queued (NULL: unknown; migration
    # 0023p, ``worker.forecast``): not part of the spec, rewritten every few passes.
    predicted_start: Mapped[float | None] = mapped_column(Float, nullable=True)
    # Elastic (migration 0024e): the most GPUs it may be given (``gpus`` is its least), and
    # while it is being resized, the size its next attempt takes (NULL once leased).
    gpus_max: Mapped[int | None] = mapped_column(Integer, nullable=True)
    resize_to: Mapped[int | None] = mapped_column(Integer, nullable=True)

    __table_args__ = (
        Index("ix_jobs_state_priority", "state", "priority"),
        Index("ix_jobs_owner_mem_key", "owner", "mem_key"),
        # The notifier's question, every second: which ended jobs still owe a message.
        Index(
            "ix_jobs_notify_pending",
            "id",
            sqlite_where=text("notify_url IS NOT NULL AND notify_done_at IS NULL"),
        ),
        Index("ix_jobs_sweep", "sweep_id", "sweep_index"),
        # ``ddpq ls`` and the per-user caps walk these, never the rows (migration 0022q,
        # ``store.queue``).
        Index("ix_jobs_state_owner_sweep", "state", "owner", "sweep_id"),
        Index("ix_jobs_sweep_state", "sweep_id", "state"),
        # ``ddpq history`` walks these newest first (migration 0023h, ``store.history``).
        Index("ix_jobs_ended", "ended_at"),
        Index("ix_jobs_owner_ended", "owner", "ended_at"),
        # The scheduling pass's window over the queue, walked without reading a row or
        # sorting (migration 0023w, ``store.jobs.queued_for_planning``).
        Index("ix_jobs_plan_shape", *PLAN_SHAPE_INDEX),
        # Queued jobs no pass has given a reason yet (``store.jobs.say_unplanned``).
        Index("ix_jobs_unplanned", "id", sqlite_where=text(UNPLANNED)),
        # A singleton's question when a job ends: who is held on its owner and name (0023d).
        Index("ix_jobs_owner_name_state", "owner", "name", "state"),
        # Ids only grow, never reused (migration 0021j, ``store.ids``).
        {"sqlite_autoincrement": True},
    )

    def spec(self, **waits: Iterable[int]) -> JobSpec:
        """What the job asks for, read back from its row (``spec_of``); its dependencies
        are in their own tables, so the caller that wants them passes them by field
        (``store.jobs.spec_of`` reads them)."""
        return spec_of(self, **waits)


# ---- the one mapping between a JobSpec and the jobs table --------------------------
#
# Every JobSpec field is the jobs column of its name, stored as it is, but for these: the
# fields kept in tables of their own (store.dependencies), a field whose column is named
# otherwise, and tuples (a JSON list in the row, NULL when empty). Adding a field to the
# spec is then: the field, and a migration for its column.

# In job_dependencies and sweep_dependencies, each row with its kind (``DEPENDENCY_FIELDS``).
DEPENDENCY_FIELDS = {
    ("afterok", False): "after",
    ("afterany", False): "after_any",
    ("afternotok", False): "after_notok",
    ("afterok", True): "after_sweeps",
    ("afterany", True): "after_any_sweeps",
    ("afternotok", True): "after_notok_sweeps",
}
KEPT_ELSEWHERE = frozenset(DEPENDENCY_FIELDS.values())
RENAMED = {"hold": "user_hold"}  # its column predates the spec's name
SPEC_COLUMNS: dict[str, str] = {
    f.name: RENAMED.get(f.name, f.name) for f in fields(JobSpec) if f.name not in KEPT_ELSEWHERE
}
_TUPLES = frozenset(
    name for name, hint in get_type_hints(JobSpec).items() if get_origin(hint) is tuple
)


def _stored(value: Any) -> Any:
    if isinstance(value, tuple):
        return list(value) or None
    if isinstance(value, (list, dict)):
        return type(value)(value)  # a copy: the row's value must not be the spec's
    return value


def columns_of(spec: JobSpec) -> dict[str, Any]:
    """The jobs columns' values for ``spec`` (those of SPEC_COLUMNS)."""
    return {column: _stored(getattr(spec, name)) for name, column in SPEC_COLUMNS.items()}


def new_row(spec: JobSpec, state: JobState, reason: str, now: float) -> dict[str, Any]:
    """A new job's row: its spec, and its life so far (none yet)."""
    life = {"attempt": 0, "port_retries": 0, "preemptions": 0, "oom_requeues": 0}
    return {**columns_of(spec), **life, "state": state, "reason": reason, "submitted_at": now}


def written(job_id: int, values: Mapping[str, Any]) -> Job:
    """A detached ``Job`` holding a row as written, as if read back: its values put in
    place, not each through its attribute's setter (``Job(**values)`` was most of the
    cost of a submission's insert)."""
    job: Job = Job.__mapper__.class_manager.new_instance()
    job.__dict__.update(values, id=job_id)
    return job


def _read(name: str, value: Any) -> Any:
    if name in _TUPLES:
        return tuple(value or ())
    if isinstance(value, (list, dict)):
        return type(value)(value)
    return value


def spec_of(row: Any, **waits: Iterable[int]) -> JobSpec:
    """The spec a jobs row (a ``Job``, or a Core row with the SPEC_COLUMNS) holds, with
    the dependencies ``waits`` gives by field (those of ``KEPT_ELSEWHERE``)."""
    values = {name: _read(name, getattr(row, column)) for name, column in SPEC_COLUMNS.items()}
    unknown = set(waits) - KEPT_ELSEWHERE
    if unknown:
        raise TypeError(f"not a dependency field: {sorted(unknown)}")
    values.update({k: tuple(v) for k, v in waits.items()})
    return JobSpec(**values)
