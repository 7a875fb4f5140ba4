"""The executor a daemon's settings name (``settings.executor``), made for its worker.

The one place that turns the setting into an executor, so that nothing above the
executors compares its value: ``daemon.run`` asks here, the server and the worker ask
``executors.capabilities``.
"""

from __future__ import annotations

from ddpq.config import ConfigError, Settings
from ddpq.core.gpus import Gpu
from ddpq.executors.base import Executor


def for_worker(settings: Settings) -> tuple[Executor | None, list[Gpu] | None, Settings]:
    """The executor, the GPUs the worker hands out and the settings it runs with. The
    local executor is (None, None, settings): the worker makes it once it has found this
    host's GPUs. Raises ConfigError (the executor's one line) where it cannot be used."""
    if settings.executor == "slurm":
        # Jobs go to Slurm; the worker's GPUs are the budget ddpq may hold there. Imported
        # here only: a daemon with the local executor never loads Slurm's modules.
        from ddpq.executors.slurm.budget import for_worker as slurm_worker
        from ddpq.executors.slurm.commands import SlurmUnavailable

        try:
            return slurm_worker(settings)
        except SlurmUnavailable as exc:
            raise ConfigError(str(exc)) from None
    return None, None, settings
