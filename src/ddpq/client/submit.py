"""`ddpq submit`: its options, and the steps from them to the job's id on stdout.

The steps, each a function: what runs (a command after ``--``, or a workload and its
options), the options the CLI checks itself (``--env``, ``--export``, ``--after``,
``--gpu-mem``, ``--time-limit``), the body sent (one job, or a sweep with ``--sweep`` or
``--array``), sending it (a 422 is bad usage, said as the options: ``client.submission``),
and printing what the daemon answered. Only what differs from the API's defaults travels.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer

from ddpq.client import sharing
from ddpq.client.api import DdpqError
from ddpq.client.coercion import QuickCommand
from ddpq.client.common import client, fail, print_json

GpusOpt = Annotated[int, typer.Option("--gpus", "-g", help="number of GPUs")]
NameOpt = Annotated[str | None, typer.Option("--name", "-n")]
PriorityOpt = Annotated[int, typer.Option(help="higher starts first")]
TimeLimitOpt = Annotated[str | None, typer.Option(help="e.g. 30m, 2h; then timed_out")]
RetriesOpt = Annotated[int, typer.Option(help="requeue a failed job up to N times")]
AfterOpt = Annotated[
    list[str] | None,
    typer.Option(
        help="start only after job ID (or every member of sweep sN) succeeded (repeatable)"
    ),
]
DependencyOpt = Annotated[
    str | None,
    typer.Option(
        metavar="KIND:ID[:ID...],...",
        help="as sbatch's: afterok, afterany (ended), afternotok (ended without success) "
        "on job IDs or sweeps sN, and singleton (after earlier jobs of your name ended); "
        "one that can never be met cancels the job",
    ),
]
HoldOpt = Annotated[bool, typer.Option(help="queue it held until `ddpq release`")]
EnvOpt = Annotated[list[str] | None, typer.Option("--env", "-e", help="KEY=VALUE, over --export")]
ExportOpt = Annotated[
    str,
    typer.Option(
        metavar="ALL|NONE|NAME,...",
        help="which of your environment variables the job gets: ALL, NONE (a minimal "
        "PATH, HOME, USER, LOGNAME, LANG) or NAME,NAME,... (those and the minimal ones); "
        "never terminal-only ones (SSH_AUTH_SOCK, DISPLAY, TERM, ...) nor ddpq's own",
    ),
]
TorchrunOpt = Annotated[
    bool, typer.Option(help="run CMD (a script) under torchrun on the leased GPUs and port")
]
CwdOpt = Annotated[Path | None, typer.Option(help="working directory (default: here)")]
NotifyOpt = Annotated[
    str | None, typer.Option(metavar="URL", help="POST a JSON message here when it ends")
]
PreemptibleOpt = Annotated[
    bool, typer.Option(help="it may be asked to checkpoint and requeue (docs/preemption.md)")
]
PreemptSignalOpt = Annotated[
    str | None, typer.Option(metavar="SIG", help="the signal that asks it (default USR1)")
]
SweepOpt = Annotated[
    list[str] | None,
    typer.Option(
        metavar="NAME=V1,V2,...",
        help="queue one job per combination (repeatable; {NAME} in a command)",
    ),
]
ArrayOpt = Annotated[
    str | None,
    typer.Option(metavar="0-99[:STEP][%K]", help="an array of jobs ({index} in a command)"),
]
MaxRunningOpt = Annotated[
    int | None, typer.Option(help="at most this many of the sweep's jobs at once")
]
NodesOpt = Annotated[int | None, typer.Option(help="Slurm: hosts it spans")]
GpusPerNodeOpt = Annotated[int | None, typer.Option(help="Slurm: GPUs on each node (with --nodes)")]
PartitionOpt = Annotated[str | None, typer.Option(help="Slurm: the partition")]
SlurmOpt = Annotated[
    list[str] | None,
    typer.Option(metavar="--NAME=VALUE", help="Slurm: an extra #SBATCH option (repeatable)"),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="print the job as JSON")]
GpuLinkOpt = Annotated[
    str | None,
    typer.Option(
        metavar="CLASS",
        help="its GPUs must be joined by this link or better: nvlink, pix, pxb, phb, node, "
        "sys (ddpq gpus --topology); it waits for such a set",
    ),
]
GpuTypeOpt = Annotated[
    str | None,
    typer.Option(
        metavar="NAME", help="GPUs whose model contains NAME (A100), or MIG instances (1g.10gb)"
    ),
]
CpusOpt = Annotated[
    int | None,
    typer.Option(
        metavar="N",
        help="CPU cores it leases and runs confined to (default: 1 without GPUs, the "
        "daemon's share per GPU with them)",
    ),
]
MemOpt = Annotated[
    str | None,
    typer.Option(
        metavar="SIZE",
        help="host memory it holds and is limited to, as 4G or 512M (default: the daemon's)",
    ),
]


def submit(
    ctx: typer.Context,
    gpus: GpusOpt = 0,
    name: NameOpt = None,
    priority: PriorityOpt = 0,
    time_limit: TimeLimitOpt = None,
    retries: RetriesOpt = 0,
    after: AfterOpt = None,
    hold: HoldOpt = False,
    env: EnvOpt = None,
    export: ExportOpt = "ALL",
    torchrun: TorchrunOpt = False,
    cwd: CwdOpt = None,
    notify: NotifyOpt = None,
    preemptible: PreemptibleOpt = False,
    preempt_signal: PreemptSignalOpt = None,
    sweep: SweepOpt = None,
    array: ArrayOpt = None,
    max_running: MaxRunningOpt = None,
    nodes: NodesOpt = None,
    gpus_per_node: GpusPerNodeOpt = None,
    partition: PartitionOpt = None,
    slurm_opt: SlurmOpt = None,
    as_json: JsonOpt = False,
    gpu_mem: sharing.GpuMemOpt = None,
    gpu_share: sharing.GpuShareOpt = None,
    gpu_link: GpuLinkOpt = None,
    gpu_type: GpuTypeOpt = None,
    cpus: CpusOpt = None,
    mem: MemOpt = None,
    dependency: DependencyOpt = None,
) -> None:
    """Queue a job: `ddpq submit --gpus 2 -- python train.py` or `ddpq submit resnet18 --gpus 2`.

    The job runs with your environment (your venv's or conda env's python, PYTHONPATH,
    your variables; see --export) in this directory. Built-in workloads take their own
    options after the name, e.g. `ddpq submit resnet18 --gpus 2 --epochs 5 --synthetic 5000`.
    With --sweep or --array it queues a sweep (printed as sN): `--sweep lr=0.05,0.1`
    gives a workload `--lr 0.05` and `--lr 0.1`, a command `{lr}`.
    """
    from ddpq.client import batch
    from ddpq.workloads.registry import WORKLOADS

    argv = command_words(ctx)
    params = dict(ctx.params)
    if argv[0] not in WORKLOADS and (script := batch.script_of(argv[0])) is not None:
        params, argv = batch.with_directives(ctx, script), script.command(argv[1:])
    submit_with(argv, params)


def submit_with(argv: list[str], o: dict[str, Any]) -> None:
    """The submission ``argv`` and ``submit``'s parameters ``o`` (by name) ask for."""
    checked = check_options(
        o["env"] or [], o["export"], o["after"] or [], o["gpu_mem"], o["gpu_share"]
    )
    # Left out when not given, as every option; a 0 or an empty size would be too.
    if o["cpus"] is not None and o["cpus"] < 1:
        fail(f"--cpus: {o['cpus']} is not a number of cores (1 or more)", 2)
    if o["mem"] is not None and not o["mem"].strip():
        fail("--mem: give a size, as 4G or 512M", 2)
    plain = {
        name: o[name]
        for name in (
            "gpus",
            "name",
            "priority",
            "retries",
            "hold",
            "torchrun",
            "notify",
            "preemptible",
            "preempt_signal",
            "nodes",
            "gpus_per_node",
            "partition",
            "gpu_link",
            "gpu_type",
            "cpus",
            "mem",
            "dependency",
        )
    }
    plain["slurm_options"] = o["slurm_opt"] or []
    fields = job_fields(argv, plain, checked, o["cwd"], o["time_limit"])
    many = bool(o["sweep"]) or o["array"] is not None
    if o["max_running"] is not None and not many:
        fail("--max-running: only with --sweep or --array", 2)
    body = sweep_body(fields, o["sweep"] or [], o["array"], o["max_running"]) if many else fields
    show_submitted(send(body, many, fields.get("workload")), many, o["as_json"])


# ---- the steps --------------------------------------------------------------------------


@dataclass
class Checked:
    """The options the CLI reads itself, as the API's fields."""

    env: dict[str, str]
    exported_env: dict[str, str]
    after: list[int] = field(default_factory=list)
    after_sweeps: list[int] = field(default_factory=list)
    memory: dict[str, Any] = field(default_factory=dict)


def command_words(ctx: typer.Context) -> list[str]:
    """What the job runs: the words after submit's own options (bad usage if none, or if
    the first is an option submit does not have: a misspelt one)."""
    from ddpq.client import submission
    from ddpq.client.format import sanitize

    argv = list(ctx.args)
    if not argv:
        fail("nothing to run: give a command after `--` or a workload name", 2)
    if argv[0].startswith("-"):
        known = [o for p in ctx.command.params for o in p.opts if o.startswith("--")]
        fail(sanitize(submission.unknown_option(argv[0], known)), 2)
    return argv


def check_options(
    env: list[str], export: str, after: list[str], gpu_mem: str | None, gpu_share: int | None
) -> Checked:
    """``--env``, ``--export``, ``--after``, ``--gpu-mem`` and ``--gpu-share`` read (bad
    usage where one cannot be); a warning for the variables ``--export`` leaves out."""
    from ddpq.client import submission
    from ddpq.client import sweeps as sweep_cli
    from ddpq.client.format import sanitize

    try:
        env_map = submission.env_pairs(env)
        exported, undecodable = submission.exported_env(export, os.environ)
        waits = sweep_cli.parse_refs(after)
        memory = sharing.submit_fields(gpu_mem, gpu_share)
    except (submission.BadOption, sweep_cli.BadRef, sharing.BadOption) as exc:
        fail(sanitize(str(exc)), 2)
    if undecodable:
        typer.echo(
            "ddpq: warning: left out of the job's environment (not UTF-8): "
            + sanitize(", ".join(undecodable)),
            err=True,
        )
    return Checked(
        env=env_map,
        exported_env=exported,
        after=[r.id for r in waits if not r.sweep],
        after_sweeps=[r.id for r in waits if r.sweep],
        memory=memory,
    )


def job_fields(
    argv: list[str],
    plain: dict[str, Any],
    checked: Checked,
    cwd: Path | None,
    time_limit: str | None,
) -> dict[str, Any]:
    """The job's fields: the options given (those at their default left out, as
    ``exclude_defaults`` would), the folder, the environment, and what runs."""
    from ddpq.client.format import sanitize
    from ddpq.core.units import parse_duration
    from ddpq.workloads.registry import WORKLOADS

    given = {
        **plain,
        "after": checked.after,
        "after_sweeps": checked.after_sweeps,
        "env": checked.env,
    }
    fields = {k: v for k, v in given.items() if v}
    fields.update(checked.memory)
    fields["cwd"] = str((cwd or Path.cwd()).resolve())
    fields["exported_env"] = checked.exported_env
    if argv[0] in WORKLOADS and "--" not in sys.argv:
        fields.update(workload=argv[0], args=argv[1:])
        fields.pop("torchrun", None)
    else:
        fields["command"] = argv
    # `is not None`: an explicitly empty `--time-limit ""` (an unset shell variable) is a
    # mistake to report, not a request for no limit.
    if time_limit is not None:
        try:
            fields["time_limit_s"] = parse_duration(time_limit)
        except ValueError as exc:
            fail(f"--time-limit: {sanitize(str(exc))}", 2)
    return fields


def sweep_body(
    fields: dict[str, Any], sweep: list[str], array: str | None, max_running: int | None
) -> dict[str, Any]:
    """The sweep of ``fields`` that ``--sweep``/``--array`` ask for (bad usage if unreadable)."""
    from ddpq.client import sweeps as sweep_cli
    from ddpq.client.format import sanitize

    try:
        return sweep_cli.sweep_body(fields, sweep, array, max_running)
    except sweep_cli.BadRef as exc:
        fail(sanitize(str(exc)), 2)


def send(body: dict[str, Any], many: bool, workload: str | None) -> dict[str, Any]:
    """The daemon's answer to the submission: the job, or the sweep."""
    from ddpq.client import submission

    with client() as c:
        try:
            out: dict[str, Any] = c.submit_sweep(body) if many else c.submit(body)
        except DdpqError as exc:
            if exc.status != 422:
                raise
            # The daemon validates submissions: a 422 is bad usage, said as the options.
            fail(submission.refusal(exc.detail, workload), 2)
    return out


def show_submitted(out: dict[str, Any], many: bool, as_json: bool) -> None:
    """The job's id (the sweep's, sN), or the daemon's whole answer with ``--json``."""
    from ddpq.client.sweeps import SWEEP_PREFIX

    if as_json:
        print_json(out)
    else:
        typer.echo(f"{SWEEP_PREFIX}{out['id']}" if many else out["id"])


def register(app: typer.Typer) -> None:
    """Add `ddpq submit` to the client's app; what follows its options is the job's."""
    settings = {"allow_extra_args": True, "ignore_unknown_options": True}
    app.command("submit", cls=QuickCommand, context_settings=settings)(submit)
