"""The topology model, fake topology files, and best-connected placement (issue 24)."""

from __future__ import annotations

import json

import pytest

from ddpq.core.policy import Order, Policy
from ddpq.core.scheduler import QueuedJob, RunningJob, World, decide
from ddpq.core.scheduler.placers import FIRST_FREE, BestConnected, placer_for
from ddpq.core.topology import (
    Hardware,
    TopologyError,
    matrix,
    parse_fake,
    rank,
    required_class,
)

FIFO = Order(Policy.FIFO, {})
NOW = 1000.0


def box8() -> Hardware:
    """Eight GPUs: NVLink pairs 0-1, 2-3, 4-5, 6-7; 0-3 on socket 0, 4-7 on socket 1."""
    links = {(a, a + 1): "NV12" for a in (0, 2, 4, 6)}
    for a in range(8):
        for b in range(a + 1, 8):
            if (a, b) not in links and a // 4 == b // 4:
                links[(a, b)] = "NODE"
    return Hardware(
        links, "SYS", {g: "NVIDIA A100-SXM4-80GB" for g in range(8)}, {g: g // 4 for g in range(8)}
    )


def job(i: int, gpus: int, **kw: object) -> QueuedJob:
    return QueuedJob(i, "ann", gpus, 0, float(i), **kw)  # type: ignore[arg-type]


def run(queued: list[QueuedJob], hw: Hardware, running: tuple[RunningJob, ...] = ()):  # type: ignore[no-untyped-def]
    world = World(range(8), list(running), list(range(29500, 29520)), NOW, hardware=hw)
    return decide(queued, world, FIFO)


def busy(i: int, *gpus: int) -> RunningJob:
    return RunningJob(100 + i, gpus, NOW - 10)


def test_ranks_follow_nvidia_smi_words() -> None:
    assert [rank(w) for w in ("NV4", "NV12", "PIX", "PXB", "PHB", "NODE", "SYS")] == [
        0,
        0,
        1,
        2,
        3,
        4,
        5,
    ]
    with pytest.raises(TopologyError):
        rank("NVLINK")
    assert required_class("NVLink") == "NV" and required_class(" node ") == "NODE"
    with pytest.raises(TopologyError, match="unknown --gpu-link"):
        required_class("fast")


def test_two_gpu_job_gets_an_nvlink_pair_not_the_first_free() -> None:
    # 0 and 3 busy: first free would give 1,2 (NODE); the best pair is 4-5.
    plan = run([job(1, 2)], box8(), (busy(1, 0), busy(2, 3)))
    assert plan.placements[0].gpus == (4, 5)


def test_one_gpu_job_takes_a_gpu_whose_partner_is_busy() -> None:
    # GPU 1's NVLink partner 0 is busy: taking 1 breaks no free pair.
    plan = run([job(1, 1), job(2, 2)], box8(), (busy(1, 0),))
    assert [p.gpus for p in plan.placements] == [(1,), (2, 3)]


def test_one_gpu_jobs_pack_so_a_pair_is_left() -> None:
    plan = run([job(i, 1) for i in range(1, 7)] + [job(9, 2)], box8())
    taken = [p.gpus for p in plan.placements]
    assert taken[-1] in {(0, 1), (2, 3), (4, 5), (6, 7)}, taken


def test_four_gpu_job_stays_on_one_socket() -> None:
    plan = run([job(1, 4)], box8(), (busy(1, 0),))
    assert plan.placements[0].gpus == (4, 5, 6, 7)


def test_gpu_link_nvlink_waits_rather_than_take_a_worse_pair() -> None:
    plan = run([job(1, 2, gpu_link="NV")], box8(), (busy(1, 0), busy(2, 2), busy(3, 4), busy(4, 6)))
    assert plan.placements == []
    assert plan.stopped_by[1] == "hardware"
    assert "linked by NVLink or better" in plan.reasons[1]
    # Without the requirement it takes the best there is.
    plan = run([job(1, 2)], box8(), (busy(1, 0), busy(2, 2), busy(3, 4), busy(4, 6)))
    assert plan.placements[0].gpus == (1, 3)  # NODE beats SYS


def test_a_link_no_set_here_has_never_fits() -> None:
    plan = run([job(1, 4, gpu_link="NV"), job(2, 1)], box8())
    assert plan.stopped_by[1] == "no_such_hardware"
    assert "no such set exists" in plan.reasons[1]
    assert [p.job_id for p in plan.placements] == [2]  # it blocks nobody


def test_gpu_type_matches_names_case_insensitively() -> None:
    hw = Hardware({}, "SYS", {0: "NVIDIA A100", 1: "NVIDIA H100 80GB HBM3", 2: "NVIDIA H100"}, {})
    world = World([0, 1, 2], [], [29500, 29501], NOW, hardware=hw)
    plan = decide([job(1, 2, gpu_type="h100"), job(2, 1, gpu_type="a100")], world, FIFO)
    assert {p.job_id: p.gpus for p in plan.placements} == {1: (1, 2), 2: (0,)}
    plan = decide([job(1, 1, gpu_type="v100")], world, FIFO)
    assert plan.stopped_by[1] == "no_such_hardware"
    assert "type 'v100'; this host has 0" in plan.reasons[1]
    busy_world = World([0, 1, 2], [busy(1, 1)], [29500], NOW, hardware=hw)
    plan = decide([job(1, 2, gpu_type="h100")], busy_world, FIFO)
    assert plan.reasons[1] == "waiting for 2 free GPUs of type 'h100' (1 free now)"


def test_mig_profiles_are_types() -> None:
    hw = Hardware({}, "SYS", {8: "A100 MIG 3g.40gb", 9: "A100 MIG 1g.10gb", 0: "A100"}, {})
    world = World([0, 8, 9], [], [29500], NOW, hardware=hw)
    plan = decide([job(1, 1, gpu_type="1g.10gb")], world, FIFO)
    assert plan.placements[0].gpus == (9,)


def test_no_hardware_means_first_free() -> None:
    assert placer_for(job(1, 2)) is FIRST_FREE
    assert isinstance(placer_for(job(1, 2), box8()), BestConnected)


def test_large_hosts_grow_sets_greedily() -> None:
    links = {(a, a + 1): "NV4" for a in range(0, 32, 2)}
    hw = Hardware(links, "SYS", {}, {})
    world = World(range(32), [], [29500], NOW, hardware=hw)
    plan = decide([job(1, 8)], world, FIFO)  # C(32, 8) sets: too many to try each
    gpus = plan.placements[0].gpus
    assert len(gpus) == 8 and all(g ^ 1 in gpus for g in gpus)  # whole pairs


def test_matrix_is_like_nvidia_smi() -> None:
    rows = matrix([0, 1], Hardware({(0, 1): "NV12"}, "SYS", {}, {0: 0, 1: 0}), {0: "0-3"})
    assert rows == [
        ["", "GPU0", "GPU1", "CPU Affinity", "NUMA Affinity"],
        ["GPU0", "X", "NV12", "0-3", "0"],
        ["GPU1", "NV12", "X", "N/A", "0"],
    ]


GOOD = {
    "gpus": [
        {"index": 0, "name": "NVIDIA A100-SXM4-80GB", "memory": "80G", "numa": 0,
         "mig": ["3g.40gb", "3g.40gb"]},
        {"index": 1, "name": "NVIDIA A100-SXM4-80GB", "memory": "80G", "numa": 1},
    ],
    "links": {"0-1": "NV12"},
    "default_link": "SYS",
    "numa_cpus": {"0": "0", "1": "1"},
}  # fmt: skip


def test_a_good_file_parses() -> None:
    fake = parse_fake(json.dumps(GOOD), 2)
    assert fake.gpus[0].mig == ("3g.40gb", "3g.40gb") and fake.gpus[0].memory_mb == 80 * 1024
    assert fake.links == {(0, 1): "NV12"} and fake.numa_cpus == {0: "0", 1: "1"}


def _with(**change: object) -> str:
    doc = json.loads(json.dumps(GOOD))
    for key, value in change.items():
        if key.startswith("gpu0_"):
            doc["gpus"][0][key[5:]] = value
        elif value is None:
            del doc[key]
        else:
            doc[key] = value
    return json.dumps(doc)


@pytest.mark.parametrize(
    ("text", "count", "says"),
    [
        ("{", 2, "not JSON"),
        ("[]", 2, "JSON object"),
        ("{}", 2, "'gpus' must be a non-empty list"),
        (_with(gpus=[]), 2, "non-empty"),
        (_with(extra=1), 2, "unknown key 'extra'"),
        (_with(), 3, "indexes 0..2"),
        (_with(gpu0_index="0"), 2, "'index' must be an integer"),
        (_with(gpu0_index=True), 2, "'index' must be an integer"),
        (_with(gpu0_name=""), 2, "'name'"),
        (_with(gpu0_name="a\x1b[2J"), 2, "'name'"),
        (_with(gpu0_memory="lots"), 2, "'memory'"),
        (_with(gpu0_memory=80), 2, "'memory'"),
        (_with(gpu0_numa=-1), 2, "'numa'"),
        (_with(gpu0_mig="3g.40gb"), 2, "'mig' must be a list"),
        (_with(gpu0_mig=["big"]), 2, "MIG profile 'big'"),
        (_with(gpu0_colour="red"), 2, "unknown key 'colour'"),
        (_with(links={"0-0": "NV1"}), 2, "two different GPUs"),
        (_with(links={"0-7": "NV1"}), 2, "two different GPUs"),
        (_with(links={"a": "NV1"}), 2, "two GPU indexes"),
        (_with(links={"0-1": "NVLINK"}), 2, "unknown link 'NVLINK'"),
        (_with(links={"0-1": "NV1", "1-0": "NV2"}), 2, "given twice"),
        (_with(links=[]), 2, "'links' must map"),
        (_with(default_link="FAST"), 2, "unknown link"),
        (_with(default_link=5), 2, "'default_link'"),
        (_with(numa_cpus={"x": "0"}), 2, "numa_cpus"),
        (_with(numa_cpus={"0": "0-"}), 2, "numa_cpus"),
        ("[" * 100000, 2, "not JSON"),
    ],
)
def test_bad_files_say_what_is_wrong_in_one_line(text: str, count: int, says: str) -> None:
    with pytest.raises(TopologyError) as err:
        parse_fake(text, count)
    assert says in str(err.value) and "\n" not in str(err.value)
