"""The GPUs a worker hands out when its jobs go to Slurm: a budget, not this host's devices.

ddpq still plans and leases as it does locally (priority, fair share, backfill, one port
per job), but a leased "GPU" is a slot of the GPUs ddpq may hold in Slurm at once: every
GPU of the partition's nodes as ``sinfo`` counts them at start, or ``--slurm-gpus N``.
Slurm chooses the nodes and devices (the job sees them in ``CUDA_VISIBLE_DEVICES``), so
the worker never asks NVML about this host, which may have no GPU at all (a login node).
"""

from __future__ import annotations

from ddpq.config import Settings
from ddpq.core.gpus import Gpu
from ddpq.executors.slurm.commands import SlurmCommands, SlurmUnavailable
from ddpq.executors.slurm.executor import SlurmExecutor


def budget_devices(count: int, partition: str | None) -> list[Gpu]:
    """``count`` slots, shown on the page and by ``ddpq gpus`` as Slurm's."""
    name = f"Slurm GPU ({partition or 'default partition'})"
    return [Gpu(i, f"SLURM-SLOT-{i}", name, 0, 0, (), fake=False) for i in range(count)]


def for_worker(settings: Settings) -> tuple[SlurmExecutor, list[Gpu], Settings]:
    """The executor, the budget as the worker's devices, and the settings the worker runs
    with; raises SlurmUnavailable (one line) where Slurm cannot be used from here."""
    if settings.fake_gpus is not None:
        raise SlurmUnavailable(
            "--fake-gpus is for the local executor; with --executor slurm, --slurm-gpus N "
            "sets how many GPUs ddpq may hold in Slurm"
        )
    commands = SlurmCommands()
    count = settings.slurm_gpus
    if count is None:
        count = commands.partition_gpus(settings.slurm_partition)
    # The worker asks NVML again every few seconds unless its GPUs are fixed ("fake" to
    # it): the budget is, and NVML here would describe the wrong machine.
    worker_settings = settings.model_copy(update={"fake_gpus": count})
    executor = SlurmExecutor(settings, commands, count)
    return executor, budget_devices(count, settings.slurm_partition), worker_settings
