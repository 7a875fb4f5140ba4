"""Where this host's GPUs sit: fake hardware from a topology file, and NVML's topology.

``ddpq serve --fake-gpus N --fake-topology FILE`` pretends the N GPUs are the models, links,
NUMA nodes and MIG instances the file describes (``core.topology.parse_fake`` checks it).
On real GPUs, NVML says the same (``nvml_topology``): for each pair the common PCIe
ancestor (``nvmlDeviceGetTopologyCommonAncestor``) or the NVLink lanes between them, and
for each GPU its NUMA node and that node's CPUs, from sysfs by the GPU's PCI address.

MIG: a GPU split into instances is not handed out itself; each instance is a GPU of its
own, numbered after the physical GPUs (N, N+1, ...), named by its ``MIG-...`` UUID in a
job's ``CUDA_VISIBLE_DEVICES``, its ``parent`` the physical GPU (whose device file the
job may open).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ddpq.core.gpus import Gpu
from ddpq.core.topology import FakeTopology, TopologyError, parse_fake

FAKE_MEMORY_MB = 16384
# The largest topology file read: a thousand GPUs' worth is far less.
MAX_FILE_BYTES = 1 << 20


class TopologyUnusable(ValueError):
    """The fake topology file cannot be used; one line."""


def load_fake(path: Path, count: int) -> FakeTopology:
    """The checked fake topology file (raises TopologyUnusable naming the file)."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise TopologyUnusable(f"--fake-topology {path}: {exc.strerror or exc}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise TopologyUnusable(f"--fake-topology {path}: larger than {MAX_FILE_BYTES} bytes")
    try:
        return parse_fake(raw.decode("utf-8"), count)
    except UnicodeDecodeError:
        raise TopologyUnusable(f"--fake-topology {path}: not UTF-8 text") from None
    except TopologyError as exc:
        raise TopologyUnusable(f"--fake-topology {path}: {exc}") from None


def fake_uuid(index: int) -> str:
    return f"FAKE-GPU-{index}"


def fake_devices(topo: FakeTopology) -> list[Gpu]:
    """The fake GPUs the file describes: whole ones, and each MIG instance after them."""
    hw = topo.hardware()
    indexes = [g.index for g in topo.gpus]
    whole: list[Gpu] = []
    instances: list[Gpu] = []
    for g in topo.gpus:
        memory = g.memory_mb or FAKE_MEMORY_MB
        numa = g.numa
        cpus = topo.numa_cpus.get(numa) if numa is not None else None
        links = tuple((o, hw.link(g.index, o)) for o in indexes if o != g.index)
        if not g.mig:
            whole.append(_fake(g.index, fake_uuid(g.index), g.name, memory, numa, cpus, links))
            continue
        for n, profile in enumerate(g.mig):
            index = len(topo.gpus) + len(instances)
            uuid = f"MIG-FAKE-{g.index}-{n}"
            mem = _profile_mb(profile, memory)
            instances.append(_fake(index, uuid, g.name, mem, numa, cpus, (), profile, g.index))
    return whole + instances


def _fake(
    index: int,
    uuid: str,
    name: str,
    memory: int,
    numa: int | None,
    cpus: str | None,
    links: tuple[tuple[int, str], ...],
    profile: str | None = None,
    parent: int | None = None,
) -> Gpu:
    return Gpu(index, uuid, name, memory, 0, (), True, numa, cpus, links, profile, parent)


def _profile_mb(profile: str, whole_mb: int) -> int:
    """A MIG profile's memory (``3g.40gb``: 40 GB), at most the GPU's."""
    gb = int(profile.split(".")[1].split("gb")[0])
    return min(whole_mb, gb * 1024)


# nvmlDeviceGetTopologyCommonAncestor's levels, in nvidia-smi's words.
_LEVELS = {0: "PIX", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
_NVLINK_MAX = 18


def _bus(pynvml: Any, handle: Any) -> str:
    return _bus_of(pynvml.nvmlDeviceGetPciInfo(handle))


def _bus_of(info: Any) -> str:
    """A PCI info's address as sysfs names it (``0000:3b:00.0``; NVML: ``00000000:3B:00.0``)."""
    bus = info.busId
    text = bus.decode() if isinstance(bus, bytes) else str(bus)
    domain, rest = text.split(":", 1)
    return f"{int(domain, 16):04x}:{rest.lower()}"


Placed = list[tuple[int | None, str | None, tuple[tuple[int, str], ...]]]

# The last topology read, by the GPUs' UUIDs in index order: links and NUMA nodes do not
# change while the same GPUs are there, and reading them is a call per pair and per
# NVLink lane (hundreds on an 8-GPU box), every ``gpu_poll_s``. A GPU that goes or comes
# (a reset, a hot-plugged box) changes the key and the topology is read afresh.
_last_read: tuple[tuple[str, ...], Placed] | None = None


def cached_topology(pynvml: Any, handles: Sequence[Any], uuids: Sequence[str]) -> Placed:
    """``nvml_topology``, read once for a given set of GPUs."""
    global _last_read
    key = tuple(uuids)
    if _last_read is not None and _last_read[0] == key:
        return _last_read[1]
    placed = nvml_topology(pynvml, handles)
    # A read with a pair the driver would not describe is not kept: the next look asks
    # again, so one refused query at start does not stay for the worker's life.
    if all(len(links) == len(handles) - 1 for _, _, links in placed):
        _last_read = (key, placed)
    return placed


def nvml_topology(
    pynvml: Any, handles: Sequence[Any], sysfs: Path = Path("/sys/bus/pci/devices")
) -> Placed:
    """For each GPU (by NVML index): its NUMA node, that node's CPUs, and its links. A
    query the driver refuses leaves that part unknown (never fails discovery)."""
    buses = []
    for h in handles:
        try:
            buses.append(_bus(pynvml, h))
        except (pynvml.NVMLError, ValueError):
            buses.append("")
    lanes = [_nvlink_lanes(pynvml, h, buses) for h in handles]
    out = []
    for i, h in enumerate(handles):
        links = []
        for j, other in enumerate(handles):
            if j == i:
                continue
            n = lanes[i].get(buses[j], 0) or lanes[j].get(buses[i], 0)
            if not n and lanes[i].get("switch") and lanes[j].get("switch"):
                n = min(lanes[i]["switch"], lanes[j]["switch"])  # both on the NVSwitch
            word = f"NV{n}" if n else _ancestor(pynvml, h, other)
            if word is not None:
                links.append((j, word))
        numa, cpus = _numa(sysfs, buses[i])
        out.append((numa, cpus, tuple(links)))
    return out


def _ancestor(pynvml: Any, a: Any, b: Any) -> str | None:
    try:
        return _LEVELS.get(int(pynvml.nvmlDeviceGetTopologyCommonAncestor(a, b)))
    except pynvml.NVMLError:
        return None


def _nvlink_lanes(pynvml: Any, handle: Any, gpu_buses: Sequence[str]) -> dict[str, int]:
    """Active NVLink lanes to each peer by PCI address (``switch``: to anything that is
    not one of the GPUs, i.e. an NVSwitch)."""
    lanes: dict[str, int] = {}
    for link in range(_NVLINK_MAX):
        try:
            if not pynvml.nvmlDeviceGetNvLinkState(handle, link):
                continue
            peer = _bus_of(pynvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link))
        except (pynvml.NVMLError, ValueError, AttributeError):
            continue  # not supported, or no such link: PCIe only
        key = peer if peer in gpu_buses else "switch"
        lanes[key] = lanes.get(key, 0) + 1
    return lanes


def _numa(sysfs: Path, bus: str) -> tuple[int | None, str | None]:
    if not bus:
        return None, None
    try:
        node = int((sysfs / bus / "numa_node").read_text().strip())
    except (OSError, ValueError):
        node = -1
    try:
        cpus: str | None = (sysfs / bus / "local_cpulist").read_text().strip() or None
    except OSError:
        cpus = None
    return (node if node >= 0 else None), cpus
