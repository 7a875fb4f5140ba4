"""What the API says about jobs: a job, its attempts, events and leases, lists of jobs, the
answers of cancel, metrics, port use and environment."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from ddpq.core.states import JobState


class NotificationOut(BaseModel):
    """One attempt to deliver the job's end, or the sweep's (the URL is not shown: it may
    hold a secret)."""

    attempt: int
    at: datetime
    status: int | None
    error: str


class MetricsOut(BaseModel):
    """Records of a job's metrics.jsonl from a byte offset: numeric fields only."""

    job_id: int
    state: JobState
    records: list[dict[str, float | int]]
    offset: int
    next_offset: int = Field(description="ask from here for the records that follow")
    size: int = Field(description="the file's size now")


class LeaseOut(BaseModel):
    gpus: list[int] = Field(default_factory=list)
    port: int | None = None
    gpu_mem: int | None = Field(
        default=None, description="sharing its GPUs: the bytes reserved on each (else null)"
    )
    cores: list[int] = Field(
        default_factory=list, description="the host's CPUs it runs confined to (none: shared)"
    )
    mem: int | None = Field(default=None, description="the host memory in bytes it holds")


class EventOut(BaseModel):
    at: datetime
    from_state: JobState | None
    to_state: JobState
    reason: str


class AttemptOut(BaseModel):
    number: int
    gpus: list[int]
    port: int | None
    started_at: datetime
    ended_at: datetime | None
    exit_code: int | None
    exit_signal: int | None
    state: JobState | None
    reason: str
    executor: str | None = Field(default=None, description="where the attempt ran, e.g. local")
    handle: str | None = Field(
        default=None,
        description="the executor's name for the attempt (local: the shim's PID:start time)",
    )
    gpu_mem: int | None = Field(
        default=None, description="bytes it reserved on each GPU it shared (null: whole GPUs)"
    )
    peak_mem: int | None = Field(
        default=None,
        description="the most its processes held on any one of its GPUs, in bytes, as "
        "sampled through NVML while it ran (null: never sampled, e.g. fake GPUs)",
    )
    cores: list[int] | None = Field(
        default=None, description="the host's CPUs it ran confined to (null: not confined)"
    )
    mem: int | None = Field(default=None, description="the host memory in bytes it held")
    peak_ram: int | None = Field(
        default=None, description="the most host memory its cgroup held (null: not read)"
    )


class JobOut(BaseModel):
    id: int
    name: str
    owner: str
    command: list[str]
    launcher: str
    gpus: int
    gpus_max: int | None = Field(
        default=None, description="elastic: the most GPUs it may be given (`gpus`: its least)"
    )
    priority: int
    state: JobState
    reason: str
    submitted_at: datetime
    started_at: datetime | None
    ended_at: datetime | None
    exit_code: int | None
    exit_signal: int | None
    time_limit_s: float | None
    retries: int
    attempt: int
    after: list[int]
    hold: bool
    preemptible: bool = False
    preemptions: int = 0
    nodes: int = 1
    gpus_per_node: int | None = None
    partition: str | None = None
    slurm_options: list[str] = Field(default_factory=list)
    leases: LeaseOut
    progress: dict[str, Any] | None
    job_dir: str | None
    after_sweeps: list[int] = Field(default_factory=list)
    dependency: str = Field(
        default="",
        description="all it waits on as Slurm's --dependency text (afterok:1:s2,afterany:3,"
        "singleton); `after` and `after_sweeps` are its afterok part",
    )
    sweep_id: int | None = Field(default=None, description="the sweep this job is a member of")
    sweep_index: int | None = Field(default=None, description="its index in that sweep")
    gpu_mem: int | None = Field(
        default=None, description="bytes it asked to reserve on each GPU (null: whole GPUs)"
    )
    gpu_mem_auto: bool = Field(default=False, description="its reservation is learned (auto)")
    gpu_share: int | None = None
    gpu_link: str | None = Field(default=None, description="the worst link class it accepts")
    gpu_type: str | None = Field(default=None, description="the GPU model or MIG profile")
    peak_mem: int | None = Field(
        default=None, description="its latest attempt's peak GPU memory in bytes (see attempts)"
    )
    interactive: bool = Field(default=False, description="a session (`ddpq shell`)")
    idle_s: float | None = Field(default=None, description="a session's idle limit")
    idle_since: datetime | None = Field(
        default=None, description="running on GPUs: since when they are unused (null: in use)"
    )
    attach: str | None = Field(
        default=None,
        description="a running session: the Unix socket its terminal is relayed on (on the "
        "daemon's host; its owner's account alone may open it)",
    )
    cpus: int | None = Field(default=None, description="CPU cores asked for (null: default)")
    mem: int | None = Field(
        default=None, description="host memory in bytes asked for (null: the default)"
    )
    predicted_start: datetime | None = Field(
        default=None,
        description="a queued job: when the daemon expects it to start, from the jobs "
        "ahead of it and their progress, time limits and history (null: unknown)",
    )


class JobDetail(JobOut):
    events: list[EventOut]
    attempts: list[AttemptOut]
    notify: bool = Field(default=False, description="a URL is set to POST the job's end to")
    notifications: list[NotificationOut] = Field(default_factory=list)


class JobList(BaseModel):
    items: list[JobOut]
    total: int
    offset: int
    limit: int


class CancelResult(BaseModel):
    id: int
    state: JobState
    reason: str


class PortUseOut(BaseModel):
    """Who listens on a running job's leased port (its owner's and admins' to ask):
    ``ddpq shell`` prints how to reach a session's server only once the job itself does."""

    port: int | None = Field(description="the job's leased port (null: it holds none now)")
    listener: Literal["job", "other", "nobody", "unknown"] = Field(
        description="job: a process of this job (and no other) listens on it; other: a "
        "process that is not the job's does (uid, user, pid say whose); nobody: no one "
        "listens yet; unknown: the daemon cannot tell (a job on a Slurm node)"
    )
    uid: int | None = Field(default=None, description="the listening process's account")
    user: str | None = None
    pid: int | None = None
    command: str | None = Field(default=None, description="its name (the process's own choice)")
    detail: str = Field(description="the same in words")


class JobEnvOut(BaseModel):
    """The variables a job was submitted with; only its owner and admins may read them."""

    id: int
    base: Literal["daemon", "exported"] = Field(
        description="what the job starts from: the daemon's environment, or the one its "
        "submitter exported (`exported_env`)"
    )
    env: dict[str, str] = Field(
        description="the submitted variables (`exported_env` with `env` over it); the job "
        "contract's variables are set over these when it starts"
    )
