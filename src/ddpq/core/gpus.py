"""The one record of a GPU: what NVML reports of it, passed from discovery to the page.

The worker discovers these (``worker.devices``), keeps for each the processes on it that
no ddpq job started, and publishes that view (``store.devices``); the API serves it. The
same record all the way, so a field added here reaches every one of them.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace

from ddpq.core.hostres import parse_cpulist
from ddpq.core.topology import Hardware


@dataclass(frozen=True)
class GpuProcess:
    """A compute process on a GPU, as NVML reports it."""

    # A PID in the host's PID namespace: NVML sees the driver's view, so comparing with
    # ddpq's PIDs is only meaningful when ddpq runs on the host (not in a container with
    # its own PID namespace).
    pid: int
    # None where the driver cannot tell (NVML_VALUE_NOT_AVAILABLE, e.g. WDDM).
    used_memory_mb: int | None
    # Who runs it, for a process that is in no ddpq job: its real uid (from /proc) and that
    # uid's account name, filled in by the worker (``worker.outside``); None where neither
    # can be told (the process is gone, /proc hides it, the uid has no account). ``user``
    # is the ddpq user the account belongs to, filled in by the API (``core.usage``).
    uid: int | None = None
    account: str | None = None
    user: str | None = None


@dataclass(frozen=True)
class Gpu:
    index: int  # NVML index, i.e. PCI bus order (see worker.devices)
    uuid: str
    name: str
    memory_total_mb: int
    memory_used_mb: int
    processes: tuple[GpuProcess, ...]  # compute processes on it
    fake: bool
    # Where it sits (``core.topology``): its NUMA node and that node's CPUs (a cpulist such
    # as "0-15,32-47"), and its link to each other GPU by index, in nvidia-smi's words.
    numa: int | None = None
    cpus: str | None = None
    links: tuple[tuple[int, str], ...] = ()
    # A MIG instance is a GPU of its own to the scheduler: its profile (``1g.10gb``) and
    # the index of the physical GPU it is carved from (whose device file it opens).
    mig_profile: str | None = None
    parent: int | None = None

    def outside(self, ddpq_pids: Collection[int]) -> Gpu:
        """This GPU with only the processes ddpq did not start, in NVML's order, each once
        (with MIG a process shows up once per GPU instance it uses)."""
        seen: set[int] = set()
        kept = []
        for proc in self.processes:
            if proc.pid not in ddpq_pids and proc.pid not in seen:
                seen.add(proc.pid)
                kept.append(proc)
        return replace(self, processes=tuple(kept))


def external_pids(gpu: Gpu, ddpq_pids: Collection[int]) -> list[int]:
    """PIDs of the processes on ``gpu`` that ddpq did not start."""
    return [p.pid for p in gpu.outside(ddpq_pids).processes]


def model_name(gpu: Gpu) -> str:
    """What ``--gpu-type`` matches: the model, and a MIG instance's profile."""
    if gpu.mig_profile is None or gpu.mig_profile in gpu.name:
        return gpu.name
    return f"{gpu.name} MIG {gpu.mig_profile}"


def hardware_of(gpus: Sequence[Gpu]) -> Hardware:
    """The placer's view of these GPUs. Links absent from every GPU's record are ``SYS``
    (nothing known: every set is as good, and the placer takes the first free)."""
    links = {(min(g.index, o), max(g.index, o)): word for g in gpus for o, word in g.links}
    return Hardware(
        links,
        "SYS",
        {g.index: model_name(g) for g in gpus},
        {g.index: g.numa for g in gpus if g.numa is not None},
        frozenset(g.index for g in gpus if g.parent is not None),
        {g.index: parse_cpulist(g.cpus) for g in gpus if g.cpus},
    )
