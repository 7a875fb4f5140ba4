"""Sweeps on the wire: many jobs submitted in one call (a template and what varies), and
what the API says about them."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ddpq.core import sweeps as core_sweeps
from ddpq.core.states import JobState
from ddpq.schemas.common import MAX_COMMAND_BYTES, Text
from ddpq.schemas.jobs import NotificationOut
from ddpq.schemas.submit import JobSubmit

# A sweep's members store their command and environment each: bound the whole, not only
# each part (10,000 members of a 64 KiB command would be 640 MB in the database).
MAX_SWEEP_BYTES = 64 * 1024 * 1024


def _member_bytes(t: JobSubmit, params: dict[str, list[str]], filled: int) -> int:
    """A bound on what one member stores: its command and args filled with the longest
    values (``filled``: ``core_sweeps.filled_bytes``), its environment, each parameter in
    DDPQ_SWEEP_PARAMS and as a workload's option, some JSON."""
    base = filled + 4 * (len(t.command) + len(t.args))
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
        # A member's command filled, within what one job may have: the template's is
        # checked before its placeholders are filled, and a value used many times multiplies.
        filled = core_sweeps.filled_bytes(
            [*self.template.command, *self.template.args], self.params
        )
        if filled > MAX_COMMAND_BYTES:
            raise ValueError(
                f"template.command: filled with the longest values a member's command would "
                f"be {filled} characters; at most {MAX_COMMAND_BYTES}"
            )
        total = size * _member_bytes(self.template, self.params, filled)
        if total > MAX_SWEEP_BYTES:
            raise ValueError(
                f"{size} members of this template would store about {total >> 20} MiB; "
                f"at most {MAX_SWEEP_BYTES >> 20} MiB (make the command or environment smaller)"
            )
        return self


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
