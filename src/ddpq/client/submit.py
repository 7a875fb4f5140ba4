"""`ddpq submit`: its options (Typer's declarations), and the words of what runs.

The steps from the options to the job's id on stdout are ``client.submitting``'s (no Typer
there: ``client.quick`` runs them too); they are re-exported here under their old names.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from ddpq.client.coercion import QuickCommand
from ddpq.client.common import fail
from ddpq.client.submitting import Checked as Checked
from ddpq.client.submitting import check_options as check_options
from ddpq.client.submitting import job_fields as job_fields
from ddpq.client.submitting import send as send
from ddpq.client.submitting import show_submitted as show_submitted
from ddpq.client.submitting import submit_with as submit_with
from ddpq.client.submitting import sweep_body as sweep_body

GpusOpt = Annotated[
    str,
    typer.Option(
        "--gpus",
        "-g",
        metavar="N|MIN-MAX",
        help="number of GPUs, or a range for an elastic job that grows and shrinks "
        "between MIN and MAX at its checkpoints (docs/elastic.md)",
    ),
]
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
GpuMemOpt = Annotated[
    str | None,
    typer.Option(
        "--gpu-mem",
        metavar="SIZE|auto",
        help="share GPUs by memory: reserve SIZE (10G, 512M) on each GPU instead of taking "
        "it whole, or auto: what earlier runs of this job (same --name, else same command) "
        "were measured to use, plus a margin (a whole GPU until one has run)",
    ),
]
GpuShareOpt = Annotated[
    int | None,
    typer.Option("--gpu-share", metavar="N", help="with --gpu-mem: at most N jobs on its GPU"),
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
    gpus: GpusOpt = "0",
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
    gpu_mem: GpuMemOpt = None,
    gpu_share: GpuShareOpt = None,
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
    from ddpq.client.quick import refuse_option_after_command
    from ddpq.workloads.registry import WORKLOADS

    refuse_option_after_command(sys.argv[1:])
    argv = command_words(ctx)
    params = dict(ctx.params)
    if argv[0] not in WORKLOADS and (script := batch.script_of(argv[0])) is not None:
        params, argv = batch.with_directives(ctx, script), script.command(argv[1:])
    submit_with(argv, params)


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


def register(app: typer.Typer) -> None:
    """Add `ddpq submit` to the client's app; what follows its options is the job's."""
    settings = {"allow_extra_args": True, "ignore_unknown_options": True}
    app.command("submit", cls=QuickCommand, context_settings=settings)(submit)
