"""How busy the leased GPUs are: compute utilisation and process memory, through NVML.

The worker asks every few seconds (``worker.idle``), for the GPUs that running jobs hold,
so NVML stays initialised between looks (``nvmlInit`` can cost tens of milliseconds on a
driver without persistence mode). What NVML cannot tell (utilisation not supported, no
memory figure) is None, which the idle rule reads as "in use": a session is never ended
on a guess. With fake GPUs there is nothing to ask, and every look is unknown.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from typing import Any

from ddpq.core.interactive import GpuUse
from ddpq.worker.devices import _MIB, _compute_processes

log = logging.getLogger("ddpq.worker")


class GpuSampler:
    """One look at a set of GPUs at a time; ``None`` when NVML cannot answer."""

    def __init__(self, fake_gpus: bool) -> None:
        self.fake = fake_gpus
        self._nvml: Any = None  # the bindings, once initialised
        self._failing: str | None = None  # the failure last logged

    def __call__(self, indices: Sequence[int]) -> dict[int, GpuUse] | None:
        if self.fake or not indices:
            return None
        try:
            nvml = self._initialised()
            found = {i: self._look(nvml, i) for i in indices}
        except Exception as exc:  # NVML's errors, a missing library: no look this time
            self.close()
            if self._failing != str(exc):
                self._failing = str(exc)
                log.warning("cannot read GPU utilisation (%s); no session is judged idle", exc)
            return None
        if self._failing is not None:
            self._failing = None
            log.info("GPU utilisation can be read again")
        return found

    def _initialised(self) -> Any:
        if self._nvml is None:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
        return self._nvml

    @staticmethod
    def _look(nvml: Any, index: int) -> GpuUse:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        try:
            utilization: int | None = int(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
        except nvml.NVMLError:  # not supported on this GPU (or MIG): unknown, so in use
            utilization = None
        held = [p.usedGpuMemory for p in _compute_processes(nvml, handle)]
        known = [int(m) // _MIB for m in held if m is not None]
        if len(known) < len(held):  # the driver cannot tell per process: the GPU's total
            known = [int(nvml.nvmlDeviceGetMemoryInfo(handle).used) // _MIB]
        return GpuUse(utilization, sum(known))

    def close(self) -> None:
        if self._nvml is not None:
            with contextlib.suppress(Exception):
                self._nvml.nvmlShutdown()
            self._nvml = None
