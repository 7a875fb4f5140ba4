"""Wire schemas shared by the server and the client (pydantic v2, nothing else)."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from ddpq.core import jobenv, sharing
from ddpq.core import slurm as core_slurm
from ddpq.core import sweeps as core_sweeps
from ddpq.core.gpus import GpuProcess
from ddpq.core.interactive import uses_port

# Defined where the CLI reads them without pydantic; still importable from here.
from ddpq.core.jobenv import ENV_KEY_RE as ENV_KEY_RE
from ddpq.core.jobenv import MAX_ENV_BYTES as MAX_ENV_BYTES
from ddpq.core.jobenv import MAX_ENV_VALUE as MAX_ENV_VALUE
from ddpq.core.jobenv import MAX_ENV_VARS as MAX_ENV_VARS
from ddpq.core.jobenv import RESERVED_ENV as RESERVED_ENV
from ddpq.core.names import DEFAULT_API_ADDRESS as DEFAULT_API_ADDRESS
from ddpq.core.names import NAME_PATTERN as NAME_PATTERN
from ddpq.core.names import NAME_RE as NAME_RE
from ddpq.core.names import NAME_RULE as NAME_RULE
from ddpq.core.notify import check_url
from ddpq.core.states import JobState
from ddpq.core.units import parse_size, size_for_people

MAX_ARGS = 1024
MAX_NODES = 64
MAX_ARG_LEN = 4096
MAX_COMMAND_BYTES = 64 * 1024
CWD_PATTERN = "^/[^\\u0000]*$"
# What a non-admin may ask for (admins: PRIORITY_MAX). Without --auth every caller is an
# admin: the daemon then believes whatever name a client sends, so a cap would be theatre.
USER_PRIORITY_MAX = 100
PRIORITY_MIN, PRIORITY_MAX = -1000, 1000


def _encodable(value: str) -> str:
    """Refuse a string that cannot be written as UTF-8 (a lone surrogate, ``"\\ud800"`` in JSON).

    Python's JSON parser accepts such escapes, SQLite stores them inside JSON columns, and
    then no response that contains them can be encoded: refused at the door, the value never
    reaches the database.
    """
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(
            "contains a character that is not valid Unicode (a lone surrogate)"
        ) from None
    return value


# Every string a request may carry is this type.
Text = Annotated[str, AfterValidator(_encodable)]


def derive_name(program: str) -> str:
    """A job name from a program path that always passes NAME_RE ("job" if nothing is left).

    The basename's runs of other characters (spaces, control characters, non-ASCII, escape
    sequences) become one '-', and the name starts with a letter or digit.
    """
    base = program.rstrip("/").rsplit("/", 1)[-1]
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", base)
    name = re.sub(r"^[^A-Za-z0-9]+", "", name)[:64]
    return name if NAME_RE.match(name) else "job"


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
        if v is not None and not core_slurm.SLURM_NAME.match(v):
            raise ValueError("a Slurm name: letters, digits, '.', '_', '+', '-' (',' lists)")
        return v

    @field_validator("slurm_options")
    @classmethod
    def _slurm_options(cls, v: list[str]) -> list[str]:
        for option in v:
            if len(option) > 1024:
                raise ValueError("an option is at most 1024 characters")
            # Which option it is, and whether users may set it, the daemon's settings
            # decide (core.slurm.user_options, at submission): here, only its form.
            try:
                if not core_slurm.option_words(option):
                    raise core_slurm.SlurmOptionError("is empty")
            except core_slurm.SlurmOptionError as exc:
                raise ValueError(f"{option[:64]!r}: {exc}") from None
        return v

    @model_validator(mode="after")
    def _nodes(self) -> JobSubmit:
        if self.gpus_per_node is not None:
            total = self.nodes * self.gpus_per_node
            if self.gpus not in (0, total):
                raise ValueError(
                    f"gpus: {self.gpus}, but {self.nodes} nodes of {self.gpus_per_node} GPUs "
                    f"are {total}; give one or the other"
                )
            self.gpus = total
        elif self.nodes > 1:
            raise ValueError("gpus_per_node: a job on several nodes says how many GPUs on each")
        return self

    @field_validator("gpu_mem")
    @classmethod
    def _gpu_mem(cls, v: int | str | None) -> int | str | None:
        if v is None or v == sharing.AUTO:
            return v
        if isinstance(v, str):
            try:
                v = parse_size(v)
            except ValueError as exc:
                raise ValueError(f"{exc}, or auto") from None
        if not sharing.MIN_GPU_MEM <= v <= sharing.MAX_GPU_MEM:
            low = size_for_people(sharing.MIN_GPU_MEM)
            raise ValueError(f"must be between {low} and 1P (a CUDA context alone takes ~300M)")
        return v

    @model_validator(mode="after")
    def _sharing(self) -> JobSubmit:
        if self.gpu_mem is None:
            if self.gpu_share is not None:
                raise ValueError("gpu_share: only a job that shares GPUs by memory (gpu_mem)")
            return self
        if self.nodes > 1 or self.gpus_per_node is not None:
            # A share is of a GPU on this host: a job spanning nodes takes them whole.
            raise ValueError("gpu_mem: a job on several nodes (nodes, gpus_per_node) cannot share")
        if self.gpus == 0:
            self.gpus = 1  # memory on a GPU: one of them, unless it says more
        return self

    @property
    def gpu_mem_bytes(self) -> int | None:
        """The reservation asked for, in bytes (None: whole GPUs, or ``auto``)."""
        return self.gpu_mem if isinstance(self.gpu_mem, int) else None

    @field_validator("notify")
    @classmethod
    def _notify(cls, v: str | None) -> str | None:
        return None if v is None else check_url(v)

    @field_validator("name", "owner")
    @classmethod
    def _name(cls, v: str | None) -> str | None:
        if v is not None and not NAME_RE.match(v):
            raise ValueError(NAME_RULE)
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
        for key, value in v.items():
            if not ENV_KEY_RE.match(key):
                raise ValueError(f"{key!r} is not a valid variable name")
            if jobenv.is_reserved(key):
                raise ValueError(f"{key} is set by ddpq for every job and cannot be overridden")
            _check_value(key, value)
        return v

    @field_validator("exported_env")
    @classmethod
    def _exported_env(cls, v: dict[str, str] | None) -> dict[str, str] | None:
        if v is None:
            return None
        for key, value in v.items():
            if not jobenv.is_exportable_name(key):
                raise ValueError(
                    f"{key[:64]!r} is not a variable name (empty, '=', a NUL byte, "
                    f"or longer than {jobenv.MAX_ENV_KEY})"
                )
            _check_value(key, value)
        # Silently: a shell's MASTER_PORT or TERM is no mistake of the submitter's.
        return jobenv.without_left_out(v)

    @model_validator(mode="after")
    def _env_size(self) -> JobSubmit:
        # Counted as stored: the variables the job gets from the submission, in all.
        merged = {**(self.exported_env or {}), **self.env}
        field = "exported_env" if self.exported_env else "env"
        if len(merged) > MAX_ENV_VARS:
            raise ValueError(f"{field}: more than {MAX_ENV_VARS} variables")
        # In UTF-8 bytes, as the kernel counts them.
        size = sum(len(k.encode()) + len(x.encode()) for k, x in merged.items())
        if size > MAX_ENV_BYTES:
            raise ValueError(
                f"{field}: {size // 1024} KiB of variables, more than {MAX_ENV_BYTES // 1024} KiB"
            )
        return self

    @model_validator(mode="after")
    def _session(self) -> JobSubmit:
        if not self.interactive:
            if self.idle_s is not None:
                raise ValueError("idle_s: only an interactive session is ended when idle")
            return self
        refused = [
            (self.workload is not None, "workload", "a session runs a command, not a workload"),
            (self.torchrun, "torchrun", "a session is not run under torchrun"),
            (self.preemptible, "preemptible", "a session cannot be preempted"),
            (self.retries > 0, "retries", "a session is not retried"),
        ]
        for wrong, field, why in refused:
            if wrong:
                raise ValueError(f"{field}: {why}")
        if self.gpus == 0 and uses_port(self.command):
            raise ValueError("command: {port} needs a leased port, which only jobs on GPUs get")
        return self

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


def _check_value(key: str, value: str) -> None:
    # Names only in these messages, never values: an environment holds secrets.
    if "\x00" in value:
        raise ValueError(f"{key} contains a NUL byte")
    if len(value.encode()) > MAX_ENV_VALUE:
        raise ValueError(f"{key} is longer than {MAX_ENV_VALUE // 1024} KiB")


# A sweep's members store their command and environment each: bound the whole, not only
# each part (10,000 members of a 64 KiB command would be 640 MB in the database).
MAX_SWEEP_BYTES = 64 * 1024 * 1024


def _member_bytes(t: JobSubmit, params: dict[str, list[str]]) -> int:
    """A bound on what one member stores: the template's command, args and environment,
    each parameter's longest value (twice: argument and DDPQ_SWEEP_PARAMS), some JSON."""
    base = sum(len(a) + 4 for a in [*t.command, *t.args])
    env = {**(t.exported_env or {}), **t.env}
    base += sum(len(k) + len(v) + 6 for k, v in env.items())
    swept = sum(2 * (len(n) + max(map(len, vs), default=0) + 8) for n, vs in params.items())
    return base + swept + 256


def _check_template(t: JobSubmit, names: list[str]) -> None:
    """Placeholders and parameters must match: a command uses every parameter, and names
    no other; a workload takes them as options it is not already given."""
    if t.workload is None:
        core_sweeps.check_placeholders(t.command, names)
        return
    extra = sorted(core_sweeps.placeholders(t.args) - {core_sweeps.INDEX})
    if extra:
        raise core_sweeps.SweepError(
            f"template.args: {{{extra[0]}}}: a workload's parameters become its options "
            f"(--{extra[0]} VALUE); only {{{core_sweeps.INDEX}}} is filled in its args"
        )
    given = core_sweeps.option_names(t.args)
    for name in names:
        if name in given:
            raise core_sweeps.SweepError(
                f"params.{name}: --{name} is in the template's args too; give it once"
            )


class SweepSubmit(BaseModel):
    """Many jobs in one call: a template (a job submission) and what varies.

    ``params``: each name with its values; the members are their cartesian product (the
    first name varies slowest). For a built-in workload each becomes ``--name value``;
    in a command, ``{name}`` placeholders are filled in (``{{name}}`` is a literal,
    ``${name}`` a shell's and left alone). ``array``: Slurm's form instead (``0-99``,
    ``1,3,5``, ``0-99:2``; ``%K`` at the end runs at most K at once), each member
    getting its index (``{index}`` in a command). Every member finds ``DDPQ_SWEEP_ID``,
    ``DDPQ_SWEEP_INDEX`` and its parameters as JSON (``DDPQ_SWEEP_PARAMS``) in its
    environment.
    """

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={
            "examples": [
                {
                    "template": {"workload": "resnet18", "args": ["--epochs", "5"], "gpus": 2},
                    "params": {"lr": ["0.05", "0.1"], "batch-size": ["64", "128"]},
                },
                {
                    "template": {"command": ["python", "train.py", "--seed", "{index}"]},
                    "array": "0-99%10",
                },
            ]
        },
    )

    template: JobSubmit
    params: dict[Text, Annotated[list[Text], Field(max_length=core_sweeps.MAX_MEMBERS)]] = Field(
        default_factory=dict,
        max_length=core_sweeps.MAX_PARAMS,
        description="name -> values; the members are the product",
    )
    array: Text | None = Field(
        default=None,
        max_length=core_sweeps.MAX_ARRAY_CHARS,
        description="Slurm's array form: 0-99, 1,3,5, 0-99:2, 0-99%10 (at most 10 at once)",
    )
    max_running: int | None = Field(
        default=None,
        ge=1,
        le=core_sweeps.MAX_MEMBERS,
        description="at most this many members hold GPUs at once (an array's %K)",
    )

    @model_validator(mode="after")
    def _members(self) -> SweepSubmit:
        if self.template.interactive:
            raise ValueError("template.interactive: a sweep's members are not sessions")
        # Cheap checks first: a hostile size is refused before anything is built.
        if self.array is not None and self.params:
            raise ValueError("give params or an array, not both")
        if self.array is None and not self.params:
            raise ValueError("give params (name -> values) or an array (e.g. 0-99)")
        try:
            if self.array is not None:
                spec = core_sweeps.parse_array(self.array)
                size = len(spec.indices)
                if spec.max_running is not None and self.max_running is not None:
                    raise ValueError("array: give the cap once, as %K or as max_running")
            else:
                size = core_sweeps.check_params(self.params)
            _check_template(self.template, list(self.params))
        except core_sweeps.SweepError as exc:
            raise ValueError(str(exc)) from None
        total = size * _member_bytes(self.template, self.params)
        if total > MAX_SWEEP_BYTES:
            raise ValueError(
                f"{size} members of this template would store about {total >> 20} MiB; "
                f"at most {MAX_SWEEP_BYTES >> 20} MiB (make the command or environment smaller)"
            )
        return self


class NotificationOut(BaseModel):
    """One attempt to deliver the job's end, or the sweep's (the URL is not shown: it may
    hold a secret)."""

    attempt: int
    at: datetime
    status: int | None
    error: str


class SweepOut(BaseModel):
    id: int
    name: str
    owner: str
    submitted_at: datetime
    size: int = Field(description="how many members it has")
    params: dict[str, list[str]]
    array: str | None
    max_running: int | None
    counts: dict[JobState, int] = Field(description="members by state (absent: none)")
    done: bool = Field(description="every member has ended")


class SweepMember(BaseModel):
    id: int = Field(description="the member's job id")
    index: int
    name: str
    params: dict[str, str]
    state: JobState
    reason: str
    exit_code: int | None
    exit_signal: int | None
    started_at: datetime | None
    ended_at: datetime | None
    metrics: dict[str, Any] | None = Field(
        description="its newest progress record (the final metrics once it has ended)"
    )


class SweepDetail(SweepOut):
    command: list[str] = Field(description="the template's command (or workload and args)")
    gpus: int
    sort: str | None = Field(description="the metric the members are sorted by, if any")
    members: list[SweepMember]
    notify: bool = Field(
        default=False, description="a URL is set to POST one message to once every member ended"
    )
    notifications: list[NotificationOut] = Field(
        default_factory=list, description="each attempt to deliver that message"
    )


class SweepList(BaseModel):
    items: list[SweepOut]
    total: int
    offset: int
    limit: int


class SweepAction(BaseModel):
    """What cancel, hold or release did to a sweep's members."""

    id: int
    changed: int = Field(description="members whose state changed now")
    stopping: int = Field(default=0, description="running members asked to stop (cancel)")
    detail: str
    counts: dict[JobState, int]


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


class JobOut(BaseModel):
    id: int
    name: str
    owner: str
    command: list[str]
    launcher: str
    gpus: int
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
    sweep_id: int | None = Field(default=None, description="the sweep this job is a member of")
    sweep_index: int | None = Field(default=None, description="its index in that sweep")
    gpu_mem: int | None = Field(
        default=None, description="bytes it asked to reserve on each GPU (null: whole GPUs)"
    )
    gpu_mem_auto: bool = Field(default=False, description="its reservation is learned (auto)")
    gpu_share: int | None = None
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


class DeviceList(BaseModel):
    items: list[DeviceOut]
    ports_leased: dict[int, int] = Field(
        default_factory=dict, description="rendezvous port -> job id"
    )


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


class ErrorOut(BaseModel):
    """Every error the API returns has this shape."""

    detail: str
    code: str


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
