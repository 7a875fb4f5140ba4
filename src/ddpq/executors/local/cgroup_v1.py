"""Cgroup v1 hierarchies for job limits: where each controller is mounted, and our place in it.

A hybrid host (v1 ``cpuset``, ``memory``, ``pids`` hierarchies beside a v2 tree that has no
controllers) can still confine a job: its processes join one cgroup per v1 hierarchy as
well as their v2 tracking cgroup. Each hierarchy gets a folder per state folder,
``ddpq-<hash of home>``, beneath the daemon's own cgroup there (never at a hierarchy's
root: that is the machine's), and the job's cgroups are named ``job-<id>-<attempt>`` in it,
as in the v2 tree, so a restarted worker finds them from the job's id and attempt alone.

The folders made are recorded in the state folder (``limit-trees``), so a daemon restarted
from elsewhere still finds, and removes, the cgroups of the jobs it re-adopts.
Standard library only.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from ddpq.executors.local import cgroups

TREES_FILE = "limit-trees"  # in the state folder: "CONTROLLER PATH" lines, newest first


def mounts(mountinfo: str = "/proc/self/mountinfo") -> dict[str, tuple[Path, str]]:
    """Each v1 controller's mount point and the cgroup that mount shows, by controller."""
    try:
        with open(mountinfo) as f:
            lines = f.read().splitlines()
    except OSError:
        return {}
    found: dict[str, tuple[Path, str]] = {}
    for line in lines:
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or tail[:1] != ["cgroup"] or len(fields) < 5 or len(tail) < 3:
            continue
        for option in tail[2].split(","):
            # The first mount of a controller wins: a bind mount elsewhere is the same one.
            found.setdefault(option, (Path(cgroups.unescape(fields[4])), fields[3]))
    return found


def own_paths(proc_cgroup: str = "/proc/self/cgroup") -> dict[str, str]:
    """Our cgroup in each v1 hierarchy ("/a/b"), by controller, from /proc/self/cgroup."""
    try:
        with open(proc_cgroup) as f:
            lines = f.read().splitlines()
    except OSError:
        return {}
    found: dict[str, str] = {}
    for line in lines:
        _id, _, rest = line.partition(":")
        names, _, path = rest.partition(":")
        for name in names.split(","):
            if name:
                found[name] = path
    return found


def own_folder(controller: str, mountinfo: str, proc_cgroup: str) -> Path | str:
    """The folder of our own cgroup in ``controller``'s v1 hierarchy; else why there is none."""
    mount = mounts(mountinfo).get(controller)
    if mount is None:
        return f"no {controller} controller"
    path = own_paths(proc_cgroup).get(controller)
    if path is None or path.endswith(" (deleted)"):
        return f"this process is in no {controller} cgroup"
    where, root = mount
    rel = os.path.relpath(path, root) if root != "/" else path.lstrip("/")
    if rel.startswith(".."):
        return f"our {controller} cgroup is outside what its mount shows"
    folder = where / rel if rel not in ("", ".") else where
    if not (folder / "cgroup.procs").exists():
        return f"{folder} is not a cgroup v1 folder"
    return folder


def make_tree(controller: str, folder: Path, home: Path) -> Path:
    """Our folder for job cgroups under ``folder``; raises OSError if it cannot be made."""
    tree = folder / cgroups.tree_name(home)
    tree.mkdir(exist_ok=True)
    tree.chmod(0o755)  # a shim running as its job's account reads its cgroup's members
    if controller == "cpuset":
        # A v1 cpuset starts with no CPUs and no memory nodes, and takes no process so.
        for name in ("cpuset.cpus", "cpuset.mems"):
            if not read(tree / name):
                write(tree / name, read(folder / name))
    return tree


def read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def remembered(home: Path) -> list[tuple[str, Path]]:
    """The (controller, tree) pairs the state folder ``home`` records, newest first."""
    try:
        lines = (home / TREES_FILE).read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        controller, _, where = line.partition(" ")
        tree = Path(where)
        if tree.is_absolute() and tree.name.startswith("ddpq-") and tree.is_dir():
            out.append((controller, tree))
    return out


def remember(home: Path, current: dict[str, Path]) -> dict[str, tuple[Path, ...]]:
    """Record this run's trees; return, by controller, them and the older trees still in use.

    As with the v2 trees: empty job cgroups (an interrupted launch's) are removed, and so
    are old trees with no job cgroup left.
    """
    pairs = [(c, t) for c, t in current.items()]
    pairs += [(c, t) for c, t in remembered(home) if current.get(c) != t]
    kept: list[tuple[str, Path]] = []
    for controller, tree in pairs:
        for child in tree.glob("job-*"):
            with contextlib.suppress(OSError):
                child.rmdir()  # only an empty cgroup can be removed: busy ones stay
        if current.get(controller) != tree and not any(tree.glob("job-*")):
            with contextlib.suppress(OSError):
                tree.rmdir()
        else:
            kept.append((controller, tree))
    record = home / TREES_FILE
    tmp = record.with_name(TREES_FILE + ".tmp")
    try:
        tmp.write_text("".join(f"{c} {t}\n" for c, t in kept))
        tmp.chmod(0o600)
        tmp.replace(record)
    except OSError:
        pass  # then only this run's trees are searched after a restart from elsewhere
    out: dict[str, tuple[Path, ...]] = {}
    for controller, tree in kept:
        out[controller] = (*out.get(controller, ()), tree)
    return out
