"""This host's GPUs as the worker hands them out: discovered, classified, published.

A GPU running compute processes that belong to no ddpq job is ``external``; with the
default policy (``--external-gpus avoid``) it is not handed out. The API shows the
worker's latest view from the store, without loading NVML itself.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection

from ddpq.config import Settings
from ddpq.store import devices as device_store
from ddpq.store.db import Database
from ddpq.worker.devices import Device, DevicesUnavailable, discover, external_pids

log = logging.getLogger("ddpq.worker")

REFRESH_S = 5.0


class Inventory:
    def __init__(self, settings: Settings, devices: list[Device]) -> None:
        self.settings = settings
        self.devices = devices
        self.external: set[int] = set()
        self._refreshed_at = time.monotonic()

    def usable(self) -> list[int]:
        """The GPUs the policy lets ddpq hand out (leased or not)."""
        indices = [d.index for d in self.devices]
        if self.settings.external_policy == "avoid":
            return [i for i in indices if i not in self.external]
        return indices

    def due(self) -> bool:
        """Fake GPUs never change; real ones are looked at every REFRESH_S."""
        if self.settings.fake_gpus is not None:
            return False
        return time.monotonic() - self._refreshed_at >= REFRESH_S

    def refresh(self, ours: Collection[int]) -> bool:
        """Ask NVML again; ``ours`` are the processes of ddpq's jobs. False if NVML failed."""
        self._refreshed_at = time.monotonic()
        try:
            self.devices = discover(None)
        except DevicesUnavailable as exc:
            log.warning("%s", exc)
            return False
        self.external = {d.index for d in self.devices if external_pids(d, ours)}
        return True

    def publish(self, db: Database, ours: Collection[int], now: float) -> None:
        outside = {d.index: set(external_pids(d, ours)) for d in self.devices}
        rows = [
            device_store.DeviceRow(
                index=d.index,
                uuid=d.uuid,
                name=d.name,
                fake=d.fake,
                memory_total_mb=d.memory_total_mb,
                memory_used_mb=d.memory_used_mb,
                external=d.index in self.external,
                external_processes=[
                    {"pid": p.pid, "used_memory_mb": p.used_memory_mb}
                    for p in d.processes
                    if p.pid in outside[d.index]
                ],
            )
            for d in self.devices
        ]
        with db.write() as s:
            device_store.replace_all(s, rows, now)
