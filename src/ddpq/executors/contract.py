"""The job contract: the environment and command line every executor gives a job.

A job's environment, from first to last (a later one wins):

1. its starting point: the daemon's own environment (less the daemon's ``DDPQ_*``), or,
   for a job whose submitter exported theirs (``ddpq submit``, ``--export``), that one,
   with ``PATH`` (``/usr/local/bin:/usr/bin:/bin``), ``HOME``, ``USER`` and ``LOGNAME``
   filled in where it lacks them (the last three of the daemon's account, which runs the
   job unless the executor switches to another: it then sets that account's);
2. ``OMP_NUM_THREADS`` and ``MKL_NUM_THREADS``, unless the job already has them: its
   leased cores (``Launch.cores``) split among its ranks (torchrun's, one per GPU), or,
   for a job that leased none, the host's cores divided among the GPUs;
3. the submission's ``env``;
4. the contract itself: ``CUDA_VISIBLE_DEVICES``, ``CUDA_DEVICE_ORDER``, ``MASTER_ADDR``,
   ``MASTER_PORT``, ``DDPQ_JOB_ID``, ``DDPQ_JOB_DIR``, ``DDPQ_ATTEMPT``,
   ``PYTHONUNBUFFERED``; ``DDPQ_GPU_MEM`` for a job that shares its GPUs; for a session,
   ``TERM`` (the one it was given, or a common one); ``TMPDIR``, the attempt's own
   temporary folder in the job's folder (``own_tmp``), unless the submission set one.

A session's command (``Launch.spec.interactive``) has ``{port}`` replaced by its leased port.

The submission's variables arrive in one stored mapping (``core.jobenv.pack``).
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Mapping
from pathlib import Path

from ddpq.core import hostres, jobenv
from ddpq.core.disposition import REQUEUE_EXIT
from ddpq.core.interactive import fill_port
from ddpq.core.sweeps import MEMBER_ENV_NAMES
from ddpq.executors.base import Launch
from ddpq.jobdir import JobDir

SESSION_TERM = "xterm-256color"
# The thread pools sized to the job's cores (OpenMP, and MKL where it does not read OMP's).
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def threads_per_rank(cpu_count: int, total_gpus: int) -> int:
    """Cores divided among the most ranks this host can run at once, at least 1."""
    return max(1, cpu_count // max(1, total_gpus))


def starting_env(submitted: Mapping[str, str], daemon_env: Mapping[str, str]) -> dict[str, str]:
    """Step 1 and 3 above: where a job's environment starts, with its submitted variables."""
    exported, variables = jobenv.unpack(submitted)
    if not exported:
        # Variables of the daemon's own that must not leak into a job.
        env = {k: v for k, v in daemon_env.items() if not k.startswith("DDPQ_")}
        return {**env, **variables}
    env = {"PATH": jobenv.MINIMAL_PATH, **account_env(daemon_env)}
    # Left out already by the CLI and the API; again here, for rows stored before.
    env.update(jobenv.without_left_out(variables))
    env.update({k: v for k, v in variables.items() if k in MEMBER_ENV_NAMES})
    return env


def account_env(daemon_env: Mapping[str, str]) -> dict[str, str]:
    """HOME, USER and LOGNAME of the account the daemon runs as (from its environment
    where the password database does not know the account, as in some containers)."""
    try:
        entry = pwd.getpwuid(os.geteuid())
    except KeyError:
        return {k: daemon_env[k] for k in jobenv.ACCOUNT_VARS if k in daemon_env}
    return {"HOME": entry.pw_dir, "USER": entry.pw_name, "LOGNAME": entry.pw_name}


def job_env(
    launch: Launch, base: Mapping[str, str], omp_threads: int, preempt_grace_s: float = 0.0
) -> dict[str, str]:
    """The whole environment of one attempt; ``base`` is the daemon's environment."""
    env = starting_env(launch.spec.env, base)
    threads = str(omp_threads)
    if launch.cores:
        threads = str(hostres.threads_per_rank(len(launch.cores), ranks(launch)))
    for name in THREAD_VARS:
        env.setdefault(name, threads)
    env.update(
        {
            "CUDA_VISIBLE_DEVICES": ",".join(launch.visible or (str(g) for g in launch.gpus)),
            # NVML (which ddpq leases by) numbers GPUs in PCI bus order; CUDA's
            # default order is "fastest first". Without this, GPU 0 to ddpq
            # and GPU 0 to the job could be different cards.
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "MASTER_ADDR": "127.0.0.1",
            jobenv.JOB_ID_VAR: str(launch.job_id),
            "DDPQ_JOB_DIR": str(launch.job_dir),
            # A retried job can tell it is a retry (e.g. to resume from a checkpoint).
            jobenv.ATTEMPT_VAR: str(launch.attempt),
            # This attempt's size: an elastic job's changes between attempts (its lease).
            "DDPQ_GPUS": str(len(launch.gpus)),
            "PYTHONUNBUFFERED": "1",
        }
    )
    if launch.port is not None:
        env["MASTER_PORT"] = str(launch.port)
    tmp = own_tmp(launch)
    if tmp is not None:
        env["TMPDIR"] = str(tmp)
    if launch.reserved_mem_bytes is not None:
        # Its share of each GPU (bytes): e.g. for torch.cuda.set_per_process_memory_fraction.
        env["DDPQ_GPU_MEM"] = str(launch.reserved_mem_bytes)
    if launch.spec.interactive:
        # It runs on a terminal: the type `ddpq shell` sends in `env` (an exported
        # environment never carries one, so a TERM stored is that one), or a common one.
        env["TERM"] = jobenv.unpack(launch.spec.env)[1].get("TERM") or SESSION_TERM
    if launch.preempt_with is not None:
        # docs/preemption.md: checkpoint on this signal, exit REQUEUE_EXIT within the grace.
        env["DDPQ_PREEMPT_SIGNAL"] = launch.preempt_with
        env["DDPQ_PREEMPT_GRACE"] = f"{preempt_grace_s:g}"
        env["DDPQ_REQUEUE_EXIT"] = str(REQUEUE_EXIT)
    return env


def own_tmp(launch: Launch) -> Path | None:
    """The attempt's own temporary folder, its ``TMPDIR``: in the job's folder, so that
    what the job leaves there (torchrun's log folder on every run, whatever a killed job
    had open) is bounded with the folder and removed when the attempt ends (the shim makes
    and removes it, ``executors.local.shim_tmp``), not left in the host's shared /tmp.
    None where the submission chose a ``TMPDIR`` of its own (``--env``, or exported from
    the submitter's shell): that one is the job's to keep. The daemon's own never counts."""
    if "TMPDIR" in jobenv.unpack(launch.spec.env)[1]:
        return None
    return JobDir(launch.job_dir).tmp


def ranks(launch: Launch) -> int:
    """The processes the job's command is run as: one per GPU under torchrun, else one."""
    return max(1, len(launch.gpus)) if launch.spec.launcher == "torchrun" else 1


def job_argv(launch: Launch, python: str) -> list[str]:
    """The job's command line: as submitted (a session's with its leased port for
    ``{port}``), or under torchrun on its leased GPUs and port."""
    if launch.spec.interactive:
        return fill_port(launch.spec.command, launch.port)
    if launch.spec.launcher != "torchrun":
        return list(launch.spec.command)
    assert launch.port is not None
    return [
        python,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "1",
        "--nproc-per-node",
        str(ranks(launch)),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(launch.port),
        "--max-restarts",
        "0",
        *launch.spec.command,
    ]
