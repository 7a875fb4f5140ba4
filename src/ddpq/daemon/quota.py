"""The disk watch: the state disk kept usable by everyone while one job writes.

A thread of its own in the process that runs jobs (``ddpq serve``, ``ddpq worker``),
started by ``daemon.run`` beside the worker, as the janitor is: measuring a folder of a
million files takes seconds, which no job's start should wait for. Every
``disk_every_s`` (longer when measuring took long: it spends at most a fifth of its time
measuring) it

- makes the database's reserve whole again once there is room (``store.headroom``), and
  says once when the disk is short and once when it is not any more;
- measures each running job's folder (``daemon.measure``: allocated blocks, never through
  a link or into another filesystem, plus the files its processes deleted but keep open;
  a bounded share per look, jobs in rotation) and asks for the stop of each one over the
  per-job limit (``core.quota``), as a cancel asks for it: the worker's stop phase sends
  it (SIGTERM, then SIGKILL after the grace), and the job ends failed with the reason
  ("its folder holds 12.3G, over the 10G per-job limit").

A job may write much between two looks; the exact bound is a filesystem (or a project
quota) of the job folders' own (docs/admin.md).
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from ddpq import wake
from ddpq.config import Settings
from ddpq.core import quota
from ddpq.daemon.failures import FailureLog
from ddpq.daemon.measure import Measurer, Running
from ddpq.executors.local import cgroups
from ddpq.executors.local.freeze import pauser
from ddpq.store import quota as quota_store
from ddpq.store.db import Database
from ddpq.store.headroom import Reserve

log = logging.getLogger("ddpq.disk")

# The most of its time the watch spends measuring (a folder of millions of files).
BUSY_SHARE = 0.2


class DiskWatch:
    def __init__(self, settings: Settings, *, clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.clock = clock
        self.reserve = Reserve(
            settings.reserve_path, settings.state_reserve_bytes, pause_jobs=pauser(settings)
        )
        self.db = Database(settings.db_path, durable=False, reserve=self.reserve)
        self._stop = threading.Event()
        self.measurer = Measurer()  # walks of big folders go on from one look to the next
        self.failures = FailureLog(log, "disk watch")
        self._short: str | None = None  # the shortage last logged

    def run(self) -> None:
        try:
            while True:
                began = time.monotonic()
                self.step()
                took = time.monotonic() - began
                if self._stop.wait(max(self.settings.disk_every_s, took / BUSY_SHARE)):
                    return
        finally:
            self.measurer.close()
            self.db.dispose()

    def stop(self) -> None:
        self._stop.set()

    def step(self) -> dict[int, str]:
        """One look, logged: one line per kind of failure, not one per look."""
        try:
            self._say_shortage()
            asked = self.stop_over_limit()
        except Exception as exc:
            self.failures.failed(exc)
            return {}
        self.failures.cleared()
        return asked

    def _say_shortage(self) -> None:
        self.reserve.fill()
        short = self.reserve.shortage()
        if short is not None and self._short is None:
            log.warning("%s", short)
        elif short is None and self._short is not None:
            log.info("the disk holding ddpq's state has room again: new jobs are taken")
        self._short = short

    def stop_over_limit(self) -> dict[int, str]:
        """Ask for the stop of each running job whose folder holds more than the limit;
        those asked, and why."""
        setting = self.settings.job_folder_max
        if setting is None:
            return {}
        with self.db.read() as s:
            folders = quota_store.running_folders(s)
        trees = cgroups.remembered_trees(self.settings.home)
        running = {
            job_id: Running(
                Path(job_dir), functools.partial(_job_pids, trees, job_id, attempt), attempt
            )
            for job_id, (job_dir, attempt) in folders.items()
        }

        def limit_of(jobs_dir: Path) -> int | None:
            return quota.folder_limit(setting, _filesystem_bytes(jobs_dir))

        held = self.measurer.look(running, limit_of)
        over = {
            job_id: why
            for job_id, size in held.items()
            if (why := quota.over_limit(size, limit_of(running[job_id].folder.parent), setting))
        }
        if not over:
            return {}
        now = self.clock()

        def ask() -> dict[int, str]:
            with self.db.write() as s:
                return {
                    job_id: why
                    for job_id, why in over.items()
                    if quota_store.request_quota_stop(s, job_id, why, now)
                }

        # A job over its limit may well have filled the disk: this write must happen.
        asked = self.db.making_room(ask)
        for job_id, why in asked.items():
            log.info("job %s: %s; stopping it", job_id, why)
        if asked:
            wake.nudge(self.settings.wake_socket)
        return asked


def shared_disk(settings: Settings) -> str | None:
    """What to tell the admin at start when the job folders are on the filesystem of the
    state folder (the database), or None: a job that fills it then refuses everyone's
    submissions until someone makes room, whatever the reserve keeps for cancels."""
    try:
        shared = os.stat(settings.jobs_dir).st_dev == os.stat(settings.home).st_dev
    except OSError:
        return None
    if not shared:
        return None
    return (
        f"the job folders ({settings.jobs_dir}) are on the filesystem of ddpq's state "
        f"({settings.home}): a job that fills it refuses every new job until an admin makes "
        "room (cancels still work). Give the job folders a filesystem of their own "
        '(docs/admin.md, "A full disk")'
    )


def _job_pids(trees: list[Path], job_id: int, attempt: int) -> list[int]:
    """The processes of a job's attempt: its cgroup's members (none known for a job
    tracked by session)."""
    for tree in trees:
        members = cgroups.members(cgroups.job_cgroup(tree, job_id, attempt))
        if members:
            return members
    return []


def _filesystem_bytes(folder: Path) -> int:
    st = os.statvfs(folder)
    return st.f_blocks * st.f_frsize
