"""Sharing GPUs by memory, limits and reservations through the real worker loop and store,
with the fake executor, a hand-moved clock and GPUs a test describes as NVML would."""

from __future__ import annotations

import dataclasses
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ddpq.core.disposition import attempt_header
from ddpq.core.gpus import Gpu, GpuProcess
from ddpq.core.limits import EVERYONE
from ddpq.core.states import JobState
from ddpq.jobdir import JobDir
from ddpq.store import limits as limit_store
from ddpq.store import memory as memory_store
from ddpq.store.models import Attempt
from ddpq.worker.devices import discover
from tests.worker.rig import Rig, make_rig

G = 1 << 30
MIB = 1 << 20
Q, R, S, F = JobState.QUEUED, JobState.RUNNING, JobState.SUCCEEDED, JobState.FAILED


class Gpus:
    """What "NVML" shows: fake GPUs of 16 GiB, with the processes a test puts on them."""

    def __init__(self, n: int) -> None:
        self.devices = discover(n)

    def put(self, gpu: int, pid: int, mb: int) -> None:
        d = self.devices[gpu]
        procs = (*[p for p in d.processes if p.pid != pid], GpuProcess(pid, mb))
        used = sum(p.used_memory_mb or 0 for p in procs)
        self.devices[gpu] = dataclasses.replace(d, processes=procs, memory_used_mb=used)

    def __call__(self) -> list[Gpu]:
        return list(self.devices)


@pytest.fixture
def gpus() -> Gpus:
    return Gpus(1)


@pytest.fixture
def rig(tmp_path: Path, gpus: Gpus) -> Iterator[Rig]:
    r = make_rig(tmp_path / "home", look=gpus, fake_gpus=1, max_user_ports=10)
    yield r
    r.close()


def live_leases(rig: Rig) -> list[tuple[int, str, int, int | None]]:
    with sqlite3.connect(rig.settings.db_path) as conn:
        return list(
            conn.execute(
                "SELECT job_id, kind, resource, mem_bytes FROM leases "
                "WHERE released_at IS NULL AND kind IN ('gpu', 'gpu_share') ORDER BY job_id"
            )
        )


def test_three_5g_jobs_share_a_16g_gpu_a_fourth_and_a_whole_gpu_job_wait(rig: Rig) -> None:
    sharing = [rig.submit(gpu_mem_bytes=5 * G) for _ in range(4)]
    whole = rig.submit()
    rig.step()
    assert [rig.job(j).state for j in sharing] == [R, R, R, Q]
    assert rig.job(sharing[3]).reason == "waiting for 5G of memory free on a GPU (next in line)"
    assert rig.job(whole).state is Q
    assert live_leases(rig) == [(j, "gpu_share", 0, 5 * G) for j in sharing[:3]]
    launch = rig.host.attempt_of(sharing[0]).launch
    assert launch.reserved_mem_bytes == 5 * G and launch.gpus == (0,)
    events = [e[2] for e in rig.job(sharing[0]).events]
    assert "leased GPUs [0], port 29600, sharing them: 5G reserved on each" in events
    rig.host.finish(sharing[0], 0)
    rig.step()
    assert rig.job(sharing[3]).state is R and rig.job(whole).state is Q
    for j in sharing[1:]:
        rig.host.finish(j, 0)
    rig.step()
    assert rig.job(whole).state is R and live_leases(rig) == [(whole, "gpu", 0, None)]
    later = rig.submit(gpu_mem_bytes=2 * G)
    rig.step()
    assert rig.job(later).state is Q  # a whole-GPU job never shares


def test_an_outside_process_holding_10g_leaves_room_for_one(rig: Rig, gpus: Gpus) -> None:
    gpus.put(0, 4242, 10 * 1024)  # not a ddpq job's: outside use
    rig.worker._refresh_devices(force=True)
    first, second = rig.submit(gpu_mem_bytes=5 * G), rig.submit(gpu_mem_bytes=5 * G)
    whole = rig.submit()
    rig.step()
    assert (rig.job(first).state, rig.job(second).state, rig.job(whole).state) == (R, Q, Q)
    # The external GPU is not handed out whole (--external-gpus avoid)...
    assert rig.job(whole).reason == "needs 1 GPU; only 0 can be handed out"


def test_each_attempts_peak_is_sampled_and_auto_learns_it(rig: Rig, gpus: Gpus) -> None:
    first = rig.submit(name="train", gpu_mem_auto=True, mem_key="name:train")
    rig.step()
    assert live_leases(rig) == [(first, "gpu", 0, None)]  # no history: a whole GPU
    rig.host.pids[first] = {100, 101}
    gpus.put(0, 100, 3000)
    gpus.put(0, 101, 1000)
    gpus.put(0, 999, 500)  # someone else's
    rig.worker._refresh_devices(force=True)
    gpus.put(0, 100, 2000)  # less later: the peak stays
    rig.worker._refresh_devices(force=True)
    with rig.api.read() as s:
        assert memory_store.latest_peaks(s, [first]) == {first: 4000 * MIB}
    rig.host.finish(first, 0)
    rig.step()
    second = rig.submit(name="train", gpu_mem_auto=True, mem_key="name:train")
    rig.step()
    assert live_leases(rig) == [(second, "gpu_share", 0, 4400 * MIB)]  # + 10%


def write_log(job_dir: str | None, *lines: str) -> None:
    assert job_dir is not None
    folder = JobDir(Path(job_dir))
    folder.path.mkdir(parents=True, exist_ok=True)
    with folder.log.open("a") as f:
        f.write(attempt_header("2026-12-02 12:00:00", [0], 29600))
        f.write("".join(line + "\n" for line in lines))


def test_a_sharing_job_out_of_memory_is_requeued_once_on_a_whole_gpu(rig: Rig) -> None:
    job = rig.submit(gpu_mem_bytes=4 * G, max_retries=0)
    rig.step()
    write_log(rig.job(job).job_dir, "torch.OutOfMemoryError: CUDA out of memory. Tried to")
    rig.host.finish(job, 1)
    rig.step()
    view = rig.job(job)
    assert view.state is R  # requeued and started again at once, whole
    assert live_leases(rig) == [(job, "gpu", 0, None)]
    assert "requeued once on a whole GPU" in view.events[-3][2]
    assert view.attempts[0][1] is F
    write_log(view.job_dir, "RuntimeError: CUDA error: out of memory")
    rig.host.finish(job, 1)
    rig.step()
    assert rig.job(job).state is F  # once: on a whole GPU it is a plain failure


def test_a_user_at_their_limit_waits_with_the_reason(rig: Rig) -> None:
    with rig.api.write() as s:
        limit_store.set_limit(s, "alice", {"jobs": 1, "gpus": 1}, 0.0)
        limit_store.set_limit(s, EVERYONE, {"gpus": 0}, 0.0)
    first = rig.submit(gpu_mem_bytes=2 * G)
    second = rig.submit(gpu_mem_bytes=2 * G)
    bobs = rig.submit(owner="bob")
    rig.step()
    assert (rig.job(first).state, rig.job(second).state) == (R, Q)
    assert rig.job(second).reason == "at alice's limit of 1 running job"
    assert rig.job(bobs).reason == "needs 1 GPU, more than bob's limit of 0"


def test_a_reservation_holds_its_gpus(tmp_path: Path) -> None:
    rig = make_rig(tmp_path / "two", fake_gpus=2)
    try:
        now = rig.clock()
        with rig.api.write() as s:
            limit_store.add_reservation(
                s, "alice", 1, now + 600, now + 7200, by="root", now=now, total_gpus=2
            )
        long = [rig.submit(owner="bob") for _ in range(2)]
        short = rig.submit(owner="bob", time_limit_s=300.0)
        rig.step()
        assert [rig.job(j).state for j in [*long, short]] == [R, Q, R]
        assert rig.job(long[1]).reason == (
            "without a time limit it would run into reservation 1 (1 GPU for alice)"
        )
    finally:
        rig.close()


def test_no_one_is_preempted_for_or_by_a_job_that_shares(tmp_path: Path) -> None:
    rig = make_rig(tmp_path / "las", fake_gpus=1, preempt_min_run_s=0.0)
    try:
        # A long-running preemptible job: under LAS it ranks worse than a new one.
        old = rig.submit(preemptible=True)
        rig.step()
        with rig.api.write() as s:
            s.query(Attempt).filter_by(job_id=old).update({"started_at": rig.clock() - 7200})
        shares = rig.submit(gpu_mem_bytes=2 * G)
        rig.step()
        assert rig.job(old).stop_request is None and rig.job(shares).state is Q
        rig.host.finish(old, 0)
        rig.step()
        assert rig.job(shares).state is R
        with rig.api.write() as s:
            s.query(Attempt).filter_by(job_id=shares).update({"started_at": rig.clock() - 7200})
        whole = rig.submit()
        rig.step()
        assert rig.job(shares).stop_request is None and rig.job(whole).state is Q
    finally:
        rig.close()


# ---- the lease table over any sequence of submissions and ends ------------------------


def check_leases(rig: Rig) -> None:
    with sqlite3.connect(rig.settings.db_path) as conn:
        rows = list(
            conn.execute(
                "SELECT resource, kind, mem_bytes FROM leases "
                "WHERE released_at IS NULL AND kind IN ('gpu', 'gpu_share')"
            )
        )
    for gpu in {r[0] for r in rows}:
        on = [r for r in rows if r[0] == gpu]
        kinds = {r[1] for r in on}
        assert kinds in ({"gpu"}, {"gpu_share"}), on
        if kinds == {"gpu"}:
            assert len(on) == 1, on
        else:
            assert sum(r[2] for r in on) <= 15 * G, on  # 16 GiB less the 1 GiB headroom


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("whole"), st.integers(1, 2)),
            st.tuples(st.just("share"), st.sampled_from([2, 5, 7, 15])),
            st.tuples(st.just("end"), st.integers(0, 100)),
        ),
        min_size=1,
        max_size=25,
    )
)
def test_over_any_sequence_the_leases_never_over_commit(
    tmp_path_factory: pytest.TempPathFactory, sequence: list[tuple[str, int]]
) -> None:
    rig = make_rig(tmp_path_factory.mktemp("seq") / "home", fake_gpus=2)
    try:
        for kind, n in sequence:
            if kind == "whole":
                rig.submit(gpus=n)
            elif kind == "share":
                rig.submit(gpu_mem_bytes=n * G)
            elif running := rig.host.running():
                rig.host.finish(running[n % len(running)], 0)
            rig.step()
            check_leases(rig)
    finally:
        rig.close()
