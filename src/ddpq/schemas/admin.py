"""The host's side of the API: its GPUs (``ddpq gpus``), reservations (``ddpq admin
reserve``) and the usage report (``ddpq usage``)."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ddpq.core.gpus import GpuProcess
from ddpq.core.states import JobState
from ddpq.schemas.common import NAME_PATTERN, NAME_RE, NAME_RULE, Text


class DeviceShare(BaseModel):
    """A job holding a share of a GPU's memory."""

    job_id: int
    owner: str | None
    gpu_mem: int = Field(description="bytes it reserves on this GPU")
    since: datetime


class DeviceOut(BaseModel):
    index: int
    uuid: str
    name: str
    fake: bool
    memory_total_mb: int
    memory_used_mb: int
    status: Literal["free", "leased", "shared", "external"]
    job_id: int | None = None
    owner: str | None = None
    since: datetime | None = None
    # The core's record of a GPU process: the same fields on the wire.
    external_processes: list[GpuProcess] = Field(default_factory=list)
    shares: list[DeviceShare] = Field(
        default_factory=list, description="the jobs sharing it by memory (status shared)"
    )
    idle_since: datetime | None = Field(
        default=None, description="leased: since when the job's GPUs are unused (null: in use)"
    )
    idle_long: bool = Field(
        default=False, description="unused longer than the daemon's --idle (any job)"
    )
    # Where it sits (core.topology): null where unknown.
    numa: int | None = Field(default=None, description="its NUMA node")
    cpus: str | None = Field(default=None, description="that node's CPUs, as 0-15,32-47")
    links: dict[int, str] = Field(
        default_factory=dict,
        description="its link to each other GPU by index, in nvidia-smi topo -m's words "
        "(NV#, PIX, PXB, PHB, NODE, SYS)",
    )
    mig_profile: str | None = Field(
        default=None, description="a MIG instance: its profile (1g.10gb); it is a GPU of its own"
    )
    parent: int | None = Field(
        default=None, description="a MIG instance: the index of the GPU it is carved from"
    )


class LimitOut(BaseModel):
    """One kind of job limit on this host: enforced, and how, or not, and why."""

    controller: str = Field(description="cpuset (CPU cores), memory or pids (processes)")
    enforced: bool
    how: str = Field(description='"cgroup v1", "cgroup v2", or why it is not enforced')
    said: str = Field(description='in words: "memory limits: not enforced (no memory controller)"')


class HostJob(BaseModel):
    """A job holding the host's CPU cores or memory."""

    job_id: int
    owner: str | None = None
    cores: list[int] = Field(default_factory=list, description="the CPUs it is confined to")
    mem: int | None = Field(default=None, description="the host memory in bytes it holds")


class HostOut(BaseModel):
    """The host's CPU cores and memory as jobs lease them (``core.hostres``)."""

    cpu_capacity: int | None = Field(description="core slots jobs may lease (null: not counted)")
    cores_held: int = Field(description="core slots running jobs lease")
    job_ram: int | None = Field(description="bytes jobs may hold in all (null: not counted)")
    ram_held: int = Field(description="bytes running jobs hold")
    jobs: list[HostJob] = Field(default_factory=list)


class DeviceList(BaseModel):
    items: list[DeviceOut]
    ports_leased: dict[int, int] = Field(
        default_factory=dict, description="rendezvous port -> job id"
    )
    limits: list[LimitOut] = Field(
        default_factory=list,
        description="what enforces jobs' cores, memory and processes (empty: the executor "
        "does not, e.g. Slurm's own limits)",
    )
    host: HostOut | None = Field(default=None, description="the host's CPU cores and memory")


class ReservationIn(BaseModel):
    """GPUs to keep for one user's jobs in a window (``ddpq admin reserve``). Times are
    ISO 8601 with an offset, or UNIX seconds."""

    model_config = ConfigDict(extra="forbid")

    user: Text = Field(json_schema_extra={"pattern": NAME_PATTERN})
    gpus: int = Field(ge=1, le=1024, strict=True)
    start: datetime
    end: datetime

    @field_validator("user")
    @classmethod
    def _user(cls, v: str) -> str:
        if not NAME_RE.match(v):
            raise ValueError(NAME_RULE)
        return v

    @field_validator("start", "end")
    @classmethod
    def _aware(cls, v: datetime) -> datetime:
        if v.tzinfo is None:
            raise ValueError("give the time with its offset (2026-12-03T09:00+01:00, or Z)")
        return v


class ReservationOut(BaseModel):
    id: int
    user: str
    gpus: int
    start: datetime
    end: datetime
    active: bool = Field(description="in force now")
    created_at: datetime
    created_by: str


class ReservationList(BaseModel):
    items: list[ReservationOut]


class UsageRow(BaseModel):
    """The usage of one group in the report's window (``ddpq.core.usage.report``)."""

    key: str = Field(description="the user, the Unix account, the UTC day or month, or 'total'")
    kind: Literal["user", "account", "day", "month", "total"] = Field(
        description="what `key` is; `account`: outside use by an account that is no (single) "
        "ddpq user's"
    )
    gpu_hours_jobs: float = Field(description="GPU-hours of ddpq jobs' attempts")
    gpu_hours_outside: float = Field(
        description="GPU-hours of processes in no ddpq job (each account on a GPU is charged "
        "the whole GPU)"
    )
    jobs: dict[JobState, int] = Field(description="jobs that ended, by their final state")
    jobs_started: int = Field(description="jobs first started (what the waits are of)")
    wait_p50_s: float | None = Field(description="median wait from submission to first start")
    wait_p90_s: float | None = Field(description="90th percentile of that wait")
    mem_reserved_gib_h: float | None = Field(
        default=None,
        description="GiB-hours of GPU memory reserved by attempts sharing GPUs (--gpu-mem), "
        "per GPU times its GPUs; null: no such attempt",
    )
    mem_used_gib_h: float | None = Field(
        default=None,
        description="the same attempts' measured peaks, in GiB-hours (compare with "
        "mem_reserved_gib_h); null: none of them measured",
    )
    mem_used_peak_gib: float | None = Field(
        default=None,
        description="the highest measured peak of any attempt on one GPU, GiB; null: none",
    )
    core_hours: float = Field(
        default=0.0, description="core-hours of the CPU cores jobs' attempts leased (--cpus)"
    )


class UsageReport(BaseModel):
    since: datetime
    until: datetime
    by: Literal["user", "day", "month"]
    outside_use: Literal["count", "show"] = Field(
        description="whether outside use counts towards its user's fair share (count) or is "
        "only shown (show)"
    )
    rows: list[UsageRow]
    total: UsageRow
