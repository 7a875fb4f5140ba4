"""The batch script of one attempt: rendered by ddpq, submitted held, run by Slurm.

The script asks Slurm for what ddpq leased (nodes, GPUs per node, a time limit past ddpq's
own) and runs the job under ddpq's shim on the job's first node, the same shim that runs
local jobs: the job's output goes into ``output.log`` under the daemon's cap, SIGTERM is
followed by SIGKILL after the grace period, and the exit record (exit code or signal,
times) is written into the job's folder once the job's processes are gone. So a job's end
reads the same from either executor, Slurm or not: from ``exit.json``, exactly, even where
the cluster keeps no accounting. Slurm's own word (squeue, sacct) is needed only when the
shim could not write a record (a node failed, Slurm's time limit killed it).

A torchrun job is ``srun`` of torchrun, one per node, with the c10d rendezvous on the
first node at the port ddpq leased, after that port was test-bound there (``port_check``):
a port that something else took fails the attempt with EADDRINUSE in its log, and the
worker requeues the job on another port, as it does for local jobs.
"""

from __future__ import annotations

import hashlib
import math
import shlex
from dataclasses import dataclass
from pathlib import Path

from ddpq.config import Settings
from ddpq.core import slurm
from ddpq.executors.base import Launch, LaunchFailed
from ddpq.executors.contract import own_tmp
from ddpq.executors.local.shim_command import SHIM, shim_args
from ddpq.jobdir import JobDir

PORT_CHECK = Path(__file__).with_name("port_check.py")
# Slurm's time limit is in minutes and it may signal a job up to a minute before the time
# it was asked for: a spare minute keeps Slurm's limit a backstop behind ddpq's own.
SLURM_SLACK_S = 60


@dataclass(frozen=True)
class BatchJob:
    """Everything a batch script says, taken from a launch and the daemon's settings."""

    job_id: int
    attempt: int
    folder: JobDir
    cwd: str
    command: tuple[str, ...]
    torchrun: bool
    nodes: int
    gpus_per_node: int
    port: int | None
    time_limit_s: float | None
    grace_s: float
    log_cap: int
    python: str
    tag: str  # which daemon submitted it (the state folder's hash): see ``comment``
    partition: str | None = None
    account: str | None = None
    options: tuple[str, ...] = ()  # the daemon's extra #SBATCH options, then the job's
    tmp: Path | None = None  # the attempt's own TMPDIR, which the shim makes and removes


def daemon_tag(home: Path) -> str:
    """A short name for a state folder: two daemons on one cluster never take each other's
    jobs for their own."""
    return hashlib.sha256(str(home).encode()).hexdigest()[:10]


def job_name(job_id: int) -> str:
    """Slurm's name for a ddpq job, as squeue shows it to everyone: ``ddpq-7``."""
    return f"ddpq-{job_id}"


def comment(tag: str, job_id: int, attempt: int) -> str:
    """What tells one attempt's Slurm job from any other (a restarted worker that never
    stored the Slurm job id finds it by this)."""
    return f"ddpq:{tag}:{job_id}:{attempt}"


def batch_job(launch: Launch, settings: Settings) -> BatchJob:
    nodes = max(1, launch.spec.nodes)
    per_node = launch.spec.gpus_per_node
    if per_node is None:
        per_node = len(launch.gpus) // nodes
    return BatchJob(
        job_id=launch.job_id,
        attempt=launch.attempt,
        folder=JobDir(launch.job_dir),
        cwd=launch.spec.cwd,
        command=tuple(launch.spec.command),
        torchrun=launch.spec.launcher == "torchrun",
        nodes=nodes,
        gpus_per_node=per_node,
        port=launch.port,
        time_limit_s=launch.spec.time_limit_s,
        grace_s=settings.grace_s,
        log_cap=settings.log_cap_bytes,
        python=settings.python,
        tag=daemon_tag(settings.home),
        partition=launch.spec.partition or settings.slurm_partition,
        account=settings.slurm_account,
        options=(*settings.slurm_options, *job_options(launch, settings)),
        tmp=own_tmp(launch),
    )


def job_options(launch: Launch, settings: Settings) -> tuple[str, ...]:
    """The job's own options, checked again against the settings of the daemon that runs it
    (a job queued before an admin narrowed them, or stored by an older ddpq): raises
    LaunchFailed naming one that users may not set."""
    try:
        return slurm.user_options(
            launch.spec.slurm_options, settings.slurm_user_options, settings.slurm_options
        )
    except slurm.SlurmOptionError as exc:
        raise LaunchFailed(f"--slurm-opt {exc}") from None


def slurm_limits(time_limit_s: float | None, grace_s: float) -> tuple[int | None, int]:
    """Slurm's time limit in minutes (None: the partition's) and ``--signal``'s lead.

    ddpq stops a job itself at its limit L (SIGTERM, SIGKILL after the grace G). Slurm's
    limit is the backstop for a daemon that is down: at least L + 2G + a minute, so that
    its SIGTERM to the shim, sent G seconds before the end (and up to a minute early, as
    Slurm may), still comes after L + G, and leaves the job G seconds to checkpoint.
    """
    lead = max(1, math.ceil(grace_s))
    if time_limit_s is None:
        return None, lead
    minutes = math.ceil((time_limit_s + 2 * lead + SLURM_SLACK_S) / 60)
    return minutes, lead


def sbatch_lines(job: BatchJob) -> list[str]:
    """The ``#SBATCH`` options: the daemon's and the job's own extras, then ddpq's own, the
    partition and the account. The extras are checked never to name ddpq's; written first
    all the same, as for sbatch a later option overrides an earlier one."""
    minutes, lead = slurm_limits(job.time_limit_s, job.grace_s)
    lines = [
        *job.options,
        f"--job-name={job_name(job.job_id)}",
        f"--comment={comment(job.tag, job.job_id, job.attempt)}",
        f"--output={job.folder.slurm_output}",
        "--open-mode=append",
        # The batch step starts in the job's folder, which exists; the shim enters the
        # job's own directory as the job's account, and says so if it cannot.
        f"--chdir={job.folder.path}",
        # ddpq decides what a failed attempt means: Slurm must not rerun it by itself.
        "--no-requeue",
        f"--nodes={job.nodes}",
        "--ntasks-per-node=1",
        # The shim gets SIGTERM this long before Slurm's time limit kills the job.
        f"--signal=B:TERM@{lead}",
    ]
    if job.gpus_per_node > 0:
        lines.append(f"--gres=gpu:{job.gpus_per_node}")
    if minutes is not None:
        lines.append(f"--time={minutes}")
    if job.partition:
        lines.append(f"--partition={job.partition}")
    if job.account:
        lines.append(f"--account={job.account}")
    return lines


def job_command(job: BatchJob) -> list[str]:
    """The job's command line as shell words (quoted, but for ``$MASTER_ADDR``): what the
    shim runs on the first node."""
    words = [shlex.quote(w) for w in job.command]
    if job.torchrun:
        ranks = max(1, job.gpus_per_node)
        assert job.port is not None, "a torchrun job always leases a port"
        run_id = f"ddpq-{job.job_id}-{job.attempt}"
        torchrun = [
            *("srun", f"--nodes={job.nodes}", "--ntasks-per-node=1", "--kill-on-bad-exit=1"),
            *(shlex.quote(job.python), "-m", "torch.distributed.run"),
            *("--nnodes", str(job.nodes), "--nproc-per-node", str(ranks)),
            *("--rdzv-backend", "c10d", "--rdzv-endpoint", f'"$MASTER_ADDR":{job.port}'),
            *("--rdzv-id", run_id, "--max-restarts", "0"),
        ]
        words = torchrun + words
    if job.port is not None:
        check = [shlex.quote(job.python), "-S", shlex.quote(str(PORT_CHECK)), str(job.port)]
        words = check + words
    return words


def _wrapped(words: list[str], width: int = 88) -> list[str]:
    """Shell words joined into lines of about ``width`` (continued with backslashes)."""
    lines: list[str] = []
    for word in words:
        if lines and len(lines[-1]) + 1 + len(word) <= width:
            lines[-1] += f" {word}"
        else:
            lines.append(word)
    return lines


def render(job: BatchJob) -> str:
    """The whole batch script."""
    folder = job.folder
    ranks = max(1, job.gpus_per_node)
    shim = [shlex.quote(job.python), "-S", shlex.quote(str(SHIM))]
    shim += [shlex.quote(a) for a in shim_args(folder, job.cwd, job.grace_s, job.log_cap, job.tmp)]
    lines = [
        "#!/bin/bash",
        f"# ddpq job {job.job_id}, attempt {job.attempt}, as ddpq rendered it: submitted held,",
        "# released once ddpq had stored its Slurm job id. What follows runs on the first node.",
        *(f"#SBATCH {option}" for option in sbatch_lines(job)),
        "set -u",
    ]
    if job.nodes > 1:
        lines += [
            "# The first node: torchrun's rendezvous listens there, on the port ddpq leased.",
            'head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
            "addr=$(scontrol -o show node \"$head\" | tr ' ' '\\n' | sed -n 's/^NodeAddr=//p')",
            'export MASTER_ADDR="${addr:-$head}"',
        ]
    lines += [
        "# Cores divided among the node's ranks, unless the job set its own.",
        'if [ -z "${OMP_NUM_THREADS:-}" ]; then',
        f"  OMP_NUM_THREADS=$(( ${{SLURM_CPUS_ON_NODE:-1}} / {ranks} ))",
        '  [ "$OMP_NUM_THREADS" -ge 1 ] || OMP_NUM_THREADS=1',
        "  export OMP_NUM_THREADS",
        "fi",
        "# ddpq's shim runs the job in a session of its own (it must lead one); this shell",
        "# hands Slurm's signals on to it (scancel --batch, --signal=B:) and waits it out.",
        " \\\n    ".join(_wrapped(["setsid", *shim, *job_command(job), "&"])),
        "shim=$!",
        "trap 'kill -TERM \"$shim\" 2>/dev/null' TERM INT HUP",
        "while :; do",
        '  wait "$shim"; rc=$?',
        '  kill -0 "$shim" 2>/dev/null || break',
        "done",
        'exit "$rc"',
    ]
    return "\n".join(lines) + "\n"
