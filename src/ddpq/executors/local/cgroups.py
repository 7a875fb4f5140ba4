"""A cgroup (v2) per job attempt: the set of a job's processes that a job cannot leave.

A process cannot move itself out of a cgroup whose ``cgroup.procs`` it may not
write, and every child starts in its parent's cgroup: whatever a job does
(``setsid``, double forks, ``env -i``), all of it stays in its cgroup, and
``cgroup.kill`` ends all of it at once. This is how Slurm's proctrack/cgroup and
systemd track jobs and services.

Job cgroups live in one folder per state folder, ``ddpq-<hash of home>``, made
under the daemon's own cgroup (or under ``$DDPQ_CGROUP_ROOT``), and are named
``job-<id>-<attempt>``, so a restarted worker finds them again from the job's id
and attempt alone. No controller is enabled: only the core files (``cgroup.procs``,
``cgroup.events``, ``cgroup.kill``) and device programs are used, which keeps
v2's "no processes in inner cgroups" rule out of the way.

Where no v2 hierarchy is mounted (or the daemon may not create cgroups), or with
``DDPQ_TRACKING=session``, the worker falls back to tracking a job by its session.
Standard library only.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

MODE_ENV = "DDPQ_TRACKING"  # auto (default) | session
ROOT_ENV = "DDPQ_CGROUP_ROOT"  # make job cgroups under this cgroup instead of our own
LEAF = "daemon"  # the daemon's own cgroup's leaf it moves into (executors.local.limits)
TREES_FILE = "cgroup-trees"  # in the state folder: where job cgroups were made, newest first


@dataclass(frozen=True)
class Tracking:
    """How the worker tracks a job's processes: ``cgroup`` or ``session``."""

    kind: str
    tree: Path | None = None  # where new job cgroups are made
    trees: tuple[Path, ...] = ()  # where job cgroups are looked for: ``tree``, then older ones
    why: str = ""  # with ``session``: why not cgroups
    fence_error: str | None = "no job cgroups"  # None: each job is fenced to its GPUs

    def describe(self) -> str:
        if self.kind != "cgroup" or self.tree is None:
            return f"jobs tracked by session ({self.why}); GPUs not fenced"
        how = "cgroup.kill" if (self.tree / "cgroup.kill").exists() else "SIGKILL loop"
        fence = (
            "GPUs fenced per job (cgroup device program)"
            if self.fence_error is None
            else f"GPUs not fenced: {self.fence_error}"
        )
        return f"jobs tracked by cgroup ({self.tree}, ended with {how}); {fence}"


def v2_mount(mountinfo: str = "/proc/self/mountinfo") -> tuple[Path, str] | None:
    """Where the cgroup2 hierarchy is mounted, and which of its cgroups that mount shows."""
    try:
        with open(mountinfo) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        # ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER
        left, sep, right = line.partition(" - ")
        fields = left.split()
        if sep and right.split()[:1] == ["cgroup2"] and len(fields) >= 5:
            return Path(unescape(fields[4])), unescape(fields[3])
    return None


def unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def cgroup_of(pid: int | str = "self") -> str | None:
    """The v2 cgroup of ``pid`` ("/a/b"), from its ``0::`` line in /proc/PID/cgroup."""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            for line in f:
                if line.startswith("0::"):
                    return line[3:].rstrip("\n")
    except OSError:
        pass
    return None


def own_cgroup() -> Path | None:
    """The folder of our own v2 cgroup, or None without a (visible) v2 hierarchy."""
    mount = v2_mount()
    path = cgroup_of()
    if mount is None or path is None or path.endswith(" (deleted)"):
        return None
    where, root = mount
    rel = os.path.relpath(path, root) if root != "/" else path.lstrip("/")
    if rel.startswith(".."):
        return None  # our cgroup is outside what this mount shows
    folder = where / rel if rel not in ("", ".") else where
    return folder if (folder / "cgroup.procs").exists() else None


def outside_own_leaf(own: Path | None) -> Path | None:
    """Where job cgroups go for a daemon in ``own``: beside it, in its parent, when ``own``
    is the leaf a daemon moves itself into to hand controllers down (``limits.LEAF``; a
    restarted daemon starts there, or systemd's ``DelegateSubgroup=daemon`` starts it there):
    v2 lets a cgroup with processes in it have no children with controllers."""
    if own is not None and own.name == LEAF and os.access(own.parent / "cgroup.procs", os.W_OK):
        return own.parent
    return own


def detect(home: Path, mode: str | None = None, root: Path | None = None) -> Tracking:
    """Choose how jobs are tracked; with cgroups, prepare the tree for this state folder."""
    mode = (mode if mode is not None else os.environ.get(MODE_ENV, "auto")).strip().lower()
    if mode == "session":
        return Tracking("session", why=f"{MODE_ENV}=session")
    if root is None and os.environ.get(ROOT_ENV):
        root = Path(os.environ[ROOT_ENV])
    base = root if root is not None else outside_own_leaf(own_cgroup())
    if base is None:
        return Tracking("session", why="no cgroup v2 hierarchy is mounted here")
    if not (base / "cgroup.procs").exists():
        return Tracking("session", why=f"{base} is not a cgroup v2 folder")
    tree = base / tree_name(home)
    try:
        tree.mkdir(exist_ok=True)
        tree.chmod(0o755)  # a shim running as its job's account reads its cgroup's members
    except OSError as exc:
        return Tracking("session", why=f"cannot create {tree}: {exc.strerror}")
    return Tracking("cgroup", tree=tree, trees=_remember(home, tree))


def tree_name(home: Path) -> str:
    """The folder of a state folder's job cgroups: one per state folder, in each hierarchy."""
    return "ddpq-" + hashlib.sha256(str(home.resolve()).encode()).hexdigest()[:12]


def _remember(home: Path, tree: Path) -> tuple[Path, ...]:
    """Record ``tree`` in the state folder; return it and the earlier trees still in use.

    A daemon restarted from another cgroup (another login, say) makes new jobs
    elsewhere, but must still find the cgroups of the jobs it re-adopts. Empty job
    cgroups (left by an interrupted launch) and empty old trees are removed here.
    """
    record = home / TREES_FILE
    candidates = [tree] + [old for old in remembered_trees(home) if old != tree]
    trees = []
    for folder in candidates:
        for child in folder.glob("job-*"):
            # A daemon that died while the jobs were frozen for a full disk (freeze.py)
            # must not leave them so.
            thaw(child)
            remove(child)  # only an empty cgroup can be removed: busy ones stay
        if folder != tree and not any(folder.glob("job-*")):
            remove(folder)
        else:
            trees.append(folder)
    tmp = record.with_name(TREES_FILE + ".tmp")
    try:
        tmp.write_text("".join(f"{t}\n" for t in trees))
        tmp.chmod(0o600)
        tmp.replace(record)
    except OSError:
        pass  # then only this run's tree is searched after a restart from elsewhere
    return tuple(trees)


def remembered_trees(home: Path) -> list[Path]:
    """The trees of job cgroups that the state folder ``home`` records (newest first)."""
    try:
        lines = (home / TREES_FILE).read_text().splitlines()
    except OSError:
        return []
    return [
        tree
        for tree in (Path(line) for line in lines if line.strip())
        if tree.is_absolute() and tree.name.startswith("ddpq-") and (tree / "cgroup.procs").exists()
    ]


def thaw(path: Path) -> None:
    """Let a cgroup frozen with ``cgroup.freeze`` run again (nothing if it was not)."""
    with contextlib.suppress(OSError), open(path / "cgroup.freeze", "w") as f:
        f.write("0")


def job_cgroup(tree: Path, job: str | int, attempt: int) -> Path:
    return tree / f"job-{job}-{attempt}"


def create(path: Path) -> Path:
    """A new, empty cgroup at ``path`` (one left over with that name is emptied first)."""
    try:
        path.mkdir()
    except FileExistsError:
        destroy(path)
        path.mkdir()
    # Readable (its shim lists its members), never writable by the job: a process may
    # only leave a cgroup through a cgroup.procs it can write.
    path.chmod(0o755)
    return path


_companions: set[int] = set()


def companion(pid: int) -> None:
    """``pid`` is another process of this daemon (``ddpq serve``'s API half, its worker's
    parent): it shares the daemon's cgroup, and moves into the daemon's leaf with it
    (``limits``) where cgroup v2 wants the cgroup empty to hand controllers down."""
    _companions.add(pid)


def ours() -> set[int]:
    """This daemon's processes: this one and its companions."""
    return {os.getpid(), *_companions}


def add(path: Path, pid: int) -> None:
    """Move ``pid`` (and its threads) into the cgroup; its future children start there."""
    with open(path / "cgroup.procs", "w") as f:
        f.write(str(pid))


def members(path: Path) -> list[int]:
    """PIDs in the cgroup (zombies are not listed); [] if it is gone."""
    try:
        with open(path / "cgroup.procs") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


def populated(path: Path) -> bool:
    """True while a live process is in the cgroup or below it."""
    try:
        with open(path / "cgroup.events") as f:
            for line in f:
                key, _, value = line.partition(" ")
                if key == "populated":
                    return value.strip() != "0"
    except FileNotFoundError:
        return False  # removed: nothing in it
    except OSError:
        pass
    return bool(members(path))


def kill(path: Path) -> None:
    """SIGKILL everything in the cgroup: ``cgroup.kill`` (Linux 5.14+), else each member."""
    try:
        with open(path / "cgroup.kill", "w") as f:
            f.write("1")
        return
    except FileNotFoundError:
        if not path.exists():
            return
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return
    for pid in members(path):
        with contextlib.suppress(OSError):  # gone already, or not ours to kill
            os.kill(pid, signal.SIGKILL)


def wait_empty(path: Path, timeout: float) -> bool:
    """Kill and wait until no process is left in the cgroup; False if some remain."""
    deadline = time.monotonic() + timeout
    pause = 0.001
    while populated(path):
        if time.monotonic() > deadline:
            return False
        kill(path)  # again: cheap, and it catches a child forked during a member-by-member kill
        time.sleep(pause)
        pause = min(pause * 2, 0.02)
    return True


def remove(path: Path) -> bool:
    """Remove an empty cgroup; False if it still has processes (EBUSY) or cannot be removed."""
    try:
        path.rmdir()
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


def destroy(path: Path, timeout: float = 10.0) -> bool:
    """Kill everything in the cgroup, wait (bounded) until it is empty, remove it."""
    if populated(path):
        kill(path)
    return wait_empty(path, timeout) and remove(path)
