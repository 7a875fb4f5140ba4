"""core.sharing's measurements and rules, the out-of-memory requeue, reservation times."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest

from ddpq.core.disposition import (
    ATTEMPT_HEADER,
    JobFacts,
    after_exit,
    attempt_header,
    cuda_out_of_memory,
)
from ddpq.core.gpus import Gpu, GpuProcess
from ddpq.core.limits import Reservation, peak_reserved
from ddpq.core.rules import ExitRecord
from ddpq.core.sharing import (
    MIB,
    MIN_GPU_MEM,
    auto_reservation,
    job_use,
    outside_bytes,
    peaks,
)
from ddpq.core.states import JobState
from ddpq.core.units import parse_when, size_for_people

G = 1 << 30


def gpu(index: int, *procs: tuple[int, int | None]) -> Gpu:
    return Gpu(index, f"u{index}", "g", 16384, 0, tuple(GpuProcess(p, m) for p, m in procs), False)


def test_each_jobs_use_and_peak_from_one_sample() -> None:
    devices = [gpu(0, (10, 1000), (11, 500), (99, 4000)), gpu(1, (12, 3000), (13, None))]
    use = job_use(devices, {1: {10, 11, 12}, 2: {13}, 3: {77}})
    assert use == {(1, 0): 1500 * MIB, (1, 1): 3000 * MIB}
    assert peaks(use) == {1: 3000 * MIB}  # the most on any one GPU: a reservation is per GPU


def test_outside_is_what_no_reservation_covers() -> None:
    used = {0: 12 * G, 1: 4 * G, 2: 0}
    use = {(1, 0): 3 * G, (2, 0): 6 * G, (3, 1): 4 * G}
    sharers = {0: {1: 5 * G, 2: 4 * G}, 1: {3: 5 * G}}
    # GPU 0: 12G used; job 1 is within its 5G, job 2 uses 2G over its 4G; 12 - 3 - 4 = 5G.
    assert outside_bytes(used, use, sharers) == {0: 5 * G, 1: 0, 2: 0}


def test_auto_reserves_the_measured_peak_and_a_margin() -> None:
    assert auto_reservation(None, 0.1) is None  # no successful run: a whole GPU
    assert auto_reservation([], 0.1) is None
    assert auto_reservation([4 * G, 3 * G], 0.1) == 4506 * MIB  # 4096 MiB * 1.1, rounded up
    assert auto_reservation([10 * MIB], 0.1) == MIN_GPU_MEM
    assert auto_reservation([4 * G], -1.0) == 4 * G


# ---- running out of memory --------------------------------------------------------


def facts(shared: int | None, oom_requeues: int = 0) -> JobFacts:
    return JobFacts(1, 0, 0, None, shared_mem_bytes=shared, oom_requeues=oom_requeues)


def ended(code: int) -> ExitRecord:
    return ExitRecord(code, None, 1.0, 2.0)


def decide(job: JobFacts, oom: bool, code: int = 1) -> tuple[JobState, str, bool]:
    d = after_exit(
        ended(code), job, grace_s=1, max_port_retries=3, now=3.0, out_of_memory=lambda: oom
    )
    return d.job_state, d.job_reason, d.oom_requeue


def test_a_sharing_job_out_of_memory_is_requeued_once_on_a_whole_gpu() -> None:
    state, reason, requeue = decide(facts(5 * G), True)
    assert (state, requeue) == (JobState.QUEUED, True)
    assert reason == (
        "ran out of GPU memory (CUDA out of memory) sharing a GPU with 5G reserved; "
        "requeued once on a whole GPU"
    )
    assert decide(facts(5 * G, oom_requeues=1), True)[0] is JobState.FAILED  # once
    assert decide(facts(None), True)[0] is JobState.FAILED  # it had its GPU whole
    assert decide(facts(5 * G), False)[0] is JobState.FAILED  # another failure
    assert decide(facts(5 * G), True, code=0)[0] is JobState.SUCCEEDED


def test_out_of_memory_is_read_from_this_attempts_output_only() -> None:
    header = attempt_header("now", [0], 29600)
    torch = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    assert cuda_out_of_memory(header + torch)
    assert cuda_out_of_memory(header + "RuntimeError: CUDA error: out of memory\n")
    assert cuda_out_of_memory(header + "jax: CUDA_ERROR_OUT_OF_MEMORY: out of memory")
    assert not cuda_out_of_memory(torch)  # no header: not this attempt's
    assert not cuda_out_of_memory(header + torch + "\n" + header + "Traceback: KeyError\n")
    assert not cuda_out_of_memory(header + "MemoryError (host memory)\n")
    assert ATTEMPT_HEADER in header


# ---- reservations' times and sizes --------------------------------------------------


def test_parse_when() -> None:
    now = 1_800_000_000.0
    assert parse_when("now", now) == now
    assert parse_when("+2h", now) == now + 7200
    assert parse_when("+30m", now, after=now + 100) == now + 1900
    utc = datetime(2030, 1, 2, 9, 0, tzinfo=UTC).timestamp()
    assert parse_when("2030-01-02T09:00+00:00", now) == utc
    local = time.mktime((2030, 1, 2, 9, 0, 0, 0, 0, -1))
    assert parse_when("2030-01-02 09:00", now) == local
    for bad in ("", "tomorrow", "+", "+-1h", "2030-13-01"):
        with pytest.raises(ValueError):
            parse_when(bad, now)


def test_size_for_people() -> None:
    assert [size_for_people(n) for n in (5 * G, 4506 * MIB, 300 * MIB, 1000)] == [
        "5G",
        "4.4G",
        "300M",
        "1000",
    ]


def test_peak_reserved_counts_only_windows_that_overlap() -> None:
    rs = [
        Reservation(1, "a", 2, 0, 10),
        Reservation(2, "b", 3, 5, 15),
        Reservation(3, "c", 4, 15, 20),
    ]
    assert peak_reserved(rs) == 5
    assert peak_reserved(rs, Reservation(4, "d", 1, 10, 16)) == 5  # b + c never overlap
    assert peak_reserved(rs, Reservation(4, "d", 1, 14, 16)) == 5  # 3 + 1 and 4 + 1
    assert peak_reserved(rs, Reservation(4, "d", 2, 0, 30)) == 7
