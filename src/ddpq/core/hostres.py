"""CPU cores and host memory as a job's resources: what it holds when it names none, which
of the host's CPUs its cores are, and how many threads each of its ranks gets (pure).

Cores are leased as *slots* ``0 .. cpu_capacity-1``, disjoint between running jobs (the
``leases`` table's ``cpu`` rows). A slot is one of the host's CPUs (the daemon's affinity
mask, in order), wrapping round when an admin sets a capacity above the host's cores to
oversubscribe them: slot ``i`` is CPU ``cpus[i % len(cpus)]``.

What a job holds when it names nothing:

- ``--cpus``: a CPU-only job takes one core; a GPU job ``cpus_per_gpu`` per GPU (none
  for a job that shares its GPUs by memory), which by
  default (``auto``) is the capacity divided among the host's GPUs, rounded down. On a
  host with fewer cores than GPUs that is 0: a GPU job then leases no core and *shares
  the cores* (it is not confined), so as many GPU jobs run at once as before cores were
  counted; a GPU job that wants cores of its own says ``--cpus``.
- ``--mem``: ``default_mem_per_gpu`` per GPU for a GPU job, else ``default_mem``; with
  neither set (the default) it holds no memory and has no limit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ddpq.core.quota import size_or_share
from ddpq.core.units import size_for_people

# The most cores one job may ask for, and the least and most memory (a cgroup limit
# below a few MiB kills any interpreter before it starts).
MAX_CPUS = 4096
MIN_RAM = 4 << 20
MAX_RAM = 1 << 50


@dataclass(frozen=True)
class HostDefaults:
    """The admin's defaults for a job that names no ``--cpus`` or ``--mem``."""

    cpus_per_gpu: int = 0
    mem_per_gpu: int | None = None
    mem: int | None = None


NO_DEFAULTS = HostDefaults()


def auto_cpus_per_gpu(capacity: int, gpu_count: int) -> int:
    """``cpus_per_gpu = auto``: the cores divided among the GPUs, rounded down, so that
    every GPU can run a job with its default share at once (0 with fewer cores than GPUs)."""
    return capacity // gpu_count if gpu_count > 0 else 0


def cores_wanted(
    gpus: int, cpus: int | None, defaults: HostDefaults, shares_gpus: bool = False
) -> int:
    """The cores a job leases: its own ``--cpus``, else one for a CPU-only job, else its
    GPUs' default share (0: it leases none and shares the cores). A job that shares its
    GPUs by memory (``--gpu-mem``) holds a part of a GPU, so no default share of cores:
    as many of them fit on a GPU as its memory allows, and they share the cores."""
    if cpus is not None:
        return cpus
    if gpus == 0:
        return 1
    return 0 if shares_gpus else gpus * defaults.cpus_per_gpu


def ram_wanted(gpus: int, ram_bytes: int | None, defaults: HostDefaults) -> int | None:
    """The host memory a job holds and is limited to (None: none, no limit)."""
    if ram_bytes is not None:
        return ram_bytes
    if gpus > 0 and defaults.mem_per_gpu is not None:
        return gpus * defaults.mem_per_gpu
    return defaults.mem


def cpus_of(slots: Sequence[int], host_cpus: Sequence[int]) -> tuple[int, ...]:
    """The host's CPU ids of leased slots (its cpuset), in order, each once."""
    if not host_cpus:
        return ()
    out: list[int] = []
    for slot in slots:
        cpu = host_cpus[slot % len(host_cpus)]
        if cpu not in out:
            out.append(cpu)
    return tuple(out)


def parse_cpulist(text: str | None) -> frozenset[int]:
    """The CPU ids of a kernel CPU list such as ``0-3,8,10-11`` (sysfs ``local_cpulist``, a
    fake topology's ``numa_cpus``); empty for None, an empty text, or one that is not such
    a list (nothing is then known to be near, which places as if no topology were known)."""
    cpus: set[int] = set()
    for part in (text or "").strip().split(","):
        low, _, high = part.partition("-")
        if not low.isdigit() or not (high or low).isdigit():
            return frozenset()
        first, last = int(low), int(high or low)
        if last < first or last - first >= MAX_CPUS or len(cpus) > MAX_CPUS:
            return frozenset()
        cpus.update(range(first, last + 1))
    return frozenset(cpus)


def near_first(
    free: Sequence[int], wanted: int, host_cpus: Sequence[int], near: frozenset[int]
) -> list[int]:
    """``wanted`` of the ``free`` slots, those whose CPU is in ``near`` (the CPUs of a GPU
    job's NUMA nodes) first, each group in slot order; a job takes far cores only when the
    near ones are held, rather than wait."""
    if not near or not host_cpus:
        return list(free[:wanted])
    close = [s for s in free if host_cpus[s % len(host_cpus)] in near]
    far = [s for s in free if host_cpus[s % len(host_cpus)] not in near]
    return (close + far)[:wanted]


def threads_per_rank(cores: int, ranks: int) -> int:
    """``OMP_NUM_THREADS`` for each of a job's ranks: its cores split among them, at
    least 1."""
    return max(1, cores // max(1, ranks))


def cores_text(n: int) -> str:
    return f"{n} CPU core{'' if n == 1 else 's'}"


def waiting_for_cores(wanted: int, held: int, capacity: int) -> str:
    """The reason a job waits for cores. Says how many are held, as people ask "why"."""
    plural = "" if wanted == 1 else "s"
    return f"waiting for {wanted} free CPU core{plural} ({held} of {capacity} held)"


def waiting_for_ram(wanted: int, total: int) -> str:
    """The reason a job waits for memory. Without what is held: that changes with every
    start and end, and a reason that changed would be a write per waiting job."""
    given = size_for_people(total)
    return f"waiting for {size_for_people(wanted)} of free memory ({given} given to jobs)"


def never_fits(
    cores: int, ram: int | None, capacity: int | None, job_ram: int | None
) -> str | None:
    """Why a job can never start on this host's cores or memory (None: it can)."""
    if capacity is not None and cores > capacity:
        return f"needs {cores_text(cores)}; only {capacity} can be handed out"
    if ram is not None and job_ram is not None and ram > job_ram:
        return (
            f"asks {size_for_people(ram)} of memory; jobs here may hold "
            f"{size_for_people(job_ram)} in all"
        )
    return None


def read_job_ram(value: object) -> object:
    """The ``job_ram`` setting as people write it: a size ("64G", or bytes), a share of
    the host's memory ("90%", or a number below 1; kept as a float), or "unlimited"
    (None). ValueError for people."""
    return size_or_share(value, "the memory", ("64G", "90%"), MIN_RAM)


def job_ram_bytes(setting: int | float | None, mem_total: int | None) -> int | None:
    """``job_ram`` in bytes: a share is of ``mem_total`` (None where it is not known:
    memory is then not counted)."""
    if setting is None or isinstance(setting, int):
        return setting
    return None if mem_total is None else int(mem_total * setting)
