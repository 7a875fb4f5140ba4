"""Elastic jobs in the replay (sim/elastic.py, docs/elastic.md): start wide when GPUs are
idle, grow when a blocker ends, shrink for the first job in line, each resize a restart."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddpq.core.policy import Policy
from ddpq.core.preempt import Guards
from ddpq.sim import trace
from ddpq.sim.jobs import SimJob, speedup
from ddpq.sim.replay import replay
from ddpq.sim.trace import TraceJob

GUARDS = Guards(min_run_s=600, max_preemptions=3, restart_cost_s=30)
FAST = 2**0.8  # speedup on twice the GPUs, the default exponent


def job(i: int, submit: float, duration: float, gpus: int, most: int = 0) -> TraceJob:
    return TraceJob(i, gpus, submit, duration, f"u{i}", gpus_max=most)


def ran(jobs: list[TraceJob], gpus: int, policy: str = Policy.FIFO) -> dict[int, SimJob]:
    return {j.trace.id: j for j in replay(jobs, gpus, policy, GUARDS).jobs}


def test_speedup_is_sub_linear_and_one_on_what_was_asked() -> None:
    assert speedup(2, 2, 0.8) == 1.0 and speedup(0, 2, 0.8) == 1.0
    assert speedup(4, 2, 0.8) == pytest.approx(FAST)
    assert 1 < speedup(3, 2, 0.8) < 1.5  # less than the 1.5x more GPUs
    assert speedup(4, 2, 1.0) == 2.0


def test_alone_it_starts_on_its_maximum_at_no_cost() -> None:
    done = ran([job(0, 0, 2000, 2, most=4)], 8)[0]
    assert done.placed == [(0, 1, 2, 3)] and done.resizes == 0
    assert done.finished_at == pytest.approx(2000 / FAST)


def test_it_grows_when_a_blocker_ends_and_pays_one_restart() -> None:
    jobs = ran([job(0, 0, 1000, 2), job(1, 0, 2000, 2, most=4)], 4)
    grown = jobs[1]
    assert [len(g) for g in grown.placed] == [2, 4] and grown.resizes == 1
    # 1000 s on 2 GPUs, the restart, then the other 1000 s of work at FAST.
    assert grown.finished_at == pytest.approx(1000 + 30 + 1000 / FAST)
    assert grown.preemptions == 0


def test_not_before_its_minimum_run() -> None:
    """The blocker ends after 300 s: the elastic job grows 600 s after its start, not then."""
    grown = ran([job(0, 0, 300, 2), job(1, 0, 2000, 2, most=4)], 4)[1]
    assert grown.resizes == 1
    assert grown.finished_at == pytest.approx(600 + 30 + 1400 / FAST)


def test_growth_counts_against_the_cap_on_preemptions_a_shrink_does_not() -> None:
    capped = Guards(min_run_s=600, max_preemptions=0, restart_cost_s=30)
    jobs = [job(0, 0, 1000, 2), job(1, 0, 2000, 2, most=4)]
    kept = {j.trace.id: j for j in replay(jobs, 4, Policy.FIFO, capped).jobs}[1]
    assert kept.resizes == 0 and kept.finished_at == 2000
    jobs = [job(0, 0, 2000, 2, most=4), job(1, 500, 100, 2)]
    shrunk = {j.trace.id: j for j in replay(jobs, 4, Policy.FIFO, capped).jobs}[0]
    assert [len(g) for g in shrunk.placed] == [4, 2] and shrunk.resizes == 1


@pytest.mark.parametrize("policy", [Policy.FIFO, Policy.LAS])
def test_it_shrinks_instead_of_being_preempted_for_the_first_in_line(policy: str) -> None:
    jobs = ran([job(0, 0, 2000, 2, most=4), job(1, 500, 100, 2)], 4, policy)
    wide, waiting = jobs[0], jobs[1]
    assert waiting.first_start == 500  # at once, on the GPUs given back
    # Back to 4 once the other has gone and its minimum run on 2 has passed.
    assert [len(g) for g in wide.placed] == [4, 2, 4] and wide.resizes == 2
    assert wide.preemptions == 0
    # 500 s at FAST; restarted on 2 at 500 (working from 530); grown 600 s after that
    # restart, at 1100; the restart on 4, the rest at FAST.
    left = 2000 - 500 * FAST - 570
    assert wide.finished_at == pytest.approx(1100 + 30 + left / FAST)


def test_nothing_is_given_back_when_it_cannot_make_room() -> None:
    """The waiting job needs 8 GPUs: the elastic job's 2 extra would not start it."""
    jobs = ran([job(0, 0, 2000, 2, most=4), job(1, 0, 5000, 2), job(2, 10, 100, 8)], 8)
    assert jobs[0].resizes == 0 and [len(g) for g in jobs[0].placed] == [4]


def test_gpus_max_is_a_trace_column(tmp_path: Path) -> None:
    jobs = [job(0, 0, 100, 2, most=4), job(1, 5, 100, 1)]
    path = tmp_path / "t.csv"
    trace.write(jobs, path)
    assert trace.read(path) == jobs
    rows = [{"job_id": "1", "num_gpu": "4", "submit_time": "0", "duration": "9", "gpus_max": "2"}]
    with pytest.raises(trace.TraceError, match=r"t\.csv:2: gpus_max 2 < num_gpu 4"):
        trace.parse(rows, "t.csv")


def test_elastic_share_marks_multi_gpu_jobs_only() -> None:
    jobs = trace.lab(200, 1)
    marked = trace.mark_elastic(jobs, 1.0, 1)
    assert all(m.gpus_max == (2 * m.gpus if m.gpus >= 2 else 0) for m in marked)
    half = trace.mark_elastic(jobs, 0.5, 1)
    multi = [m for m in half if m.gpus >= 2]
    assert 0 < sum(m.elastic for m in multi) < len(multi)
    assert trace.mark_elastic(jobs, 0.0, 1) == jobs
