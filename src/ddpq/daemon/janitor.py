"""The janitor: retention of finished jobs' folders and rows (``--keep-finished``,
``--jobs-budget``, ``--prune-rows``).

A thread of its own in the process that runs jobs (``ddpq serve``, ``ddpq worker``),
started by ``daemon.run`` next to the worker and apart from its pass: removing a year of
checkpoints may take minutes, and no job should wait on it to start. It looks when the
daemon starts and every ``prune_every_s`` after that; ``ddpq admin prune`` runs the same
pass once. Each pass measures every job folder (``daemon.sweep``, never through a link),
asks ``core.retention.plan`` what goes, removes it, and stores what it removed in the
database (the counters ``/metrics`` serves), with one log line for the pass.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ddpq.config import Settings
from ddpq.core import retention
from ddpq.core.retention import JobFolder, Plan, Policy, What
from ddpq.daemon import sweep
from ddpq.daemon.failures import FailureLog
from ddpq.store import retention as store
from ddpq.store.db import Database

log = logging.getLogger("ddpq.janitor")

# Rows of jobs without a folder considered per pass: a first pass on a database of years
# holds the write lock briefly and leaves the rest to the next passes.
ROWS_PER_PASS = 10_000


def policy_of(settings: Settings) -> Policy:
    return Policy(settings.keep_finished_s, settings.jobs_budget_bytes, settings.prune_rows)


@dataclass
class Report:
    """What a pass removed (or, dry, would remove)."""

    plan: Plan
    dry_run: bool
    checkpoints: tuple[int, int] = (0, 0)  # jobs, bytes
    logs: tuple[int, int] = (0, 0)
    rows: int = 0
    left: list[int] = field(default_factory=list)  # jobs whose folder could not all go
    folder_bytes: int = 0  # what all job folders hold after the pass

    @property
    def removed_anything(self) -> bool:
        return bool(self.checkpoints[0] or self.logs[0] or self.rows)

    def summary(self) -> str:
        verb = "would remove" if self.dry_run else "removed"
        parts = []
        if self.checkpoints[0]:
            parts.append(f"checkpoints of {_jobs(self.checkpoints)}")
        if self.logs[0]:
            parts.append(f"logs and records of {_jobs(self.logs)}")
        if self.rows:
            parts.append(f"{self.rows} job row{'s' if self.rows != 1 else ''}")
        text = f"{verb} {', '.join(parts)}" if parts else f"{verb} nothing"
        hold = "would hold" if self.dry_run else "hold"
        text += f"; job folders {hold} {approx_size(self.folder_bytes)}"
        if self.plan.over_budget:
            text += ", over the budget: the rest is jobs not finished or users within their share"
        if self.left:
            text += f"; could not remove all of job {', '.join(map(str, self.left[:10]))}"
        return text


def _jobs(count: tuple[int, int]) -> str:
    n, size = count
    return f"{n} job{'s' if n != 1 else ''} ({approx_size(size)})"


def written_duration(seconds: float) -> str:
    """A limit as people write it: 30d, 12h, 90m, 45s (the largest unit that fits exactly)."""
    for unit, scale in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= scale and seconds % scale == 0:
            return f"{int(seconds // scale)}{unit}"
    return f"{seconds:g}s"


def approx_size(size: int) -> str:
    """Bytes for people, as `du -h` writes them: 0, 512, 4.0K, 1.2G."""
    value = float(size)
    for unit in ("", "K", "M", "G", "T"):
        if value < 1024 or unit == "T":
            return f"{int(value)}" if not unit else f"{value:.1f}{unit}"
        value /= 1024
    raise AssertionError("unreachable")


class Janitor:
    def __init__(self, settings: Settings, *, clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.policy = policy_of(settings)
        self.clock = clock
        self.db = Database(settings.db_path, durable=False)
        self._stop = threading.Event()
        self.failures = FailureLog(log, "retention pass")
        self._over_budget = False

    # ---- the thread -----------------------------------------------------------------

    def run(self) -> None:
        try:
            while True:
                self.step()
                if self._stop.wait(self.settings.prune_every_s):
                    return
        finally:
            self.db.dispose()

    def stop(self) -> None:
        self._stop.set()

    def step(self) -> Report | None:
        """One pass, logged: a line when it removed something, a warning when the budget
        cannot be met (once, until it can), one line per kind of failure."""
        try:
            report = self.prune()
        except Exception as exc:
            self.failures.failed(exc)
            return None
        self.failures.cleared()
        if report.removed_anything or report.left:
            log.info("retention: %s", report.summary())
        if report.plan.over_budget and not self._over_budget:
            log.warning(
                "retention: job folders hold %s, more than the budget of %s, and the rest "
                "belongs to jobs that have not finished or to users within an equal share of it",
                approx_size(report.folder_bytes),
                approx_size(self.policy.budget_bytes or 0),
            )
        self._over_budget = report.plan.over_budget
        return report

    # ---- one pass ---------------------------------------------------------------------

    def survey(self, now: float) -> tuple[list[JobFolder], int, int | None]:
        """Every job folder measured, with its job's state: (jobs, the bytes of folders of
        no known job, the newest job id)."""
        jobs_dir = self.settings.jobs_dir
        try:
            names = os.listdir(jobs_dir)
        except FileNotFoundError:
            names = []
        ids = [int(n) for n in names if n.isdigit() and n == str(int(n))]
        keep = self.policy.keep_finished_s
        with self.db.read() as s:
            rows = store.jobs_by_id(s, ids)
            expired = (
                store.finished_before(s, now - keep, ROWS_PER_PASS)
                if keep is not None and self.policy.prune_rows
                else []
            )
            newest = store.newest_job_id(s)
        folders: list[JobFolder] = []
        other = 0
        for job_id in ids:
            usage = sweep.folder_usage(jobs_dir, str(job_id))
            if usage is None:
                continue  # not a folder (or gone meanwhile)
            row = rows.get(job_id)
            if row is None:
                other += usage.checkpoint_bytes + usage.record_bytes
                continue
            folders.append(
                JobFolder(
                    job_id,
                    row.state,
                    row.finished_at,
                    usage.checkpoint_bytes,
                    usage.record_bytes,
                    owner=row.owner,
                )
            )
        have = {f.job_id for f in folders}
        for row in expired:
            if row.job_id not in have:
                folders.append(
                    JobFolder(row.job_id, row.state, row.finished_at, exists=False, owner=row.owner)
                )
        return folders, other, newest

    def decide(self, now: float) -> tuple[Plan, dict[int, JobFolder]]:
        """What goes now, and every job folder as measured."""
        folders, other, newest = self.survey(now)
        keep = self.policy.keep_finished_s
        label = written_duration(keep) if keep is not None else ""
        plan = retention.plan(
            folders, self.policy, now, newest_id=newest, other_bytes=other, age_label=label
        )
        return plan, {f.job_id: f for f in folders}

    def prune(self, *, dry_run: bool = False) -> Report:
        now = self.clock()
        plan, folders = self.decide(now)
        report = Report(plan, dry_run, folder_bytes=plan.left_bytes)
        if dry_run:
            _foresee(plan, folders, report)
            return report
        rows = self._apply(plan, report)
        with self.db.write() as s:
            report.rows = store.delete_finished(s, rows)
            store.add_removed(
                s,
                {
                    store.CHECKPOINTS: report.checkpoints,
                    store.LOGS: report.logs,
                    store.ROWS: (report.rows, 0),
                },
            )
            store.record_pass(s, now, report.folder_bytes)
        return report

    def _apply(self, plan: Plan, report: Report) -> list[int]:
        """Remove the plan's folders and checkpoints, tally them in ``report``; the rows
        whose folders are gone, to delete."""
        jobs_dir = self.settings.jobs_dir
        freed = 0
        checkpoints = [0, 0]
        logs = [0, 0]
        gone: set[int] = set()
        rows: list[int] = []
        for r in plan.removals:
            name = str(r.job_id)
            if r.what is What.ROW:
                # Only once its folder is gone: else the folder of a row-less job would stay.
                if r.job_id in gone or sweep.folder_usage(jobs_dir, name) is None:
                    rows.append(r.job_id)
                continue
            if r.what is What.CHECKPOINTS:
                done = sweep.remove_checkpoints(jobs_dir, name)
            else:
                done = sweep.remove_folder(jobs_dir, name)
                if done.gone:
                    gone.add(r.job_id)
                    logs[0] += 1
                    logs[1] += done.record_bytes
            if done.checkpoint_bytes:
                checkpoints[0] += 1
                checkpoints[1] += done.checkpoint_bytes
            if done.left and r.job_id not in report.left:
                report.left.append(r.job_id)
            freed += done.checkpoint_bytes + done.record_bytes
        report.checkpoints = (checkpoints[0], checkpoints[1])
        report.logs = (logs[0], logs[1])
        report.folder_bytes = max(0, plan.total_bytes - freed)
        return rows


def _foresee(plan: Plan, folders: dict[int, JobFolder], report: Report) -> None:
    """A dry run's tally, counted as ``_apply`` would count the removals."""
    trimmed: set[int] = set()
    checkpoints, logs = [0, 0], [0, 0]
    for r in plan.removals:
        job = folders.get(r.job_id)
        if r.what is What.ROW or job is None:
            continue
        cut = job.checkpoint_bytes if r.job_id not in trimmed else 0
        trimmed.add(r.job_id)
        if cut:
            checkpoints[0] += 1
            checkpoints[1] += cut
        if r.what is What.FOLDER:
            logs[0] += 1
            logs[1] += job.record_bytes
    report.checkpoints = (checkpoints[0], checkpoints[1])
    report.logs = (logs[0], logs[1])
    report.rows = len(plan.of(What.ROW))
