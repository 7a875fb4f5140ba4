"""A job to queue, as the API takes it (``POST /jobs``, a sweep's template): its fields and
their limits. The rules that span fields or read the core are in ``submit_rules``."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ddpq.core import hostres, sharing
from ddpq.core.notify import check_url
from ddpq.schemas import submit_rules as rules
from ddpq.schemas.common import (
    CWD_PATTERN,
    MAX_ARGS,
    MAX_NODES,
    NAME_PATTERN,
    PRIORITY_MAX,
    PRIORITY_MIN,
    USER_PRIORITY_MAX,
    Text,
)


class JobSubmit(BaseModel):
    """A job to queue: a command, or a built-in workload with its arguments.

    Strict types: ``"gpus": "2"``, ``"gpus": true`` or ``"hold": "yes"`` are refused rather
    than guessed at (an int is still accepted where a float is expected).
    """

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
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

    command: list[Text] = Field(default_factory=list, max_length=MAX_ARGS)
    workload: Text | None = Field(default=None, description="a built-in workload, e.g. resnet18")
    args: list[Text] = Field(default_factory=list, max_length=MAX_ARGS)
    name: Text | None = Field(
        default=None,
        description="default: the program's file name, made to fit the pattern",
        json_schema_extra={"pattern": NAME_PATTERN},
    )
    gpus: int = Field(default=0, ge=0, le=1024)
    gpus_max: int | None = Field(
        default=None,
        ge=1,
        le=1024,
        description="elastic (docs/elastic.md): `gpus` is then the least it runs on, this "
        "the most; it starts with what is free, grows at a checkpoint when GPUs are free and "
        "nobody waits for them, and shrinks instead of being preempted whole. Implies "
        "preemptible (the checkpoint signal is the preemption one); `ddpq submit --gpus 2-4`",
    )
    torchrun: bool = Field(
        default=False, description="run the command under torchrun on the leased GPUs and port"
    )
    priority: int = Field(
        default=0,
        ge=PRIORITY_MIN,
        le=PRIORITY_MAX,
        description=f"higher starts first; with --auth, above {USER_PRIORITY_MAX} needs an admin",
    )
    time_limit_s: float | None = Field(default=None, gt=0, le=365 * 24 * 3600, allow_inf_nan=False)
    retries: int = Field(default=0, ge=0, le=100)
    after: list[Annotated[int, Field(ge=1, le=2**63 - 1)]] = Field(
        default_factory=list, max_length=64
    )
    hold: bool = False
    after_sweeps: list[Annotated[int, Field(ge=1, le=2**63 - 1)]] = Field(
        default_factory=list,
        max_length=64,
        description="sweeps every member of which must succeed before this job starts",
    )
    env: dict[Text, Text] = Field(
        default_factory=dict,
        description="variables to set (over `exported_env`); those ddpq sets for every job "
        "(CUDA_VISIBLE_DEVICES, MASTER_PORT, DDPQ_*, ...) are refused",
    )
    exported_env: dict[Text, Text] | None = Field(
        default=None,
        description="the submitter's environment (`ddpq submit --export`): the job starts "
        "from it instead of the daemon's environment, with PATH, HOME, USER and LOGNAME "
        "filled in if missing; terminal-only variables (SSH_AUTH_SOCK, DISPLAY, TERM, ...) "
        "and those ddpq sets are left out. null: the daemon's environment",
    )
    cwd: Text | None = Field(
        default=None,
        max_length=4096,
        description="an absolute path to a directory the job's owner can enter "
        "(default: the daemon's state folder)",
        json_schema_extra={"pattern": CWD_PATTERN},
    )
    owner: Text | None = Field(
        default=None,
        description="ignored when the daemon has --auth (the token says who)",
        json_schema_extra={"pattern": NAME_PATTERN},
    )
    preemptible: bool = Field(
        default=False,
        description="may be asked to checkpoint and go back to the queue (docs/preemption.md)",
    )
    preempt_signal: Literal["USR1", "USR2", "INT", "HUP", "TERM"] = Field(
        default="USR1", description="the signal that tells a preemptible job to checkpoint"
    )
    notify: Text | None = Field(
        default=None,
        description="an http(s) URL to POST a JSON message to when the job ends (Slack and "
        "Mattermost webhooks show its `text`); in a sweep's template, one message once "
        "every member has ended; default: the daemon's --notify-url",
    )
    gpu_mem: int | Text | None = Field(
        default=None,
        description="share GPUs by memory: what the job reserves on each of its GPUs, in "
        'bytes or as "10G", or "auto" (what earlier runs of the same job were measured to '
        "use, plus a margin; a whole GPU while there is no such run). Without it the job "
        "takes its GPUs whole. `gpus` defaults to 1 with it",
        json_schema_extra={"examples": ["10G", "auto", 10737418240]},
    )
    gpu_share: int | None = Field(
        default=None,
        ge=1,
        le=sharing.MAX_GPU_SHARE,
        description="with gpu_mem: at most this many jobs on a GPU this job is on",
    )
    gpu_link: Text | None = Field(
        default=None,
        description="the worst link its GPUs may have among them: nvlink, pix, pxb, phb, node "
        "or sys (nvidia-smi topo -m's words); it waits for such a set rather than take a "
        "worse one. Stored as the class: NV, PIX, ...",
        json_schema_extra={"examples": ["nvlink"]},
    )
    gpu_type: Text | None = Field(
        default=None,
        description="only GPUs whose model name contains this (case-insensitive), or MIG "
        "instances of this profile (1g.10gb); `gpus` defaults to 1 with it",
        json_schema_extra={"examples": ["A100", "1g.10gb"]},
    )

    interactive: bool = Field(
        default=False,
        description="a session (`ddpq shell`): the command runs on a terminal its shim holds, "
        "which `ddpq attach` relays; `{port}` in the command is the leased port",
    )
    idle_s: float | None = Field(
        default=None,
        gt=0,
        le=365 * 24 * 3600,
        allow_inf_nan=False,
        description="a session whose GPUs stay unused this long is warned, then ended "
        "(reason idle); default: the daemon's --idle, at most its --idle-max",
    )
    cpus: int | None = Field(
        default=None,
        ge=1,
        le=hostres.MAX_CPUS,
        description="CPU cores it leases and runs confined to; default: one for a job "
        "without GPUs, the daemon's cpus_per_gpu for each GPU",
    )
    mem: int | Text | None = Field(
        default=None,
        description='host memory it holds and is limited to, in bytes or as "4G"; '
        "default: the daemon's default_mem (per GPU: default_mem_per_gpu), none if unset",
        json_schema_extra={"examples": ["4G", 4294967296]},
    )
    dependency: Text | None = Field(
        default=None,
        max_length=2048,
        description="Slurm's --dependency: afterok:ID[:ID...], afterany:..., afternotok:... "
        "and singleton, comma-separated (all must hold); an ID is a job's id or sN, every "
        "member of sweep N. A dependency that can never be met (afterok on a job that "
        "failed, afternotok on one that succeeded) ends this job cancelled with that reason",
        json_schema_extra={"examples": ["afterok:12:13,afterany:s4", "singleton"]},
    )
    # Only where the daemon runs jobs on Slurm (`--executor slurm`, docs/slurm.md).
    nodes: int = Field(
        default=1, ge=1, le=MAX_NODES, description="hosts it spans (with gpus_per_node)"
    )
    gpus_per_node: int | None = Field(
        default=None,
        ge=0,
        le=1024,
        description="with nodes: the GPUs on each; gpus is then nodes x gpus_per_node",
    )
    partition: Text | None = Field(
        default=None, description="the Slurm partition, over the daemon's --slurm-partition"
    )
    slurm_options: list[Text] = Field(
        default_factory=list,
        max_length=32,
        description="extra #SBATCH options (--qos=high), one each; only those the daemon's "
        "slurm_user_options allow",
    )

    @field_validator("partition")
    @classmethod
    def _partition(cls, v: str | None) -> str | None:
        return rules.check_partition(v)

    @field_validator("slurm_options")
    @classmethod
    def _slurm_options(cls, v: list[str]) -> list[str]:
        return rules.check_slurm_options(v)

    @model_validator(mode="after")
    def _nodes(self) -> JobSubmit:
        self.gpus = rules.gpus_over_nodes(self.gpus, self.nodes, self.gpus_per_node)
        return self

    @field_validator("gpu_mem")
    @classmethod
    def _gpu_mem(cls, v: int | str | None) -> int | str | None:
        return rules.check_gpu_mem(v)

    @model_validator(mode="after")
    def _sharing(self) -> JobSubmit:
        rules.check_sharing(self)
        if self.gpu_mem is not None and self.gpus == 0:
            self.gpus = 1  # memory on a GPU: one of them, unless it says more
        return self

    @property
    def gpu_mem_bytes(self) -> int | None:
        """The reservation asked for, in bytes (None: whole GPUs, or ``auto``)."""
        return self.gpu_mem if isinstance(self.gpu_mem, int) else None

    @field_validator("mem")
    @classmethod
    def _mem(cls, v: int | str | None) -> int | None:
        return rules.check_mem(v)

    @property
    def ram_bytes(self) -> int | None:
        """``mem`` in bytes (None: the daemon's defaults)."""
        return self.mem if isinstance(self.mem, int) else None

    @field_validator("notify")
    @classmethod
    def _notify(cls, v: str | None) -> str | None:
        return None if v is None else check_url(v)

    @field_validator("name", "owner")
    @classmethod
    def _name(cls, v: str | None) -> str | None:
        return rules.check_name(v)

    @field_validator("command", "args")
    @classmethod
    def _argv(cls, v: list[str]) -> list[str]:
        return rules.check_argv(v)

    @field_validator("cwd")
    @classmethod
    def _cwd(cls, v: str | None) -> str | None:
        return rules.check_cwd(v)

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        return rules.check_env(v)

    @field_validator("exported_env")
    @classmethod
    def _exported_env(cls, v: dict[str, str] | None) -> dict[str, str] | None:
        return None if v is None else rules.check_exported_env(v)

    @model_validator(mode="after")
    def _env_size(self) -> JobSubmit:
        rules.check_env_size(self)
        return self

    @model_validator(mode="after")
    def _session(self) -> JobSubmit:
        rules.check_session(self)
        return self

    @model_validator(mode="after")
    def _elastic(self) -> JobSubmit:
        self.gpus_max = rules.check_elastic(self)
        if self.gpus_max is not None:
            self.preemptible = True  # resized through the preemption contract
        return self

    @field_validator("gpu_link")
    @classmethod
    def _gpu_link(cls, v: str | None) -> str | None:
        return rules.check_gpu_link(v)

    @field_validator("gpu_type")
    @classmethod
    def _gpu_type(cls, v: str | None) -> str | None:
        return rules.check_gpu_type(v)

    @model_validator(mode="after")
    def _hardware(self) -> JobSubmit:
        rules.check_hardware(self)
        if self.gpu_type is not None and self.gpus == 0:
            self.gpus = 1  # a GPU of that type: one, unless it says more
        return self

    @field_validator("dependency")
    @classmethod
    def _dependency(cls, v: str | None) -> str | None:
        return rules.check_dependency(v)

    @model_validator(mode="after")
    def _waits(self) -> JobSubmit:
        rules.spec_waits(self)  # refuses a job or sweep named under two kinds
        return self

    def waits(self) -> dict[str, Any]:
        """Its dependencies as ``JobSpec`` fields (``after``: afterok, ... , singleton)."""
        return rules.spec_waits(self)

    @model_validator(mode="after")
    def _command_or_workload(self) -> JobSubmit:
        rules.check_command_or_workload(self)
        return self
