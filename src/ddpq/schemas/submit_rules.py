"""The rules of a submission (``JobSubmit``) as plain functions: each takes a field's value
(or the whole submission, for rules across fields) and returns it or raises ValueError with
the message the API answers with. The model's validators call them in its field order."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ddpq.core import dependency_text, hostres, jobenv, sharing
from ddpq.core import slurm as core_slurm
from ddpq.core.deps import Kind
from ddpq.core.interactive import uses_port
from ddpq.core.topology import TopologyError, required_class
from ddpq.core.units import parse_size, size_for_people
from ddpq.schemas.common import (
    ENV_KEY_RE,
    MAX_ARG_LEN,
    MAX_COMMAND_BYTES,
    MAX_ENV_BYTES,
    MAX_ENV_VALUE,
    MAX_ENV_VARS,
    NAME_RE,
    NAME_RULE,
)

if TYPE_CHECKING:
    from ddpq.schemas.submit import JobSubmit


# ---- one field at a time ---------------------------------------------------------------


GPU_TYPE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9 ._+-]{0,63}")


def check_gpu_link(v: str | None) -> str | None:
    """``nvlink``/``pix``/... to the class stored (``NV``, ``PIX``, ...)."""
    if v is None:
        return None
    try:
        return required_class(v)
    except TopologyError as exc:
        raise ValueError(str(exc).replace("unknown --gpu-link", "no link class:")) from None


def check_gpu_type(v: str | None) -> str | None:
    if v is not None and not GPU_TYPE_RE.fullmatch(v):
        raise ValueError(
            "a model name or MIG profile: 1-64 letters, digits, spaces, '.', '_', '+', '-'"
        )
    return v


def hardware_refusal(
    gpus: int, nodes: int, gpu_link: str | None, gpu_type: str | None
) -> str | None:
    """Why a job may not ask for this link or type on these GPUs (None: it may). Checked
    at submission and again when ``ddpq update`` changes its GPUs."""
    if gpu_link is not None and gpus < 2:
        return "gpu_link: only for a job on 2 or more GPUs (a link joins two)"
    if (gpu_type is not None or gpu_link is not None) and nodes > 1:
        return "gpu_link, gpu_type: a job on this host's GPUs only (nodes of 1)"
    return None


def session_port_refusal(interactive: bool, gpus: int, command: Sequence[str]) -> str | None:
    """A session whose command names ``{port}`` needs one, and only GPU jobs lease ports."""
    if interactive and gpus == 0 and uses_port(command):
        return "command: {port} needs a leased port, which only jobs on GPUs get"
    return None


def check_hardware(job: JobSubmit) -> None:
    why = hardware_refusal(job.gpus, job.nodes, job.gpu_link, job.gpu_type)
    if why is not None:
        raise ValueError(why)


def check_partition(v: str | None) -> str | None:
    if v is not None and not core_slurm.SLURM_NAME.match(v):
        raise ValueError("a Slurm name: letters, digits, '.', '_', '+', '-' (',' lists)")
    return v


def check_slurm_options(v: list[str]) -> list[str]:
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


def check_gpu_mem(v: int | str | None) -> int | str | None:
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


def check_mem(v: int | str | None) -> int | None:
    """``mem``: bytes or a size as people write it, within what a cgroup can hold."""
    if v is None:
        return None
    if isinstance(v, str):
        v = parse_size(v)  # its ValueError says what is wrong, for the 422
    if not hostres.MIN_RAM <= v <= hostres.MAX_RAM:
        raise ValueError(f"must be between {size_for_people(hostres.MIN_RAM)} and 1P")
    return v


def check_name(v: str | None) -> str | None:
    if v is not None and not NAME_RE.match(v):
        raise ValueError(NAME_RULE)
    return v


def check_argv(v: list[str]) -> list[str]:
    for arg in v:
        if len(arg) > MAX_ARG_LEN:
            raise ValueError(f"an argument is longer than {MAX_ARG_LEN} characters")
        if "\x00" in arg:
            raise ValueError("an argument contains a NUL byte")
    if sum(len(a) for a in v) > MAX_COMMAND_BYTES:
        raise ValueError(f"is longer than {MAX_COMMAND_BYTES} characters in all")
    return v


def check_cwd(v: str | None) -> str | None:
    if v is not None and ("\x00" in v or not v.startswith("/")):
        raise ValueError("must be an absolute path without NUL bytes")
    return v


def check_env(v: dict[str, str]) -> dict[str, str]:
    for key, value in v.items():
        if not ENV_KEY_RE.match(key):
            raise ValueError(f"{key!r} is not a valid variable name")
        if jobenv.is_reserved(key):
            raise ValueError(f"{key} is set by ddpq for every job and cannot be overridden")
        check_value(key, value)
    return v


def check_exported_env(v: dict[str, str]) -> dict[str, str]:
    for key, value in v.items():
        if not jobenv.is_exportable_name(key):
            raise ValueError(
                f"{key[:64]!r} is not a variable name (empty, '=', a NUL byte, "
                f"or longer than {jobenv.MAX_ENV_KEY})"
            )
        check_value(key, value)
    # Silently: a shell's MASTER_PORT or TERM is no mistake of the submitter's.
    return jobenv.without_left_out(v)


def check_value(key: str, value: str) -> None:
    # Names only in these messages, never values: an environment holds secrets.
    if "\x00" in value:
        raise ValueError(f"{key} contains a NUL byte")
    if len(value.encode()) > MAX_ENV_VALUE:
        raise ValueError(f"{key} is longer than {MAX_ENV_VALUE // 1024} KiB")


# ---- across fields ---------------------------------------------------------------------


def gpus_over_nodes(gpus: int, nodes: int, gpus_per_node: int | None) -> int:
    """The job's GPUs in all: ``nodes x gpus_per_node`` when that is given."""
    if gpus_per_node is not None:
        total = nodes * gpus_per_node
        if gpus not in (0, total):
            raise ValueError(
                f"gpus: {gpus}, but {nodes} nodes of {gpus_per_node} GPUs "
                f"are {total}; give one or the other"
            )
        return total
    if nodes > 1:
        raise ValueError("gpus_per_node: a job on several nodes says how many GPUs on each")
    return gpus


def check_sharing(job: JobSubmit) -> None:
    if job.gpu_mem is None:
        if job.gpu_share is not None:
            raise ValueError("gpu_share: only a job that shares GPUs by memory (gpu_mem)")
        return
    if job.nodes > 1 or job.gpus_per_node is not None:
        # A share is of a GPU on this host: a job spanning nodes takes them whole.
        raise ValueError("gpu_mem: a job on several nodes (nodes, gpus_per_node) cannot share")


def check_env_size(job: JobSubmit) -> None:
    # Counted as stored: the variables the job gets from the submission, in all.
    merged = {**(job.exported_env or {}), **job.env}
    field = "exported_env" if job.exported_env else "env"
    if len(merged) > MAX_ENV_VARS:
        raise ValueError(f"{field}: more than {MAX_ENV_VARS} variables")
    # In UTF-8 bytes, as the kernel counts them.
    size = sum(len(k.encode()) + len(x.encode()) for k, x in merged.items())
    if size > MAX_ENV_BYTES:
        raise ValueError(
            f"{field}: {size // 1024} KiB of variables, more than {MAX_ENV_BYTES // 1024} KiB"
        )


def check_session(job: JobSubmit) -> None:
    if not job.interactive:
        if job.idle_s is not None:
            raise ValueError("idle_s: only an interactive session is ended when idle")
        return
    refused = [
        (job.workload is not None, "workload", "a session runs a command, not a workload"),
        (job.torchrun, "torchrun", "a session is not run under torchrun"),
        (job.preemptible, "preemptible", "a session cannot be preempted"),
        (job.retries > 0, "retries", "a session is not retried"),
    ]
    for wrong, field, why in refused:
        if wrong:
            raise ValueError(f"{field}: {why}")
    refusal = session_port_refusal(job.interactive, job.gpus, job.command)
    if refusal is not None:
        raise ValueError(refusal)


def check_elastic(job: JobSubmit) -> int | None:
    """An elastic job's most GPUs (None: not elastic; a range of one size is not). It needs
    at least one GPU, whole GPUs on this host, and the preemption contract it is resized
    through: a session, a job that shares GPUs by memory, one on several nodes, or one
    that says it is not preemptible cannot be elastic."""
    top = job.gpus_max
    if top is None or top == job.gpus:
        return None
    if job.gpus < 1:
        raise ValueError(
            f"gpus_max: the range {job.gpus}-{top} starts at 0; an elastic job needs 1"
        )
    if top < job.gpus:
        raise ValueError(f"gpus_max: the range {job.gpus}-{top} ends below its start")
    refused = [
        (job.interactive, "a session cannot be resized"),
        (job.gpu_mem is not None, "a job sharing GPUs by memory (gpu_mem) cannot be resized"),
        (job.nodes > 1 or job.gpus_per_node is not None, "a job on several nodes is not resized"),
        (
            "preemptible" in job.model_fields_set and not job.preemptible,
            "an elastic job is resized through the preemption signal: it is preemptible",
        ),
    ]
    for wrong, why in refused:
        if wrong:
            raise ValueError(f"gpus_max: {why}")
    return top


def check_command_or_workload(job: JobSubmit) -> None:
    if job.workload is None:
        if not job.command:
            raise ValueError("command: give a command to run (it is empty)")
        if not job.command[0].strip():
            raise ValueError("command: the program name is empty")
        if job.args:
            raise ValueError("args: only a workload takes args; put them in the command")
    elif job.command:
        raise ValueError("give either a command or a workload, not both")


def check_dependency(value: str | None) -> str | None:
    """Slurm's ``--dependency`` text, read by ``core.dependency_text`` (its reason if not)."""
    if value is None:
        return None
    try:
        dependency_text.parse(value)
    except ValueError as exc:
        raise ValueError(f"dependency: {exc}") from None
    return value


def spec_waits(job: JobSubmit) -> dict[str, Any]:
    """The ``JobSpec`` dependency fields of ``job``: ``after`` and ``after_sweeps`` with
    the dependency's afterok ones, and the other kinds; a job or sweep named under two
    kinds is refused."""
    parsed = dependency_text.parse(job.dependency) if job.dependency else None
    jobs = dict.fromkeys(job.after, Kind.OK)
    sweeps = dict.fromkeys(job.after_sweeps, Kind.OK)
    if parsed is not None:
        for into, more, mark in ((jobs, parsed.jobs, ""), (sweeps, parsed.sweeps, "s")):
            for i, kind in more.items():
                if into.setdefault(i, kind) is not kind:
                    raise ValueError(f"dependency: {mark}{i} is named as both afterok and {kind}")
    out: dict[str, Any] = {"singleton": parsed is not None and parsed.singleton}
    for kind, (field, sweep_field) in _FIELDS.items():
        out[field] = tuple(sorted(i for i, k in jobs.items() if k is kind))
        out[sweep_field] = tuple(sorted(i for i, k in sweeps.items() if k is kind))
    return out


_FIELDS = {
    Kind.OK: ("after", "after_sweeps"),
    Kind.ANY: ("after_any", "after_any_sweeps"),
    Kind.NOTOK: ("after_notok", "after_notok_sweeps"),
}
