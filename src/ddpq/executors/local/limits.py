"""A job's limits, enforced by its cgroups: its CPU cores, its memory (no swap beyond it), its
processes.

Where the daemon's v2 tree can have controllers (a lab server: pure cgroup v2, the daemon a
service with ``Delegate=yes``), ``cpuset``, ``memory`` and ``pids`` are enabled for the
job cgroups it already tracks jobs with, and each attempt's cgroup gets ``cpuset.cpus``,
``memory.max`` with ``memory.swap.max`` 0, and ``pids.max``. v2 lets a cgroup hand
controllers down only while no process is in it, so the daemon first moves itself into a
leaf of its own cgroup (``<own>/daemon``). Where a controller is a v1 hierarchy instead (a
hybrid host), the attempt gets a cgroup in that hierarchy too (``cgroup_v1``), set alike
(``memory.limit_in_bytes`` and ``memory.memsw.limit_in_bytes``), and its shim joins it at
the point it joins its v2 cgroup: before anything of the job runs.

A controller neither way gives is said to be missing (``describe``, ``controls``): the job
runs, and nothing pretends its limit holds. ``DDPQ_TRACKING=session`` means no cgroups at
all, so no limits. Standard library only.
"""

from __future__ import annotations

import contextlib
import errno
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ddpq.core.enforcement import Control, phrase
from ddpq.executors.base import Launch
from ddpq.executors.local import cgroup_v1, cgroups

CONTROLLERS = ("cpuset", "memory", "pids")
LEAF = cgroups.LEAF  # where the daemon moves itself to hand controllers down (v2)
RELEASE_TIMEOUT_S = 1.0  # a v1 cgroup whose last process is still exiting refuses rmdir


@dataclass(frozen=True)
class Limits:
    """Which controllers this daemon confines jobs with, and where their cgroups are."""

    pids_max: int = 0  # per job; 0: no cap
    v2: frozenset[str] = frozenset()  # set in each attempt's v2 (tracking) cgroup
    v1: Mapping[str, Path] = field(default_factory=dict)  # controller -> tree new jobs get
    v1_trees: Mapping[str, tuple[Path, ...]] = field(default_factory=dict)  # looked in
    missing: Mapping[str, str] = field(default_factory=dict)  # controller -> why not

    def how(self, controller: str) -> str | None:
        if controller in self.v2:
            return "cgroup v2"
        return "cgroup v1" if controller in self.v1 else None

    def controls(self) -> list[Control]:
        out = []
        for name in CONTROLLERS:
            how = self.how(name)
            if name == "pids" and how is not None and self.pids_max <= 0:
                out.append(Control(name, False, "job_pids_max is 0"))
            elif how is not None:
                cap = f", at most {self.pids_max} per job" if name == "pids" else ""
                out.append(Control(name, True, how + cap))
            else:
                out.append(Control(name, False, self.missing.get(name, f"no {name} controller")))
        return out

    def describe(self) -> str:
        return "; ".join(phrase(c) for c in self.controls())


def detect(
    home: Path,
    tracking: cgroups.Tracking,
    pids_max: int,
    *,
    mountinfo: str = "/proc/self/mountinfo",
    proc_cgroup: str = "/proc/self/cgroup",
) -> Limits:
    """Find the controllers to confine jobs with, and prepare them (see the module)."""
    if os.environ.get(cgroups.MODE_ENV, "auto").strip().lower() == "session":
        why = f"{cgroups.MODE_ENV}=session: no job cgroups"
        return Limits(pids_max, missing=dict.fromkeys(CONTROLLERS, why))
    v2: set[str] = set()
    missing: dict[str, str] = {}
    if tracking.tree is not None:
        v2, missing = enable_v2(tracking.tree)
    v1: dict[str, Path] = {}
    for name in CONTROLLERS:
        if name in v2:
            continue
        folder = cgroup_v1.own_folder(name, mountinfo, proc_cgroup)
        if isinstance(folder, str):
            missing.setdefault(name, folder)
            continue
        try:
            v1[name] = cgroup_v1.make_tree(name, folder, home)
        except OSError as exc:
            missing[name] = f"cannot create a {name} cgroup in {folder}: {exc.strerror or exc}"
    for name in list(v2) + list(v1):
        missing.pop(name, None)
    trees = cgroup_v1.remember(home, v1)
    return Limits(pids_max, frozenset(v2), v1, trees, missing)


def enable_v2(tree: Path) -> tuple[set[str], dict[str, str]]:
    """Enable what the daemon's v2 cgroup offers of CONTROLLERS for the job cgroups in
    ``tree``; the ones enabled, and why each other one offered is not."""
    base = tree.parent
    offered = cgroup_v1.read(base / "cgroup.controllers").split()
    enabled: set[str] = set()
    why: dict[str, str] = {}
    for name in CONTROLLERS:
        if name not in offered:
            continue
        try:
            _enable(base, name)
            cgroup_v1.write(tree / "cgroup.subtree_control", f"+{name}")
        except OSError as exc:
            why[name] = f"cannot enable {name} under {base}: {exc.strerror or exc}"
        else:
            enabled.add(name)
    return enabled, why


def _enable(base: Path, name: str) -> None:
    if name in cgroup_v1.read(base / "cgroup.subtree_control").split():
        return
    try:
        cgroup_v1.write(base / "cgroup.subtree_control", f"+{name}")
    except OSError as exc:
        if exc.errno != errno.EBUSY:
            raise
        # "No internal processes": the daemon's own cgroup may hand controllers down only
        # once no process is in it. The daemon moves itself into a leaf of it (job cgroups
        # stay beside that); any other process there is not ours to move (a login
        # session's shell, say): then the controller is said to be missing, and why.
        ours = cgroups.ours()  # `serve`'s API half too, beside its worker
        inside = cgroups.members(base)
        others = [pid for pid in inside if pid not in ours]
        if others:
            raise OSError(
                errno.EBUSY,
                f"other processes share the daemon's cgroup (PID {others[0]}); give it one "
                "of its own (a service with Delegate=yes)",
            ) from None
        leaf = base / LEAF
        leaf.mkdir(exist_ok=True)
        for pid in sorted({os.getpid(), *(pid for pid in inside if pid in ours)}):
            cgroups.add(leaf, pid)
        cgroup_v1.write(base / "cgroup.subtree_control", f"+{name}")


def job_name(job_id: int, attempt: int) -> str:
    return cgroups.job_cgroup(Path("/"), job_id, attempt).name


def _settings(
    limits: Limits, launch: Launch, name: str, v1: Path | None
) -> list[tuple[str, str, bool]]:
    """What to write for controller ``name``: (file, value, required); [] if nothing."""
    if name == "cpuset" and launch.cores:
        cpus = ",".join(str(c) for c in sorted(launch.cores))
        if v1 is None:
            return [("cpuset.cpus", cpus, True)]
        # A v1 cpuset takes no process without memory nodes: its tree's.
        mems = cgroup_v1.read(v1 / "cpuset.mems")
        return [("cpuset.mems", mems, True), ("cpuset.cpus", cpus, True)]
    if name == "memory" and launch.ram_bytes is not None:
        size = str(launch.ram_bytes)
        if v1 is None:
            # No swap beyond it; a host without swap accounting has no memory.swap.max.
            return [("memory.max", size, True), ("memory.swap.max", "0", False)]
        return [("memory.limit_in_bytes", size, True), ("memory.memsw.limit_in_bytes", size, False)]
    if name == "pids" and limits.pids_max > 0:
        return [("pids.max", str(limits.pids_max), True)]
    return []


def _apply(folder: Path, settings: list[tuple[str, str, bool]]) -> None:
    for name, value, required in settings:
        try:
            cgroup_v1.write(folder / name, value)
        except OSError as exc:
            if required or (folder / name).exists():
                raise OSError(
                    exc.errno, f"cannot set {name} of {folder} to {value}: {exc.strerror}"
                ) from None


def confine(limits: Limits, launch: Launch, cgroup: Path | None) -> list[Path]:
    """Set the attempt's limits: in its v2 cgroup ``cgroup``, and in a cgroup made for it in
    each v1 hierarchy that has something to enforce. The v1 cgroups, for its shim to join.
    Raises OSError (nothing left made) if a limit cannot be set: a job never runs with a
    limit it asked for silently missing."""
    if cgroup is not None:
        for name in limits.v2:
            _apply(cgroup, _settings(limits, launch, name, None))
    made: list[Path] = []
    try:
        for name, tree in limits.v1.items():
            settings = _settings(limits, launch, name, tree)
            if not settings:
                continue
            path = tree / job_name(launch.job_id, launch.attempt)
            try:
                path.mkdir()
            except FileExistsError:
                with contextlib.suppress(OSError):  # an interrupted launch's, empty
                    path.rmdir()
                    path.mkdir()
            made.append(path)
            path.chmod(0o755)  # its shim, as the job's account, reads the members
            _apply(path, settings)
    except OSError:
        for path in made:
            with contextlib.suppress(OSError):
                path.rmdir()
        raise
    return made


def v1_cgroups(limits: Limits, job_id: int, attempt: int) -> list[Path]:
    """The attempt's v1 cgroups, in this run's trees or (re-adopted) an earlier run's."""
    name = job_name(job_id, attempt)
    found = []
    for trees in limits.v1_trees.values():
        for tree in trees:
            if (tree / name).is_dir():
                found.append(tree / name)
                break
    return found


def oom_limit(limits: Limits, v1: list[Path], cgroup: Path | None) -> int | None:
    """The attempt's memory limit in bytes if its cgroup's OOM killer killed something of it
    (the kernel's count, v2 ``memory.events`` or v1 ``memory.oom_control``); else None.
    ``v1``: the attempt's v1 cgroups (``v1_cgroups``, looked up once for its end)."""
    folders: list[tuple[Path, str, str]] = []
    if cgroup is not None and "memory" in limits.v2:
        folders.append((cgroup, "memory.events", "memory.max"))
    for path in v1:
        if (path / "memory.oom_control").exists():
            folders.append((path, "memory.oom_control", "memory.limit_in_bytes"))
    for folder, events, limit in folders:
        if _count(cgroup_v1.read(folder / events), "oom_kill") > 0:
            size = cgroup_v1.read(folder / limit)
            return int(size) if size.isdigit() else None
    return None


def peak_ram(limits: Limits, v1: list[Path], cgroup: Path | None) -> int | None:
    """The most memory the attempt's cgroup held, in bytes (the kernel's own high-water
    mark: v2 ``memory.peak``, from Linux 5.19; v1 ``memory.max_usage_in_bytes``); None
    where no memory controller counts it."""
    files: list[Path] = []
    if cgroup is not None and "memory" in limits.v2:
        files.append(cgroup / "memory.peak")
    files += [path / "memory.max_usage_in_bytes" for path in v1]
    for file in files:
        value = cgroup_v1.read(file)
        if value.isdigit():
            return int(value)
    return None


def _count(text: str, key: str) -> int:
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return 0


def release(limits: Limits, job_id: int, attempt: int) -> None:
    """Remove the attempt's v1 cgroups (its processes are gone: a v1 cgroup whose last
    process is still exiting refuses for a moment; one left is removed at the next start)."""
    remove(v1_cgroups(limits, job_id, attempt))


def remove(v1: list[Path]) -> None:
    """Remove these v1 cgroups of an attempt whose processes are gone (``release``)."""
    for path in v1:
        deadline = time.monotonic() + RELEASE_TIMEOUT_S
        while True:
            try:
                path.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.005)
