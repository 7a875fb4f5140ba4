"""/metrics against a real daemon: parsed as Prometheus text, values followed through a job."""

from __future__ import annotations

from collections.abc import Callable

import httpx
from prometheus_client.parser import text_string_to_metric_families

from ddpq import __version__
from ddpq.schemas import JobSubmit
from tests.helpers import Daemon, wait_done, wait_for

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
STATES = ["queued", "held", "starting", "running", "succeeded", "failed", "cancelled", "timed_out"]


def scrape(daemon: Daemon) -> Samples:
    """Every sample as {(name, sorted labels): value}; fails on text a scraper would reject."""
    r = httpx.get(daemon.url + "/metrics", timeout=10)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    samples: Samples = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            key = (s.name, tuple(sorted(s.labels.items())))
            assert key not in samples, f"duplicate sample {key}"
            samples[key] = s.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def buckets(samples: Samples, name: str) -> list[tuple[float, float]]:
    out = [(float(dict(lab)["le"]), v) for (n, lab), v in samples.items() if n == name + "_bucket"]
    return sorted(out)


def test_metrics_follow_a_job(daemon: Daemon) -> None:
    m = wait_for(
        lambda: s if value(s := scrape(daemon), "ddpq_gpus", status="free") == 4 else None,
        what="the worker's 4 fake GPUs to show up as free",
    )
    # Every state is there, at 0, before any job exists: dashboards need no "absent" handling.
    assert {st: value(m, "ddpq_jobs", state=st) for st in STATES} == dict.fromkeys(STATES, 0.0)
    assert value(m, "ddpq_queue_length") == 0
    assert value(m, "ddpq_gpus", status="leased") == 0
    assert value(m, "ddpq_gpus", status="external") == 0
    assert value(m, "ddpq_ports_leased") == 0
    assert value(m, "ddpq_build_info", version=__version__) == 1
    for h in ("ddpq_job_duration_seconds", "ddpq_queue_wait_seconds"):
        assert value(m, h + "_count") == 0
        assert buckets(m, h)[-1] == (float("inf"), 0)

    with daemon.client() as c:
        job = c.submit(JobSubmit(command=["sleep", "30"], gpus=2))

        def running() -> Samples | None:
            s = scrape(daemon)
            return s if value(s, "ddpq_jobs", state="running") == 1 else None

        m = wait_for(running, what="ddpq_jobs{state=running} to be 1")
        assert value(m, "ddpq_gpus", status="leased") == 2
        assert value(m, "ddpq_gpus", status="free") == 2
        assert value(m, "ddpq_ports_leased") == 1
        assert value(m, "ddpq_queue_length") == 0
        # It started once: one queue-wait observation, and one scheduling latency.
        assert value(m, "ddpq_queue_wait_seconds_count") == 1
        assert value(m, "ddpq_scheduling_latency_seconds_count") == 1
        assert value(m, "ddpq_job_duration_seconds_count") == 0

        c.cancel(job.id)
        done = wait_done(c, job.id)
        assert done.state == "cancelled"

    m = scrape(daemon)
    assert value(m, "ddpq_jobs", state="running") == 0
    assert value(m, "ddpq_jobs", state="cancelled") == 1
    assert value(m, "ddpq_gpus", status="leased") == 0
    assert value(m, "ddpq_ports_leased") == 0
    assert value(m, "ddpq_job_duration_seconds_count") == 1
    assert done.started_at is not None and done.ended_at is not None
    ran = (done.ended_at - done.started_at).total_seconds()
    assert abs(value(m, "ddpq_job_duration_seconds_sum") - ran) < 1e-3
    # Cumulative buckets: non-decreasing, ending at the count, and the run lands in its bucket.
    hist = buckets(m, "ddpq_job_duration_seconds")
    counts = [n for _, n in hist]
    assert counts == sorted(counts) and counts[-1] == 1
    assert all(n == (1 if le >= ran else 0) for le, n in hist)


def test_metrics_need_no_token(make_daemon: Callable[..., Daemon]) -> None:
    """With --auth the API wants a token but a Prometheus scraper has none: /metrics is public."""
    d = make_daemon("--fake-gpus", "1", "--auth")
    assert httpx.get(d.url + "/v1/jobs", timeout=10).status_code == 401
    m = scrape(d)
    assert value(m, "ddpq_jobs", state="queued") == 0
