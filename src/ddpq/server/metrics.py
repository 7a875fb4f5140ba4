"""Prometheus exposition for ``GET /metrics``.

Every value is read from the database at scrape time by one collector on a registry made for
that scrape. Nothing is kept in process memory, so a split ``ddpq server`` / ``ddpq worker``
set-up, or a restarted daemon, reports the same numbers: the histograms are counts over the
jobs table, monotone as long as jobs are not deleted (retention with --prune-rows deletes them:
a scraper then sees what reads as a counter reset).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import (
    CollectorRegistry,
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from ddpq import __version__
from ddpq.core import usage
from ddpq.core.states import JobState
from ddpq.store import devices as device_store
from ddpq.store import idle as idle_store
from ddpq.store import retention, stats
from ddpq.store import usage as usage_store
from ddpq.store.db import Session

# Training jobs run from seconds (smoke tests) to days.
H = 3600.0
DURATION_BUCKETS = (1.0, 10.0, 60.0, 300.0, 900.0, 1800.0, H, 3 * H, 6 * H, 12 * H, 24 * H, 48 * H)
# Waiting runs from "started at once" to "queued behind a weekend of other people's jobs".
WAIT_BUCKETS = (0.1, 1.0, 5.0, 30.0, 60.0, 300.0, 900.0, 1800.0, H, 4 * H, 12 * H, 24 * H, 72 * H)
# The worker places a job in milliseconds; the high buckets are there to catch a stalled loop.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# GPU memory: from a small model's few hundred MiB to an H200's 141 GB.
G = float(1 << 30)
MEMORY_BUCKETS = tuple(x * G for x in (0.5, 1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 80, 96, 141))
# A sharing job's peak over its reservation: over 1.0 it used more than it reserved.
USE_BUCKETS = (0.1, 0.25, 0.5, 0.75, 0.9, 1.0, 1.1, 1.5, 2.0)


def _histogram(name: str, doc: str, dist: stats.Distribution) -> HistogramMetricFamily:
    buckets = [(_le(b), float(n)) for b, n in zip(dist.bounds, dist.cumulative, strict=True)]
    buckets.append(("+Inf", float(dist.count)))
    return HistogramMetricFamily(name, doc, buckets=buckets, sum_value=dist.total)


def _le(bound: float) -> str:
    # The exposition format's canonical float text ("1.0", "0.005"), as prometheus_client's own
    # Histogram writes it, so bucket label values do not change with how a bound was written.
    return repr(float(bound))


class StoreCollector(Collector):
    """Reads the store through one session; used for one scrape and thrown away."""

    def __init__(
        self,
        session: Session,
        now: float,
        names_are_users: bool = False,
        idle_long_s: float = 1800.0,
    ) -> None:
        self.session = session
        self.now = now
        self.names_are_users = names_are_users  # core.usage.attribute
        self.idle_long_s = idle_long_s

    def collect(self) -> Iterator[Metric]:
        s = self.session
        by_state = stats.jobs_by_state(s)
        jobs = GaugeMetricFamily("ddpq_jobs", "Jobs in each state.", labels=["state"])
        for state, n in by_state.items():
            jobs.add_metric([state], n)
        yield jobs

        yield GaugeMetricFamily(
            "ddpq_queue_length",
            "Jobs in the queued state (held jobs are not counted).",
            value=by_state[JobState.QUEUED],
        )
        oldest = stats.oldest_queued_submit(s)
        yield GaugeMetricFamily(
            "ddpq_queue_oldest_age_seconds",
            "How long the longest-waiting queued job has waited (0 when none is queued).",
            value=0.0 if oldest is None else max(0.0, self.now - oldest),
        )

        gpus = GaugeMetricFamily(
            "ddpq_gpus",
            "GPUs by status: leased to a ddpq job, free, or used by a process ddpq did not start.",
            labels=["status"],
        )
        for status, n in stats.gpus_by_status(s).items():
            gpus.add_metric([status], n)
        yield gpus
        yield GaugeMetricFamily(
            "ddpq_gpus_held_by_lost_jobs",
            "GPUs used by processes ddpq did not start, whose last ddpq job was lost "
            "(its shim vanished): likely its leftovers, which no kill ended.",
            value=stats.gpus_held_by_lost_jobs(s),
        )
        yield GaugeMetricFamily(
            "ddpq_ports_leased",
            "Rendezvous ports leased to live jobs.",
            value=stats.ports_leased(s),
        )
        yield from _outside(s, self.names_are_users)
        yield from _retention(s)
        yield from _memory(s)
        yield from _idle(s, self.now, self.idle_long_s)

        yield _histogram(
            "ddpq_job_duration_seconds",
            "Run time of finished jobs (last attempt: end - start).",
            stats.job_durations(s, DURATION_BUCKETS),
        )
        yield _histogram(
            "ddpq_queue_wait_seconds",
            "Time from submission to a job's first start.",
            stats.queue_waits(s, WAIT_BUCKETS),
        )
        yield _histogram(
            "ddpq_scheduling_latency_seconds",
            "Worker's delay from being able to place a job to having placed it.",
            stats.scheduling_latencies(s, LATENCY_BUCKETS),
        )

        info = GaugeMetricFamily("ddpq_build_info", "ddpq version (always 1).", labels=["version"])
        info.add_metric([__version__], 1)
        yield info


# Outside use is labelled by account: the first this many accounts ever seen have series of
# their own, any later one is summed under "(other)". Membership never changes (the first
# ones stay the first), so every series is a true counter, and a host whose users cycle
# through many uids (rootless containers' sub-uids) cannot blow up the scrape.
MAX_ACCOUNT_SERIES = 32


def _outside(s: Session, names_are_users: bool) -> Iterator[Metric]:
    """GPU-seconds of processes in no job per account (and the ddpq user it maps to, or
    ""), and the GPUs each account is on now."""
    totals = usage_store.totals(s)
    own = {t.label for t in totals[:MAX_ACCOUNT_SERIES]}
    now_on: dict[str, int] = {}
    for gpu in device_store.all_devices(s):
        for label in {usage.account_label(p.uid, p.account) for p in gpu.processes}:
            now_on[label] = now_on.get(label, 0) + 1
    people = usage_store.people(s, own | set(now_on), names_are_users)

    def labels(label: str) -> list[str]:
        return [label, people.get(label, "")] if label in own else [usage.OTHER, ""]

    seconds = CounterMetricFamily(
        "ddpq_outside_gpu_seconds",
        "GPU-seconds used by processes in no ddpq job, per Unix account (a uid without one: "
        "'uid N'; unreadable: '(unknown)'; accounts past the first "
        f"{MAX_ACCOUNT_SERIES}: '(other)') and the ddpq user it maps to ('' for none).",
        labels=["account", "user"],
    )
    summed: dict[tuple[str, ...], float] = {}
    for t in totals:
        key = tuple(labels(t.label))
        summed[key] = summed.get(key, 0.0) + t.seconds
    for key, value in summed.items():
        seconds.add_metric(list(key), value)
    yield seconds
    gpus = GaugeMetricFamily(
        "ddpq_outside_gpus",
        "GPUs on which each account has processes in no ddpq job now (labels as "
        "ddpq_outside_gpu_seconds_total).",
        labels=["account", "user"],
    )
    counted: dict[tuple[str, ...], int] = {}
    for label, n in now_on.items():
        key = tuple(labels(label))
        counted[key] = counted.get(key, 0) + n
    for key, n in counted.items():
        gpus.add_metric(list(key), n)
    yield gpus


def _memory(s: Session) -> Iterator[Metric]:
    """Sharing GPUs by memory: per GPU, and the measured peaks of ended attempts (no job,
    user or command is named: /metrics needs no token)."""
    sharing = GaugeMetricFamily(
        "ddpq_gpu_jobs_sharing", "Jobs sharing each GPU by memory (--gpu-mem).", labels=["gpu"]
    )
    reserved = GaugeMetricFamily(
        "ddpq_gpu_memory_reserved_bytes",
        "GPU memory the jobs sharing each GPU reserve there.",
        labels=["gpu"],
    )
    peak = GaugeMetricFamily(
        "ddpq_gpu_memory_peak_bytes",
        "Sum of the measured peaks (NVML, per attempt) of the jobs holding each GPU now.",
        labels=["gpu"],
    )
    for gpu, (n, held, peaks) in sorted(stats.gpu_memory_by_gpu(s).items()):
        sharing.add_metric([str(gpu)], n)
        reserved.add_metric([str(gpu)], held)
        peak.add_metric([str(gpu)], peaks)
    yield sharing
    yield reserved
    yield peak
    yield _histogram(
        "ddpq_attempt_gpu_memory_peak_bytes",
        "Measured peak GPU memory of ended attempts (on any one of their GPUs).",
        stats.attempt_peaks(s, MEMORY_BUCKETS),
    )
    yield _histogram(
        "ddpq_attempt_gpu_memory_use_ratio",
        "Ended attempts that shared GPUs: measured peak over the memory they reserved.",
        stats.reservation_use(s, USE_BUCKETS),
    )


def _retention(s: Session) -> Iterator[Metric]:
    """What retention removed (counters kept in the database) and its latest pass."""
    totals = retention.removed_totals(s)
    jobs = CounterMetricFamily(
        "ddpq_retention_removed_jobs",
        "Finished jobs whose checkpoints, logs (with the other records) or rows retention removed.",
        labels=["what"],
    )
    size = CounterMetricFamily(
        "ddpq_retention_removed_bytes",
        "Bytes on disk retention freed, by what it removed.",
        labels=["what"],
    )
    for what, (n, removed) in totals.items():
        jobs.add_metric([what], n)
        if what != retention.ROWS:
            size.add_metric([what], removed)
    yield jobs
    yield size
    last = retention.last_pass(s)
    if last is not None:  # no pass yet (no retention set): no made-up numbers
        yield GaugeMetricFamily(
            "ddpq_retention_last_pass_timestamp_seconds",
            "When retention last looked at the job folders (UNIX time).",
            value=last[0],
        )
        yield GaugeMetricFamily(
            "ddpq_job_folders_bytes",
            "Bytes on disk all job folders held after retention's latest pass.",
            value=last[1],
        )


def _idle(s: Session, now: float, idle_long_s: float) -> Iterator[Metric]:
    """Running jobs whose GPUs are unused now, and the sessions ended for it: counts only,
    as everything here (``ddpq gpus`` names the jobs, to those with a token)."""
    idle = idle_store.idle_now(s)
    now_idle = GaugeMetricFamily(
        "ddpq_jobs_gpus_idle",
        "Running jobs whose GPUs are unused now (no compute, no memory growth), by kind.",
        labels=["interactive"],
    )
    long_idle = GaugeMetricFamily(
        "ddpq_jobs_gpus_idle_long",
        "Running jobs whose GPUs have been unused longer than the daemon's --idle, by kind.",
        labels=["interactive"],
    )
    for kind in (True, False):
        jobs = [j for j in idle.values() if j.interactive is kind]
        label = [str(kind).lower()]
        now_idle.add_metric(label, len(jobs))
        long_idle.add_metric(label, sum(1 for j in jobs if now - j.idle_since >= idle_long_s))
    yield now_idle
    yield long_idle
    yield GaugeMetricFamily(
        "ddpq_gpus_idle_long",
        "GPUs leased to jobs that have left them unused longer than the daemon's --idle.",
        value=sum(j.gpus for j in idle.values() if now - j.idle_since >= idle_long_s),
    )
    yield CounterMetricFamily(
        "ddpq_sessions_reclaimed_idle",
        "Interactive sessions ended because their GPUs stayed unused.",
        value=idle_store.reclaimed(s),
    )


def render(
    session: Session, now: float, names_are_users: bool = False, idle_long_s: float = 1800.0
) -> tuple[bytes, str]:
    """The exposition text and its content type."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(session, now, names_are_users, idle_long_s))
    return generate_latest(registry), CONTENT_TYPE_LATEST
