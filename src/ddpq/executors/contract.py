"""The job contract: the environment and command line every executor gives a job."""

from __future__ import annotations

from collections.abc import Mapping

from ddpq.core.disposition import REQUEUE_EXIT
from ddpq.executors.base import Launch


def threads_per_rank(cpu_count: int, total_gpus: int) -> int:
    """Cores divided among the most ranks this host can run at once, at least 1."""
    return max(1, cpu_count // max(1, total_gpus))


def job_env(
    launch: Launch, base: Mapping[str, str], omp_threads: int, preempt_grace_s: float = 0.0
) -> dict[str, str]:
    env = dict(base)
    # Variables of the daemon's own that must not leak into a job.
    for key in [k for k in env if k.startswith("DDPQ_")]:
        del env[key]
    env.setdefault("OMP_NUM_THREADS", str(omp_threads))
    env.update(launch.env)
    env.update(
        {
            "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in launch.gpus),
            # NVML (which ddpq leases by) numbers GPUs in PCI bus order; CUDA's
            # default order is "fastest first". Without this, GPU 0 to ddpq
            # and GPU 0 to the job could be different cards.
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "MASTER_ADDR": "127.0.0.1",
            "DDPQ_JOB_ID": str(launch.job_id),
            "DDPQ_JOB_DIR": str(launch.job_dir),
            # A retried job can tell it is a retry (e.g. to resume from a checkpoint).
            "DDPQ_ATTEMPT": str(launch.attempt),
            "PYTHONUNBUFFERED": "1",
        }
    )
    if launch.port is not None:
        env["MASTER_PORT"] = str(launch.port)
    if launch.preempt_signal is not None:
        # docs/preemption.md: checkpoint on this signal, exit REQUEUE_EXIT within the grace.
        env["DDPQ_PREEMPT_SIGNAL"] = launch.preempt_signal
        env["DDPQ_PREEMPT_GRACE"] = f"{preempt_grace_s:g}"
        env["DDPQ_REQUEUE_EXIT"] = str(REQUEUE_EXIT)
    return env


def job_argv(launch: Launch, python: str) -> list[str]:
    """The job's command line: as submitted, or under torchrun on its leased GPUs and port."""
    if launch.launcher != "torchrun":
        return list(launch.command)
    assert launch.port is not None
    return [
        python,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "1",
        "--nproc-per-node",
        str(max(1, len(launch.gpus))),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(launch.port),
        "--max-restarts",
        "0",
        *launch.command,
    ]
