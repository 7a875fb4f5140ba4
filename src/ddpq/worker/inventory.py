"""This host's GPUs as the worker hands them out: discovered, classified, published.

A GPU running compute processes that belong to no ddpq job is ``external``; with the
default policy (``--external-gpus avoid``) it is not handed out. The API shows the
worker's latest view from the store, without loading NVML itself. Each look is also a
sample of who uses the GPUs outside the queue (``worker.outside``), when they are this
host's (``Settings.samples_outside_use``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Mapping, Sequence

from ddpq.config import Settings
from ddpq.core.gpus import Gpu, external_pids, hardware_of
from ddpq.core.sharing import Measured
from ddpq.store import devices as device_store
from ddpq.store import memory as memory_store
from ddpq.store.db import Database
from ddpq.worker.devices import DevicesUnavailable, discover
from ddpq.worker.outside import OutsideUse

log = logging.getLogger("ddpq.worker")


def _nvml() -> list[Gpu]:
    return discover(None)


class Inventory:
    def __init__(
        self, settings: Settings, devices: list[Gpu], look: Callable[[], list[Gpu]] | None = None
    ) -> None:
        """``look``: how the GPUs are looked at again (default: NVML; None with fake GPUs,
        which never change)."""
        self.settings = settings
        self.look = look if look is not None or settings.fake_gpus is not None else _nvml
        self.devices = devices
        self.external: set[int] = set()
        # Slots of a Slurm budget are no device anyone here could use: nothing to sample.
        self.outside = OutsideUse(settings.gpu_poll_s) if settings.samples_outside_use else None
        # The GPUs' memory and each job's use of it, as last looked at.
        self.measured = Measured.of(devices, {})
        self.hardware = hardware_of(devices)  # for the placer: links, models, NUMA
        self._refreshed_at = time.monotonic()

    def usable(self) -> list[int]:
        """The GPUs the policy lets ddpq hand out (leased or not)."""
        indices = [d.index for d in self.devices]
        if self.settings.external_policy == "avoid":
            return [i for i in indices if i not in self.external]
        return indices

    def naming(self, gpus: Sequence[int]) -> tuple[tuple[str, ...], tuple[int, ...] | None]:
        """How a job leased ``gpus`` sees them: ``CUDA_VISIBLE_DEVICES``'s names and the
        physical GPUs whose device files it may open, where they are not the indexes
        themselves (MIG instances: their UUIDs and parents); else ``((), None)``."""
        by_index = {d.index: d for d in self.devices}
        parent = {d.index: d.parent for d in self.devices if d.parent is not None}
        if not parent.keys() & set(gpus):
            return (), None
        names = tuple(by_index[g].uuid if g in parent else str(g) for g in gpus)
        return names, tuple(sorted({parent.get(g, g) for g in gpus}))

    def due(self) -> bool:
        """Fake GPUs never change; real ones are looked at every ``gpu_poll_s``."""
        if self.look is None:
            return False
        return time.monotonic() - self._refreshed_at >= self.settings.gpu_poll_s

    def refresh(self, pids_by_job: Mapping[int, Collection[int]]) -> bool:
        """Ask NVML again (real GPUs only); ``pids_by_job`` are the processes of ddpq's
        jobs. False if NVML failed."""
        self._refreshed_at = time.monotonic()
        if self.look is None:
            return True
        try:
            self.devices = self.look()
        except DevicesUnavailable as exc:
            log.warning("%s", exc)
            return False
        ours = {pid for pids in pids_by_job.values() for pid in pids}
        self.external = {d.index for d in self.devices if external_pids(d, ours)}
        self.measured = Measured.of(self.devices, pids_by_job)
        self.hardware = hardware_of(self.devices)
        return True

    def publish(
        self, db: Database, ours: Collection[int], now: float, peaks: Mapping[int, int]
    ) -> None:
        """Store this view for the API: each GPU with the processes on it that are not
        ddpq's (``ours``), named by their owners, whose use this look is a sample of; and, in
        the same transaction, the running attempts' new peaks (job id -> bytes)."""
        outside = [d.outside(ours) for d in self.devices]
        if self.outside is not None:
            outside = self.outside.name_owners(outside)
        with db.write() as s:
            device_store.replace_all(s, outside, now)
            if self.outside is not None:
                self.outside.sample(s, outside, now)
            memory_store.record_peaks(s, peaks)
