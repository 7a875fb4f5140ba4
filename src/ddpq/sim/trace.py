"""Job traces for the replay: read a CSV, or generate one with heavy-tailed durations."""

from __future__ import annotations

import csv
import math
import random
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

# The columns a trace must have (as the Tiresias simulator's, shared/traces/); others ignored
# but for ``user``, ``priority``, ``reports_progress`` (1: the job writes its fraction done
# every ``--progress-interval``; 0 or absent: never) and ``workload`` (or the Tiresias
# trace's ``model_name``: with the user, the class of its history for the Gittins rank) and
# ``time_limit`` (seconds, as ``--time`` would say; empty: none) and ``gpus_max`` (an elastic
# job's most GPUs, above ``num_gpu``, its least; empty or equal: not elastic).
REQUIRED = ("job_id", "num_gpu", "submit_time", "duration")


class TraceError(ValueError):
    """A trace that cannot be replayed; the message names the line."""


@dataclass(frozen=True)
class TraceJob:
    id: int
    gpus: int
    submit_s: float
    duration_s: float  # how long it runs when it is never stopped
    user: str = "user"
    priority: int = 0
    preemptible: bool = True
    reports_progress: bool = False
    workload: str = ""
    time_limit_s: float | None = None  # as its user asked (``mark_limits``); never enforced
    gpus_max: int = 0  # an elastic job's most GPUs (``num_gpu`` its least); 0: not elastic

    @property
    def elastic(self) -> bool:
        return self.gpus_max > self.gpus


def read(path: Path) -> list[TraceJob]:
    try:
        with path.open(newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError as exc:
        raise TraceError(f"{path}: {exc.strerror or exc}") from None
    return parse(rows, str(path))


def parse(rows: Iterable[dict[str, str]], where: str = "trace") -> list[TraceJob]:
    jobs = []
    for number, row in enumerate(rows, start=2):  # line 1 is the header
        missing = [c for c in REQUIRED if not (row.get(c) or "").strip()]
        if missing:
            raise TraceError(f"{where}:{number}: no {', '.join(missing)}")
        try:
            job = TraceJob(
                id=int(row["job_id"]),
                gpus=int(row["num_gpu"]),
                submit_s=float(row["submit_time"]),
                duration_s=float(row["duration"]),
                user=(row.get("user") or "user").strip() or "user",
                priority=int(row.get("priority") or 0),
                reports_progress=_flag(row.get("reports_progress")),
                workload=(row.get("workload") or row.get("model_name") or "").strip(),
                time_limit_s=float(row["time_limit"])
                if (row.get("time_limit") or "").strip()
                else None,
                gpus_max=int(row.get("gpus_max") or 0),
            )
        except ValueError as exc:
            raise TraceError(f"{where}:{number}: {exc}") from None
        numbers = (job.submit_s, job.duration_s, job.time_limit_s or 0.0)
        if job.gpus < 0 or not all(math.isfinite(x) and x >= 0 for x in numbers):
            raise TraceError(f"{where}:{number}: GPUs, times and durations must be >= 0")
        if job.gpus_max and job.gpus_max < job.gpus:
            raise TraceError(f"{where}:{number}: gpus_max {job.gpus_max} < num_gpu {job.gpus}")
        jobs.append(job)
    ids = [j.id for j in jobs]
    if len(set(ids)) != len(ids):
        raise TraceError(f"{where}: job ids repeat")
    return sorted(jobs, key=lambda j: (j.submit_s, j.id))


def _flag(text: str | None) -> bool:
    value = (text or "0").strip() or "0"
    if value not in ("0", "1"):
        raise ValueError(f"reports_progress is 0 or 1, not {value[:20]!r}")
    return value == "1"


def mark_preemptible(jobs: list[TraceJob], fraction: float, seed: int) -> list[TraceJob]:
    """Each job preemptible with probability ``fraction`` (1: all, as the built-in workload)."""
    rng = random.Random(seed)
    return [replace(j, preemptible=rng.random() < fraction) for j in jobs]


def mark_progress(jobs: list[TraceJob], fraction: float, seed: int) -> list[TraceJob]:
    """Each job reports its progress with probability ``fraction`` (the trace's own
    ``reports_progress`` column replaced): a lab where some jobs write progress and others
    do not. Its own random stream, so ``--preemptible`` draws the same either way."""
    rng = random.Random(f"progress-{seed}")
    return [replace(j, reports_progress=rng.random() < fraction) for j in jobs]


def mark_elastic(jobs: list[TraceJob], share: float, seed: int) -> list[TraceJob]:
    """Each multi-GPU job elastic with probability ``share``, from the GPUs it asked for up to
    twice as many (``gpus_max``), as ``--gpus 2-4`` would ask; its own random stream."""
    rng = random.Random(f"elastic-{seed}")
    return [
        replace(j, gpus_max=2 * j.gpus) if j.gpus >= 2 and rng.random() < share else j for j in jobs
    ]


# Time limits as users ask for them (``mark_limits``): their job's length overstated by a
# factor in this range, rounded up to the next half hour (Slurm users' habit).
LIMIT_FACTORS, LIMIT_STEP_S = (1.5, 4.0), 1800.0


def mark_limits(jobs: list[TraceJob], seed: int) -> list[TraceJob]:
    """A time limit for each job without one: its length times a factor drawn uniformly
    from ``LIMIT_FACTORS``, rounded up to ``LIMIT_STEP_S``. Never enforced by the replay:
    it is what ``squeue --start`` predicts from, and the forecast's cap."""
    rng = random.Random(f"limits-{seed}")
    return [
        j
        if j.time_limit_s is not None
        else replace(
            j,
            time_limit_s=LIMIT_STEP_S
            * math.ceil(j.duration_s * rng.uniform(*LIMIT_FACTORS) / LIMIT_STEP_S),
        )
        for j in jobs
    ]


# The generated trace's shape (see ``generate``).
GPU_COUNTS, GPU_WEIGHTS = (1, 2, 4, 8), (0.6, 0.2, 0.12, 0.08)
MEDIAN_S, SIGMA, SHORTEST_S, LONGEST_S = 600.0, 1.8, 30.0, 3 * 86400.0


def generate(
    count: int, seed: int, users: int = 4, gpus: int = 8, load: float = 0.9
) -> list[TraceJob]:
    """A trace shaped like the public ones (Philly, Helios): Poisson arrivals; mostly 1-GPU
    jobs, some of 2, 4 and 8; log-normal durations with a heavy tail (median 10 min, mean
    ~50 min, one in a hundred over ~16 hours, capped at 3 days); users of unequal appetite
    (each submits half as much as the one before). Arrivals are spaced so that the jobs ask
    for ``load`` of ``gpus`` GPUs on average."""
    rng = random.Random(seed)
    mean_gpus = sum(g * w for g, w in zip(GPU_COUNTS, GPU_WEIGHTS, strict=True))
    mean_duration = MEDIAN_S * math.exp(SIGMA**2 / 2)
    mean_gap = mean_gpus * mean_duration / (gpus * load)
    weights = [2.0**-u for u in range(users)]
    t = 0.0
    jobs = []
    for i in range(count):
        t += rng.expovariate(1.0 / mean_gap)
        n = rng.choices(GPU_COUNTS, weights=GPU_WEIGHTS)[0]
        duration = min(LONGEST_S, max(SHORTEST_S, rng.lognormvariate(math.log(MEDIAN_S), SIGMA)))
        user = f"user{rng.choices(range(users), weights=weights)[0]}"
        jobs.append(TraceJob(i, n, round(t, 3), round(duration, 3), user))
    return jobs


# The lab trace's shape (see ``lab``).
WORKLOADS_PER_USER, WORKLOAD_SIGMA, RUN_SIGMA = 6, 1.7, 0.5


def lab(count: int, seed: int, users: int = 4, gpus: int = 8, load: float = 0.9) -> list[TraceJob]:
    """A lab's trace: ``generate``'s arrivals, users and heavy tail, but each user reruns
    a few workloads (``WORKLOADS_PER_USER`` commands each, with their own GPU count and
    typical length: log-normal around 10 min with sigma ``WORKLOAD_SIGMA``), and a run
    of one lasts its typical length times a log-normal factor of sigma ``RUN_SIGMA``. So a
    user's history of a command tells something of its next run, as in a real lab."""
    rng = random.Random(f"lab-{seed}")
    shapes = {
        (u, w): (
            rng.choices(GPU_COUNTS, weights=GPU_WEIGHTS)[0],
            rng.lognormvariate(math.log(MEDIAN_S), WORKLOAD_SIGMA),
        )
        for u in range(users)
        for w in range(WORKLOADS_PER_USER)
    }
    sigma = math.hypot(WORKLOAD_SIGMA, RUN_SIGMA)
    mean_gpus = sum(g * w for g, w in zip(GPU_COUNTS, GPU_WEIGHTS, strict=True))
    mean_gap = mean_gpus * MEDIAN_S * math.exp(sigma**2 / 2) / (gpus * load)
    weights = [2.0**-u for u in range(users)]
    t = 0.0
    jobs = []
    for i in range(count):
        t += rng.expovariate(1.0 / mean_gap)
        u = rng.choices(range(users), weights=weights)[0]
        w = rng.randrange(WORKLOADS_PER_USER)
        n, typical = shapes[(u, w)]
        duration = typical * rng.lognormvariate(0.0, RUN_SIGMA)
        duration = min(LONGEST_S, max(SHORTEST_S, duration))
        jobs.append(TraceJob(i, n, round(t, 3), round(duration, 3), f"user{u}", workload=f"cmd{w}"))
    return jobs


def write(jobs: Iterable[TraceJob], path: Path) -> None:
    with path.open("w", newline="") as f:
        out = csv.writer(f)
        header = ["user", "priority", "reports_progress", "workload", "time_limit", "gpus_max"]
        out.writerow([*REQUIRED, *header])
        for j in jobs:
            out.writerow(
                [
                    j.id,
                    j.gpus,
                    j.submit_s,
                    j.duration_s,
                    j.user,
                    j.priority,
                    int(j.reports_progress),
                    j.workload,
                    "" if j.time_limit_s is None else j.time_limit_s,
                    j.gpus_max or "",
                ]
            )
