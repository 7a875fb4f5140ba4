"""How this host's GPUs are joined, and what each one is (pure).

A link between two GPUs is named in ``nvidia-smi topo -m``'s words, best first:
``NV#`` (# NVLink lanes, more is better), ``PIX`` (one PCIe switch), ``PXB`` (several PCIe
switches), ``PHB`` (the same PCIe host bridge), ``NODE`` (the same NUMA node, across host
bridges), ``SYS`` (across CPU sockets). The scheduler ranks sets of GPUs by their links
(``core.scheduler.placers.BestConnected``), a job may require a class (``--gpu-link``) and
a model or MIG profile (``--gpu-type``). Discovery (NVML, or a fake topology file) lives in
``worker.devices``; the file's checks are here so the daemon and tests share them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import combinations

from ddpq.core.hostres import parse_cpulist

# Classes best first; a link's rank is its index here (NV# all rank 0).
CLASSES = ("NV", "PIX", "PXB", "PHB", "NODE", "SYS")
# What a job may ask for with ``--gpu-link``, to the class it means.
REQUIRABLE = {"nvlink": "NV", "nv": "NV", **{c.lower(): c for c in CLASSES[1:]}}
_NV = re.compile(r"NV([1-9][0-9]?)")
# The weight of keeping a link of each rank unbroken (``damage``): good links weigh more.
_WEIGHT = (31, 15, 7, 3, 1, 0)


# The setting's help (``config_decl``): the file is read when the worker starts.
FAKE_TOPOLOGY_HELP = (
    "with --fake-gpus: a JSON file of the fake GPUs' models, memory, links, NUMA nodes and "
    "MIG instances (docs/topology.md)"
)


class TopologyError(ValueError):
    """A topology description that cannot be used; the message is one line."""


def rank(word: str) -> int:
    """A link word's class rank (0 best); raises TopologyError for an unknown word."""
    if _NV.fullmatch(word):
        return 0
    try:
        return CLASSES.index(word)
    except ValueError:
        raise TopologyError(
            f"unknown link {word!r}: use NV1..NV99, PIX, PXB, PHB, NODE or SYS"
        ) from None


def lanes(word: str) -> int:
    """NVLink lanes of a link word (0 for any other class)."""
    m = _NV.fullmatch(word)
    return int(m.group(1)) if m else 0


def required_class(asked: str) -> str:
    """The class ``--gpu-link`` names (nvlink, pix, pxb, phb, node, sys)."""
    try:
        return REQUIRABLE[asked.strip().lower()]
    except KeyError:
        raise TopologyError(
            f"unknown --gpu-link {asked!r}: use one of {', '.join(sorted(REQUIRABLE))}"
        ) from None


def describe_class(cls: str) -> str:
    return "NVLink" if cls == "NV" else cls


@dataclass(frozen=True)
class Hardware:
    """What the placer knows of the GPUs it hands out: the link of each pair (absent:
    ``default``), each GPU's model name (a MIG instance's ends in its profile), NUMA node."""

    links: Mapping[tuple[int, int], str] = field(default_factory=dict)
    default: str = "SYS"
    names: Mapping[int, str] = field(default_factory=dict)
    numa: Mapping[int, int] = field(default_factory=dict)
    # MIG instances: one process uses one instance only (CUDA's rule), so a job on several
    # GPUs never gets them.
    mig: frozenset[int] = frozenset()
    # Each GPU's near CPUs (its NUMA node's), where known: a GPU job's cores come from these.
    near: Mapping[int, frozenset[int]] = field(default_factory=dict)

    def near_cpus(self, gpus: Iterable[int]) -> frozenset[int]:
        """The CPUs near any of ``gpus`` (empty: nothing known, any core will do)."""
        return frozenset().union(*(self.near.get(g, frozenset()) for g in gpus))

    @property
    def known(self) -> bool:
        """Whether there is anything to place by (else first free is as good)."""
        return bool(self.links) or self.default != "SYS" or bool(self.mig)

    def link(self, a: int, b: int) -> str:
        if a == b:
            return "X"
        return self.links.get((min(a, b), max(a, b)), self.default)

    def link_rank(self, a: int, b: int) -> int:
        return rank(self.link(a, b))

    def worst(self, gpus: Sequence[int]) -> int:
        """The worst link rank among ``gpus`` (0 for one GPU)."""
        return max((self.link_rank(a, b) for a, b in combinations(gpus, 2)), default=0)

    def of_type(self, gpus: Iterable[int], wanted: str | None, n: int = 1) -> list[int]:
        """Those of ``gpus`` whose model name (or MIG profile) contains ``wanted``, and
        that a job on ``n`` GPUs may have (no MIG instance for more than one)."""
        if n > 1 and self.mig:
            gpus = [g for g in gpus if g not in self.mig]
        if wanted is None:
            return list(gpus)
        w = wanted.lower()
        return [g for g in gpus if w in self.names.get(g, "").lower()]

    def cost(self, gpus: Sequence[int]) -> tuple[int, int, int]:
        """How good a set is, smaller better: its worst link, the sum of its links' ranks
        less their NVLink lanes (more lanes, faster), how many NUMA nodes it spans."""
        pairs = list(combinations(gpus, 2))
        total = sum(self.link_rank(a, b) * 100 - lanes(self.link(a, b)) for a, b in pairs)
        nodes = len({self.numa.get(g, -1) for g in gpus})
        return self.worst(gpus), total, nodes

    def damage(self, gpus: Sequence[int], free: Iterable[int]) -> int:
        """How much taking ``gpus`` breaks of the good sets left among ``free``."""
        taken = set(gpus)
        rest = [g for g in free if g not in taken]
        return sum(_WEIGHT[self.link_rank(a, b)] for a in gpus for b in rest)


NO_HARDWARE = Hardware()


def matrix(indices: Sequence[int], hw: Hardware, cpus: Mapping[int, str]) -> list[list[str]]:
    """The rows of ``nvidia-smi topo -m``: a header, then each GPU's links, CPU affinity and
    NUMA node."""
    head = ["", *(f"GPU{i}" for i in indices), "CPU Affinity", "NUMA Affinity"]
    rows = [head]
    for a in indices:
        numa = hw.numa.get(a)
        links = [hw.link(a, b) for b in indices]
        rows.append([f"GPU{a}", *links, cpus.get(a, "N/A"), "N/A" if numa is None else str(numa)])
    return rows


@dataclass(frozen=True)
class FakeGpu:
    index: int
    name: str = "fake"
    memory_mb: int | None = None  # None: the fake default
    numa: int | None = None
    mig: tuple[str, ...] = ()


@dataclass(frozen=True)
class FakeTopology:
    """A fake topology file (``ddpq serve --fake-topology FILE``), checked."""

    gpus: tuple[FakeGpu, ...]
    links: Mapping[tuple[int, int], str]
    default: str = "SYS"
    numa_cpus: Mapping[int, str] = field(default_factory=dict)

    def hardware(self) -> Hardware:
        """The placer's view of the whole GPUs (MIG instances are the worker's)."""
        return Hardware(
            dict(self.links),
            self.default,
            {g.index: g.name for g in self.gpus},
            {g.index: g.numa for g in self.gpus if g.numa is not None},
            near={
                g.index: parse_cpulist(self.numa_cpus.get(g.numa))
                for g in self.gpus
                if g.numa is not None and g.numa in self.numa_cpus
            },
        )


_PROFILE = re.compile(r"[1-9]g\.[0-9]+gb(\+me)?")
_CPULIST = re.compile(r"[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*")
_KEYS = {"gpus", "links", "default_link", "numa_cpus"}
_GPU_KEYS = {"index", "name", "memory", "numa", "mig"}


def parse_fake(text: str, count: int) -> FakeTopology:
    """Check a fake topology file's JSON against ``count`` fake GPUs. Raises TopologyError
    with one line naming what is wrong."""
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise TopologyError(f"not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise TopologyError("must be a JSON object with a 'gpus' list")
    unknown = sorted(set(doc) - _KEYS)
    if unknown:
        raise TopologyError(f"unknown key {unknown[0]!r}; keys are {', '.join(sorted(_KEYS))}")
    gpus = doc.get("gpus")
    if not isinstance(gpus, list) or not gpus:
        raise TopologyError("'gpus' must be a non-empty list")
    parsed = tuple(_fake_gpu(g, n) for n, g in enumerate(gpus))
    if [g.index for g in parsed] != list(range(count)):
        raise TopologyError(
            f"'gpus' must list indexes 0..{count - 1} in order, one per --fake-gpus "
            f"(found {[g.index for g in parsed]})"
        )
    default = doc.get("default_link", "SYS")
    if not isinstance(default, str):
        raise TopologyError("'default_link' must be a link word such as SYS")
    rank(default)
    return FakeTopology(parsed, _links(doc.get("links", {}), count), default, _numa(doc, parsed))


def _fake_gpu(g: object, n: int) -> FakeGpu:
    where = f"gpus[{n}]"
    if not isinstance(g, dict):
        raise TopologyError(f"{where} must be an object")
    unknown = sorted(set(g) - _GPU_KEYS)
    if unknown:
        raise TopologyError(f"{where}: unknown key {unknown[0]!r}")
    index, name, numa = g.get("index"), g.get("name", "fake"), g.get("numa")
    if type(index) is not int:
        raise TopologyError(f"{where}: 'index' must be an integer")
    if not isinstance(name, str) or not 0 < len(name) <= 96 or not name.isprintable():
        raise TopologyError(f"{where}: 'name' must be a printable string of 1-96 characters")
    if numa is not None and (type(numa) is not int or not 0 <= numa < 1024):
        raise TopologyError(f"{where}: 'numa' must be an integer 0-1023")
    mig = g.get("mig", [])
    if not isinstance(mig, list) or len(mig) > 7:
        raise TopologyError(f"{where}: 'mig' must be a list of at most 7 profiles")
    for p in mig:
        if not isinstance(p, str) or not _PROFILE.fullmatch(p):
            raise TopologyError(f"{where}: MIG profile {p!r} is not like 1g.10gb or 3g.40gb")
    return FakeGpu(index, name, _memory_mb(g.get("memory"), where), numa, tuple(mig))


_SIZE = re.compile(r"([0-9]{1,7})\s*([MG])i?B?", re.IGNORECASE)


def _memory_mb(value: object, where: str) -> int | None:
    if value is None:
        return None
    m = _SIZE.fullmatch(value) if isinstance(value, str) else None
    if m is None or int(m.group(1)) == 0:
        raise TopologyError(f'{where}: \'memory\' must be a size such as "80G" or "512M"')
    n = int(m.group(1))
    return n * 1024 if m.group(2).upper() == "G" else n


def _links(raw: object, count: int) -> dict[tuple[int, int], str]:
    if not isinstance(raw, dict):
        raise TopologyError("'links' must map \"i-j\" to a link word")
    out: dict[tuple[int, int], str] = {}
    for key, word in raw.items():
        m = re.fullmatch(r"([0-9]{1,4})-([0-9]{1,4})", key)
        if m is None:
            raise TopologyError(f'link {key!r} must be two GPU indexes like "0-5"')
        a, b = int(m.group(1)), int(m.group(2))
        if a == b or max(a, b) >= count:
            raise TopologyError(f"link {key!r} must join two different GPUs below {count}")
        if not isinstance(word, str):
            raise TopologyError(f"link {key!r}: the class must be a word such as NV12 or SYS")
        rank(word)
        pair = (min(a, b), max(a, b))
        if pair in out:
            raise TopologyError(f"link {key!r} is given twice")
        out[pair] = word
    return out


def _numa(doc: Mapping[str, object], gpus: Sequence[FakeGpu]) -> dict[int, str]:
    raw = doc.get("numa_cpus", {})
    if not isinstance(raw, dict):
        raise TopologyError("'numa_cpus' must map a NUMA node to a CPU list such as \"0-3\"")
    out: dict[int, str] = {}
    for key, cpus in raw.items():
        if not key.isdigit() or not isinstance(cpus, str) or not _CPULIST.fullmatch(cpus):
            raise TopologyError(f'numa_cpus {key!r}: a node number to a CPU list like "0-3,8"')
        out[int(key)] = cpus
    return out
