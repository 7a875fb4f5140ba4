"""Wire schemas shared by the server and the client (pydantic v2, nothing else)."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

MAX_ARGS = 1024
MAX_ARG_LEN = 4096
MAX_COMMAND_BYTES = 64 * 1024
MAX_ENV_VARS = 128
MAX_ENV_BYTES = 32 * 1024
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
# Set by ddpq for every job (the job contract); a submission may not override them.
RESERVED_ENV = frozenset(
    {
        "CUDA_VISIBLE_DEVICES",
        "CUDA_DEVICE_ORDER",
        "MASTER_ADDR",
        "MASTER_PORT",
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
    }
)

JobStateName = Literal[
    "queued", "held", "starting", "running", "succeeded", "failed", "cancelled", "timed_out"
]


class JobSubmit(BaseModel):
    """A job to queue: a command, or a built-in workload with its arguments."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"command": ["python", "train.py", "--epochs", "3"], "gpus": 2, "name": "exp1"},
                {
                    "workload": "resnet18",
                    "args": ["--epochs", "5", "--synthetic", "5000"],
                    "gpus": 2,
                },
            ]
        },
    )

    command: list[str] = Field(default_factory=list, max_length=MAX_ARGS)
    workload: str | None = Field(default=None, description="a built-in workload, e.g. resnet18")
    args: list[str] = Field(default_factory=list, max_length=MAX_ARGS)
    name: str | None = None
    gpus: int = Field(default=0, ge=0, le=1024)
    torchrun: bool = Field(
        default=False, description="run the command under torchrun on the leased GPUs and port"
    )
    priority: int = Field(default=0, ge=-1000, le=1000)
    time_limit_s: float | None = Field(default=None, gt=0, le=365 * 24 * 3600)
    retries: int = Field(default=0, ge=0, le=100)
    after: list[Annotated[int, Field(ge=1, le=2**63 - 1)]] = Field(
        default_factory=list, max_length=64
    )
    hold: bool = False
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = Field(default=None, max_length=4096)
    owner: str | None = Field(
        default=None, description="ignored when the daemon has --auth (the token says who)"
    )

    @field_validator("name", "owner")
    @classmethod
    def _name(cls, v: str | None) -> str | None:
        if v is not None and not NAME_RE.match(v):
            raise ValueError("must be 1-64 characters of letters, digits, '.', '_' or '-'")
        return v

    @field_validator("command", "args")
    @classmethod
    def _argv(cls, v: list[str]) -> list[str]:
        for arg in v:
            if len(arg) > MAX_ARG_LEN:
                raise ValueError(f"an argument is longer than {MAX_ARG_LEN} characters")
            if "\x00" in arg:
                raise ValueError("an argument contains a NUL byte")
        if sum(len(a) for a in v) > MAX_COMMAND_BYTES:
            raise ValueError(f"is longer than {MAX_COMMAND_BYTES} characters in all")
        return v

    @field_validator("cwd")
    @classmethod
    def _cwd(cls, v: str | None) -> str | None:
        if v is not None and ("\x00" in v or not v.startswith("/")):
            raise ValueError("must be an absolute path without NUL bytes")
        return v

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        if len(v) > MAX_ENV_VARS:
            raise ValueError(f"has more than {MAX_ENV_VARS} variables")
        for key, value in v.items():
            if not ENV_KEY_RE.match(key):
                raise ValueError(f"{key!r} is not a valid variable name")
            if key in RESERVED_ENV or key.startswith("DDPQ_"):
                raise ValueError(f"{key} is set by ddpq for every job and cannot be overridden")
            if "\x00" in value:
                raise ValueError(f"{key} contains a NUL byte")
        if sum(len(k) + len(x) for k, x in v.items()) > MAX_ENV_BYTES:
            raise ValueError(f"is larger than {MAX_ENV_BYTES} bytes")
        return v

    @model_validator(mode="after")
    def _command_or_workload(self) -> JobSubmit:
        if self.workload is None:
            if not self.command:
                raise ValueError("command: give a command to run (it is empty)")
            if not self.command[0].strip():
                raise ValueError("command: the program name is empty")
            if self.args:
                raise ValueError("args: only a workload takes args; put them in the command")
        elif self.command:
            raise ValueError("give either a command or a workload, not both")
        return self


class LeaseOut(BaseModel):
    gpus: list[int] = Field(default_factory=list)
    port: int | None = None


class EventOut(BaseModel):
    at: datetime
    from_state: str | None
    to_state: str
    reason: str


class AttemptOut(BaseModel):
    number: int
    gpus: list[int]
    port: int | None
    started_at: datetime
    ended_at: datetime | None
    exit_code: int | None
    exit_signal: int | None
    state: str | None
    reason: str


class JobOut(BaseModel):
    id: int
    name: str
    owner: str
    command: list[str]
    launcher: str
    gpus: int
    priority: int
    state: JobStateName
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
    leases: LeaseOut
    progress: dict[str, Any] | None
    job_dir: str | None


class JobDetail(JobOut):
    events: list[EventOut]
    attempts: list[AttemptOut]


class JobList(BaseModel):
    items: list[JobOut]
    total: int
    offset: int
    limit: int


class CancelResult(BaseModel):
    id: int
    state: JobStateName
    reason: str


class GpuProcessOut(BaseModel):
    pid: int
    used_memory_mb: int | None


class DeviceOut(BaseModel):
    index: int
    uuid: str
    name: str
    fake: bool
    memory_total_mb: int
    memory_used_mb: int
    status: Literal["free", "leased", "external"]
    job_id: int | None = None
    owner: str | None = None
    since: datetime | None = None
    external_processes: list[GpuProcessOut] = Field(default_factory=list)


class DeviceList(BaseModel):
    items: list[DeviceOut]
    ports_leased: dict[int, int] = Field(
        default_factory=dict, description="rendezvous port -> job id"
    )


class ErrorOut(BaseModel):
    """Every error the API returns has this shape."""

    detail: str
    code: str
