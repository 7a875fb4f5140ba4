"""NVML's topology and MIG instances read through a stand-in for pynvml, and the fake
hardware a topology file describes (``worker.hardware``, ``worker.devices``)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from ddpq.core.gpus import Gpu, hardware_of
from ddpq.core.topology import parse_fake
from ddpq.worker.devices import _mig_instances
from ddpq.worker.hardware import cached_topology, fake_devices, nvml_topology


class NVMLError(Exception):
    pass


def bus(i: int) -> bytes:
    return f"00000000:{0x10 + i:02X}:00.0".encode()


def stub(nvlinks: dict[int, list[bytes]], ancestors: dict[tuple[int, int], int]) -> Any:
    """GPU ``i`` is handle ``i``; its NVLink ``l`` goes to ``nvlinks[i][l]`` (a PCI
    address: a GPU's, or a switch's)."""

    def state(h: int, link: int) -> int:
        if link >= len(nvlinks.get(h, [])):
            raise NVMLError("no such link")
        return 1

    def ancestor(a: int, b: int) -> int:
        if (min(a, b), max(a, b)) not in ancestors:
            raise NVMLError("not supported")
        return ancestors[(min(a, b), max(a, b))]

    return SimpleNamespace(
        NVMLError=NVMLError,
        nvmlDeviceGetPciInfo=lambda h: SimpleNamespace(busId=bus(h)),
        nvmlDeviceGetNvLinkState=state,
        nvmlDeviceGetNvLinkRemotePciInfo=lambda h, link: SimpleNamespace(busId=nvlinks[h][link]),
        nvmlDeviceGetTopologyCommonAncestor=ancestor,
    )


def test_links_lanes_switches_and_numa(tmp_path: Path) -> None:
    switch = b"00000000:99:00.0"
    nvml = stub(
        {0: [bus(1), bus(1)], 1: [bus(0), bus(0)], 2: [switch] * 3, 3: [switch] * 4},
        {(0, 2): 50, (1, 2): 40, (1, 3): 20, (2, 3): 10},
    )
    node = tmp_path / "0000:10:00.0"
    node.mkdir()
    (node / "numa_node").write_text("1\n")
    (node / "local_cpulist").write_text("16-31\n")
    found = nvml_topology(nvml, [0, 1, 2, 3], sysfs=tmp_path)
    assert found[0] == (1, "16-31", ((1, "NV2"), (2, "SYS")))  # 0-3: NVML would not say
    assert found[1][2] == ((0, "NV2"), (2, "NODE"), (3, "PXB"))
    assert found[2][2] == ((0, "SYS"), (1, "NODE"), (3, "NV3"))  # both on the NVSwitch
    assert found[3][:2] == (None, None)  # no sysfs entry: unknown


def test_mig_instances_replace_their_gpu(tmp_path: Path) -> None:
    parent = Gpu(0, "GPU-0", "NVIDIA A100-SXM4-40GB", 40960, 0, (), False, 0, "0-7")
    names = [b"NVIDIA A100-SXM4-40GB MIG 1g.5gb", b"NVIDIA A100-SXM4-40GB MIG 3g.20gb"]
    nvml = SimpleNamespace(
        NVMLError=NVMLError,
        nvmlDeviceGetMigMode=lambda h: (1, 1),
        nvmlDeviceGetMaxMigDeviceCount=lambda h: 7,
        nvmlDeviceGetMigDeviceHandleByIndex=lambda h, n: n if n in (0, 2) else _raise(),
        nvmlDeviceGetUUID=lambda m: f"MIG-{m}",
        nvmlDeviceGetName=lambda m: names[m // 2],
        nvmlDeviceGetMemoryInfo=lambda m: SimpleNamespace(total=(5 << 30) * (m + 1), used=0),
        nvmlDeviceGetComputeRunningProcesses=lambda m: [],
    )
    out = _mig_instances(nvml, "handle", parent, 4)
    assert out is not None
    assert [(g.index, g.uuid, g.mig_profile, g.parent, g.memory_total_mb) for g in out] == [
        (4, "MIG-0", "1g.5gb", 0, 5120),
        (5, "MIG-2", "3g.20gb", 0, 15360),
    ]
    assert out[0].numa == 0 and out[0].cpus == "0-7"
    off = SimpleNamespace(NVMLError=NVMLError, nvmlDeviceGetMigMode=lambda h: (0, 0))
    assert _mig_instances(off, "handle", parent, 4) is None
    old = SimpleNamespace(NVMLError=NVMLError)  # bindings without MIG calls
    assert _mig_instances(old, "handle", parent, 4) is None


def _raise() -> int:
    raise NVMLError("not found")


def test_fake_devices_number_mig_instances_after_the_gpus() -> None:
    text = (
        '{"gpus": [{"index": 0, "name": "A100", "memory": "80G", "mig": ["3g.40gb", '
        '"1g.10gb"]}, {"index": 1, "name": "A100", "numa": 1}, {"index": 2}], '
        '"links": {"1-2": "NV4"}, "default_link": "PHB", "numa_cpus": {"1": "2-3"}}'
    )
    gpus = fake_devices(parse_fake(text, 3))
    assert [(g.index, g.uuid, g.mig_profile, g.parent) for g in gpus] == [
        (1, "FAKE-GPU-1", None, None),
        (2, "FAKE-GPU-2", None, None),
        (3, "MIG-FAKE-0-0", "3g.40gb", 0),
        (4, "MIG-FAKE-0-1", "1g.10gb", 0),
    ]
    assert gpus[0].links == ((0, "PHB"), (2, "NV4")) and gpus[0].cpus == "2-3"
    assert [g.memory_total_mb for g in gpus] == [16384, 16384, 40960, 10240]
    hw = hardware_of(gpus)
    assert hw.mig == {3, 4} and hw.link(1, 2) == "NV4" and hw.names[4] == "A100 MIG 1g.10gb"


def test_the_topology_is_read_once_while_the_same_gpus_are_there(tmp_path: Path) -> None:
    asked: list[tuple[int, int]] = []
    nvml = stub({}, {(0, 1): 10})
    plain = nvml.nvmlDeviceGetTopologyCommonAncestor

    def counted(a: int, b: int) -> int:
        asked.append((a, b))
        return int(plain(a, b))

    nvml.nvmlDeviceGetTopologyCommonAncestor = counted
    first = cached_topology(nvml, [0, 1], ["GPU-a", "GPU-b"])
    assert [links for _, _, links in first] == [((1, "PIX"),), ((0, "PIX"),)]
    assert len(asked) == 2
    assert cached_topology(nvml, [0, 1], ["GPU-a", "GPU-b"]) == first
    assert len(asked) == 2  # the same GPUs: nothing asked again
    cached_topology(nvml, [0, 1], ["GPU-a", "GPU-c"])  # one was replaced: read afresh
    assert len(asked) == 4


def test_a_read_the_driver_left_incomplete_is_asked_again() -> None:
    asked: list[tuple[int, int]] = []
    nvml = stub({}, {})  # no pair described: "not supported"
    plain = nvml.nvmlDeviceGetTopologyCommonAncestor

    def counted(a: int, b: int) -> int:
        asked.append((a, b))
        return int(plain(a, b))

    nvml.nvmlDeviceGetTopologyCommonAncestor = counted
    assert [links for _, _, links in cached_topology(nvml, [0, 1], ["G-x", "G-y"])] == [(), ()]
    cached_topology(nvml, [0, 1], ["G-x", "G-y"])
    assert len(asked) == 4  # not kept: asked again on the next look
