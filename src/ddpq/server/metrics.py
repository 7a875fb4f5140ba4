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
from ddpq.core.states import JobState
from ddpq.store import idle as idle_store
from ddpq.store import retention, stats
from ddpq.store.db import Session

# Training jobs run from seconds (smoke tests) to days.
H = 3600.0
DURATION_BUCKETS = (1.0, 10.0, 60.0, 300.0, 900.0, 1800.0, H, 3 * H, 6 * H, 12 * H, 24 * H, 48 * H)
# Waiting runs from "started at once" to "queued behind a weekend of other people's jobs".
WAIT_BUCKETS = (0.1, 1.0, 5.0, 30.0, 60.0, 300.0, 900.0, 1800.0, H, 4 * H, 12 * H, 24 * H, 72 * H)
# The worker places a job in milliseconds; the high buckets are there to catch a stalled loop.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


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

    def __init__(self, session: Session, now: float, idle_long_s: float = 1800.0) -> None:
        self.session = session
        self.now = now
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
        yield from _retention(s)
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


def render(session: Session, now: float, idle_long_s: float = 1800.0) -> tuple[bytes, str]:
    """The exposition text and its content type."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(session, now, idle_long_s))
    return generate_latest(registry), CONTENT_TYPE_LATEST
