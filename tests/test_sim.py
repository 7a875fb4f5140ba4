"""The trace replay (python -m ddpq.sim): figures checked by hand on tiny traces."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ddpq.core.policy import Policy
from ddpq.core.preempt import Guards
from ddpq.sim import report, trace
from ddpq.sim.replay import replay
from ddpq.sim.trace import TraceJob

SHARED_TRACE = Path(__file__).resolve().parents[2] / "shared" / "traces" / "tiresias_60_job.csv"


def job(i: int, gpus: int, submit: float, duration: float, user: str = "u") -> TraceJob:
    return TraceJob(i, gpus, submit, duration, user)


def test_fifo_by_hand() -> None:
    """2 GPUs. A (2 GPUs, t=0, 10 s) runs 0-10; B (1, t=1, 5 s) and C (1, t=2, 3 s) wait for
    it, then run 10-15 and 10-13. D (2, t=3, 4 s) waits for both: 15-19. E (1, t=4, 1 s) is
    behind D in FIFO, so it waits too, though a GPU is free at 13: 19-20."""
    jobs = [job(0, 2, 0, 10), job(1, 1, 1, 5), job(2, 1, 2, 3), job(3, 2, 3, 4), job(4, 1, 4, 1)]
    got = report.figures(replay(jobs, 2, Policy.FIFO))
    jct = [10, 14, 11, 16, 16]  # end - submit
    delay = [0, 9, 8, 12, 15]  # first start - submit
    assert got["mean_jct"] == pytest.approx(sum(jct) / 5)
    assert got["p99_jct"] == 16
    assert got["mean_queue_delay"] == pytest.approx(sum(delay) / 5)
    assert got["makespan"] == 20
    assert got["gpu_utilisation"] == pytest.approx((2 * 10 + 5 + 3 + 2 * 4 + 1) / (2 * 20))
    assert got["preemptions_per_job"] == 0 and got["unfinished"] == 0


def test_backfill_policies_start_the_small_job_where_fifo_does_not() -> None:
    jobs = [job(0, 2, 0, 10), job(1, 1, 1, 5), job(2, 1, 2, 3), job(3, 2, 3, 4), job(4, 1, 4, 1)]
    e_end = {p: replay(jobs, 2, p).jobs[4].finished_at for p in Policy}
    assert e_end[Policy.FIFO] == 20
    assert e_end[Policy.LAS] == 14  # greedy: on the GPU C frees at 13


def test_las_preempts_a_long_job_for_a_short_one_and_charges_the_restart() -> None:
    """1 GPU, thresholds at 100 GPU-s. The long job (1000 s) has had 200 s when the short
    one (10 s) arrives: it is preempted (it ran past min_run), the short one runs 200-210,
    and the long one resumes paying 30 s: it ends at 210 + 30 + 800 = 1040."""
    jobs = [job(0, 1, 0, 1000), job(1, 1, 200, 10)]
    guards = Guards(min_run_s=50, max_preemptions=3, restart_cost_s=30)
    result = replay(jobs, 1, Policy.LAS, guards, thresholds=(100.0,))
    long, short = result.jobs
    assert short.finished_at == pytest.approx(210)
    assert long.preemptions == 1 and long.finished_at == pytest.approx(1040)
    assert report.figures(result)["preemptions_per_job"] == 0.5


def test_las_does_not_preempt_a_job_that_may_not_be() -> None:
    jobs = [TraceJob(0, 1, 0, 1000, preemptible=False), job(1, 1, 200, 10)]
    result = replay(jobs, 1, Policy.LAS, Guards(50, 3, 30), thresholds=(100.0,))
    assert result.jobs[0].preemptions == 0 and result.jobs[1].finished_at == 1010


@settings(deadline=None)  # a replay of 25 jobs can take over 200 ms on a loaded machine
@given(
    st.lists(
        st.tuples(st.integers(1, 4), st.integers(0, 500), st.integers(1, 300)),
        min_size=1,
        max_size=25,
    ),
    st.sampled_from(list(Policy)),
)
def test_every_job_finishes_once_and_no_gpu_is_used_twice(
    shape: list[tuple[int, int, int]], policy: Policy
) -> None:
    jobs = [job(i, g, s, d, user=f"u{i % 3}") for i, (g, s, d) in enumerate(shape)]
    result = replay(jobs, 4, policy, Guards(min_run_s=20, max_preemptions=2, restart_cost_s=5))
    got = report.figures(result)
    assert got["unfinished"] == 0
    for j in result.jobs:
        assert j.finished_at is not None and j.first_start is not None
        # It ran its whole duration, and paid each restart.
        held = j.busy_gpu_s / j.trace.gpus
        assert held == pytest.approx(j.trace.duration_s + 5 * j.preemptions, abs=1e-6)
    assert 0 < got["gpu_utilisation"] <= 1 + 1e-9
    assert math.isclose(sum(got["user_share"].values()), 1.0)


def test_a_trace_with_a_bad_line_names_it(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("job_id,num_gpu,submit_time,duration\n0,1,0,10\n1,x,5,10\n")
    with pytest.raises(trace.TraceError, match=r"bad\.csv:3"):
        trace.read(bad)
    bad.write_text("job_id,num_gpu,submit_time\n0,1,0\n")
    with pytest.raises(trace.TraceError, match="no duration"):
        trace.read(bad)


def test_the_generated_trace_is_the_same_for_a_seed_and_heavy_tailed() -> None:
    first, again = trace.generate(2000, seed=7), trace.generate(2000, seed=7)
    assert first == again and first != trace.generate(2000, seed=8)
    durations = sorted(j.duration_s for j in first)
    median, p99 = durations[len(durations) // 2], durations[int(0.99 * len(durations))]
    assert 400 < median < 900 and p99 > 30 * median  # a long tail


def test_the_command_line_reads_the_shared_trace_and_writes_json() -> None:
    if not SHARED_TRACE.exists():
        pytest.skip(f"{SHARED_TRACE} is not beside this checkout")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "ddpq.sim",
            "--trace",
            str(SHARED_TRACE),
            "--gpus",
            "8",
            "--policy",
            "fifo",
            "--policy",
            "default",
            "--json",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    fifo, default = json.loads(out.stdout)
    assert fifo["policy"] == "fifo" and fifo["jobs"] == 60 and fifo["unfinished"] == 0
    assert {
        "mean_jct",
        "p99_jct",
        "mean_queue_delay",
        "makespan",
        "gpu_utilisation",
        "preemptions_per_job",
        "user_share",
    } <= set(default)


def test_the_command_line_says_what_is_wrong_with_a_trace(tmp_path: Path) -> None:
    missing = tmp_path / "nope.csv"
    out = subprocess.run(
        [sys.executable, "-m", "ddpq.sim", "--trace", str(missing)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and "nope.csv" in out.stderr and "Traceback" not in out.stderr
