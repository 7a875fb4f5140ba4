"""CPU cores and host memory as leased resources (``core.hostres``, the placement stage's
``host.HostPool``): plain data in, the plan out."""

from __future__ import annotations

import pytest

from ddpq.core import hostres
from ddpq.core.hostres import HostDefaults
from ddpq.core.policy import Order, Policy
from ddpq.core.scheduler import HostUse, QueuedJob, RunningJob, World, decide
from ddpq.core.scheduler.preemption import waiting_for_gpus
from ddpq.core.topology import Hardware

NOW = 1000.0
M = 1 << 20
FAIR = Order(Policy.FAIRSHARE, {})
GPU_DEFAULTS = HostDefaults(cpus_per_gpu=hostres.auto_cpus_per_gpu(2, 4))


def cpu_job(jid: int, cpus: int = 1, ram: int | None = None, owner: str = "alice") -> QueuedJob:
    return QueuedJob(jid, owner, 0, 0, float(jid), needs_port=False, cpus=cpus, ram_bytes=ram)


def gpu_job(jid: int, gpus: int = 1, defaults: HostDefaults = GPU_DEFAULTS) -> QueuedJob:
    cpus = hostres.cores_wanted(gpus, None, defaults)
    return QueuedJob(jid, "bob", gpus, 0, float(jid), cpus=cpus)


def world(host: HostUse, running: list[RunningJob] | None = None, gpus: int = 4) -> World:
    return World(list(range(gpus)), running or [], list(range(29600, 29700)), NOW, host=host)


def test_a_flood_of_one_core_jobs_on_two_cores_runs_two_at_a_time() -> None:
    queued = [cpu_job(i) for i in range(1, 21)]
    held: dict[int, tuple[int, ...]] = {}  # running job -> its core slots
    started: list[int] = []
    for _ in range(10):
        host = HostUse(capacity=2, held=frozenset(s for c in held.values() for s in c))
        plan = decide(queued, world(host), FAIR)
        assert len(plan.placements) + len(held) <= 2
        for p in plan.placements:
            assert not set(p.cores) & set(host.held)  # disjoint from what runs
            held[p.job_id] = p.cores
            started.append(p.job_id)
        waiting = [j for j in queued if j.id not in held and j.id not in started]
        for j in waiting:
            assert plan.reasons[j.id] == "waiting for 1 free CPU core (2 of 2 held)"
            assert plan.stopped_by[j.id] == "cpu_cores"
        queued = [j for j in queued if j.id not in held]
        held.clear()  # both end before the next pass
    assert started == list(range(1, 21))


def test_the_waiting_reason_names_the_cores_asked_and_held() -> None:
    plan = decide([cpu_job(1, cpus=4)], world(HostUse(capacity=4, held=frozenset({0, 1}))), FAIR)
    assert plan.reasons[1] == "waiting for 4 free CPU cores (2 of 4 held)"


def test_gpu_jobs_without_cpus_still_run_four_at_once_on_two_cores() -> None:
    assert GPU_DEFAULTS.cpus_per_gpu == 0  # fewer cores than GPUs: GPU jobs share them
    flood = [cpu_job(i) for i in range(1, 11)]
    gpu = [gpu_job(i) for i in range(11, 15)]
    plan = decide(flood + gpu, world(HostUse(capacity=2)), FAIR)
    placed = {p.job_id: p for p in plan.placements}
    assert all(j.id in placed for j in gpu)
    assert all(placed[j.id].cores == () for j in gpu)
    assert len([p for p in plan.placements if p.job_id <= 10]) == 2


def test_gpu_jobs_get_their_share_of_cores_where_there_are_enough() -> None:
    defaults = HostDefaults(cpus_per_gpu=hostres.auto_cpus_per_gpu(16, 4))
    assert defaults.cpus_per_gpu == 4
    jobs = [gpu_job(1, 2, defaults), gpu_job(2, 1, defaults), gpu_job(3, 1, defaults)]
    plan = decide(jobs, world(HostUse(capacity=16)), FAIR)
    cores = [set(p.cores) for p in plan.placements]
    assert [len(c) for c in cores] == [8, 4, 4]
    assert not (cores[0] & cores[1]) and not (cores[1] & cores[2]) and not (cores[0] & cores[2])


def test_a_job_that_asks_more_cores_than_there_are_never_fits_and_blocks_nobody() -> None:
    plan = decide([cpu_job(1, cpus=3), cpu_job(2)], world(HostUse(capacity=2)), FAIR)
    assert plan.reasons[1] == "needs 3 CPU cores; only 2 can be handed out"
    assert plan.stopped_by[1] == "never_fits"
    assert [p.job_id for p in plan.placements] == [2]


def test_memory_held_by_running_jobs_stays_within_what_jobs_are_given() -> None:
    host = HostUse(capacity=8, job_ram=1000 * M, ram_held=600 * M)
    jobs = [cpu_job(1, ram=300 * M), cpu_job(2, ram=200 * M), cpu_job(3), cpu_job(4, ram=50 * M)]
    plan = decide(jobs, world(host), FAIR)
    placed = {p.job_id: p.ram_bytes for p in plan.placements}
    assert placed == {1: 300 * M, 3: None, 4: 50 * M}  # 600 + 300 + 50 <= 1000
    assert plan.stopped_by[2] == "host_memory"
    assert plan.reasons[2] == "waiting for 200M of free memory (1000M given to jobs)"


def test_memory_beyond_what_jobs_are_given_never_fits() -> None:
    plan = decide([cpu_job(1, ram=2000 * M)], world(HostUse(job_ram=1000 * M)), FAIR)
    assert plan.stopped_by[1] == "never_fits"
    assert "asks 2.0G of memory; jobs here may hold 1000M in all" in plan.reasons[1]


def test_cores_are_not_counted_where_there_is_no_capacity() -> None:
    plan = decide([cpu_job(i, cpus=64) for i in range(1, 4)], world(HostUse()), FAIR)
    assert [p.cores for p in plan.placements] == [(), (), ()]


def test_no_job_is_preempted_for_cores_or_memory() -> None:
    jobs = [cpu_job(1, cpus=2), gpu_job(2)]
    jobs[1] = QueuedJob(2, "bob", 1, 0, 2.0, cpus=2)
    plan = decide(jobs, world(HostUse(capacity=2), gpus=1), FAIR)
    assert plan.stopped_by[2] == "cpu_cores"
    assert waiting_for_gpus(jobs, plan, plan.placements, world(HostUse()).sweep_caps) == []


@pytest.mark.parametrize(
    ("gpus", "cpus", "defaults", "wanted"),
    [
        (0, None, HostDefaults(cpus_per_gpu=8), 1),  # a CPU-only job: one core
        (2, None, HostDefaults(cpus_per_gpu=8), 16),
        (2, None, HostDefaults(cpus_per_gpu=0), 0),  # shares the cores
        (2, 3, HostDefaults(cpus_per_gpu=8), 3),  # its own --cpus
    ],
)
def test_cores_wanted(gpus: int, cpus: int | None, defaults: HostDefaults, wanted: int) -> None:
    assert hostres.cores_wanted(gpus, cpus, defaults) == wanted


def test_ram_wanted_takes_the_job_s_own_then_per_gpu_then_per_job() -> None:
    d = HostDefaults(mem_per_gpu=10 * M, mem=3 * M)
    assert hostres.ram_wanted(2, 5 * M, d) == 5 * M
    assert hostres.ram_wanted(2, None, d) == 20 * M
    assert hostres.ram_wanted(0, None, d) == 3 * M
    assert hostres.ram_wanted(1, None, HostDefaults()) is None


def test_slots_are_the_host_s_cpus_wrapping_round_when_oversubscribed() -> None:
    assert hostres.cpus_of((0, 1), (4, 5, 6)) == (4, 5)
    assert hostres.cpus_of((2, 3, 4), (4, 5, 6)) == (6, 4, 5)
    assert hostres.cpus_of((0, 3), (4, 5, 6)) == (4,)
    assert hostres.cpus_of((0,), ()) == ()


@pytest.mark.parametrize(
    ("cores", "ranks", "threads"), [(8, 4, 2), (2, 4, 1), (7, 2, 3), (4, 0, 4)]
)
def test_threads_per_rank(cores: int, ranks: int, threads: int) -> None:
    assert hostres.threads_per_rank(cores, ranks) == threads


def test_usage_counts_core_hours_beside_gpu_hours() -> None:
    from ddpq.core.usage import By, JobSpan, report

    spans = [
        JobSpan("alice", 0, 0.0, 3600.0, cores=2),  # a CPU job: 2 core-hours, no GPU-hours
        JobSpan("alice", 1, 0.0, 1800.0, cores=4),
        JobSpan("bob", 2, 0.0, 3600.0),  # shared the cores: none counted
    ]
    r = report(spans, [], [], [], {}, 0.0, 7200.0, By.USER)
    rows = {row.key: row for row in r.rows}
    assert (rows["alice"].core_hours, rows["alice"].gpu_hours_jobs) == (4.0, 0.5)
    assert (rows["bob"].core_hours, rows["bob"].gpu_hours_jobs) == (0.0, 2.0)
    assert r.total.core_hours == 4.0
    by_day = report(spans, [], [], [], {}, 0.0, 7200.0, By.DAY)
    assert by_day.total.core_hours == 4.0


@pytest.mark.parametrize(
    ("text", "cpus"),
    [
        ("0-3,8", {0, 1, 2, 3, 8}),
        ("5", {5}),
        (" 2-2 \n", {2}),
        (None, set()),
        ("", set()),
        ("3-1", set()),  # reversed
        ("a-b", set()),
        ("1,,2", set()),
        ("-1", set()),
        ("0-99999999", set()),  # no CPU list names a hundred million CPUs
        ("1-2-3", set()),
    ],
)
def test_a_cpu_list_is_read_or_known_as_nothing(text: str | None, cpus: set[int]) -> None:
    assert hostres.parse_cpulist(text) == cpus


def numa_world(host: HostUse) -> World:
    """Two GPUs on two NUMA nodes: GPU 0 near CPUs 2-3, GPU 1 near CPUs 0-1."""
    near = {0: frozenset({2, 3}), 1: frozenset({0, 1})}
    hardware = Hardware(numa={0: 1, 1: 0}, near=near)
    return World([0, 1], [], list(range(29600, 29700)), NOW, host=host, hardware=hardware)


def test_a_gpu_jobs_cores_come_from_its_gpus_numa_node() -> None:
    host = HostUse(capacity=4, cpus=(0, 1, 2, 3))
    jobs = [QueuedJob(1, "bob", 1, 0, 1.0, cpus=2), QueuedJob(2, "bob", 1, 0, 2.0, cpus=2)]
    plan = decide(jobs, numa_world(host), FAIR)
    cores = {p.gpus: p.cores for p in plan.placements}
    assert cores == {(0,): (2, 3), (1,): (0, 1)}  # first-free would give GPU 0 slots 0, 1


def test_far_cores_are_taken_when_the_near_ones_are_held() -> None:
    host = HostUse(capacity=4, held=frozenset({2}), cpus=(0, 1, 2, 3))
    plan = decide([QueuedJob(1, "bob", 1, 0, 1.0, cpus=2)], numa_world(host), FAIR)
    assert [(p.gpus, p.cores) for p in plan.placements] == [((0,), (3, 0))]


def test_slots_past_the_hosts_cpus_wrap_round_to_their_cpu() -> None:
    """Oversubscribed (8 slots on 4 CPUs): slot i is CPU i % 4, and near is by the CPU."""
    assert hostres.near_first([0, 1, 4, 5, 6, 7], 3, (0, 1, 2, 3), frozenset({2, 3})) == [6, 7, 0]
    assert hostres.near_first([0, 1], 1, (), frozenset({1})) == [0]  # CPUs unknown: in order
