"""Measuring running jobs' folders for the per-job limit (``daemon.measure``; review
findings 3 and 6): bytes a job deleted but keeps open count toward its folder, and a
folder of very many files is measured a bounded amount at a time, in rotation, stopping
once it is over its limit, without ever holding the whole folder's names in memory."""

from __future__ import annotations

import os
import subprocess
import sys
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest

from ddpq.daemon import measure, sweep
from ddpq.daemon.measure import FolderWalk, Measurer, Running
from ddpq.daemon.quota import DiskWatch
from ddpq.executors.local import cgroups
from tests.test_cgroups import in_cgroup, needs_cgroups, scratch
from tests.test_job_folder_limit import running_with_folder
from tests.worker.rig import make_rig

__all__ = ["scratch"]  # a fixture, used by name

MIB = 1 << 20
FAR = float("inf")

# A job's process that writes SIZE bytes into a file of FOLDER and keeps it open, as HOW
# says; it prints its pids (and its child's) and waits for its stdin to close.
HOLDER = r"""
import os, sys
folder, size, how = sys.argv[1], int(sys.argv[2]), sys.argv[3]
where = os.path.join(folder, "a", "b") if how == "deep" else folder
os.makedirs(where, exist_ok=True)
path = os.path.join(where, "hidden.bin")
if how == "tmpfile":  # never had a name
    fd = os.open(where, os.O_RDWR | os.O_TMPFILE, 0o600)
else:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
for _ in range(size // 65536):
    os.write(fd, b"\1" * 65536)
os.fsync(fd)
if how not in ("named", "tmpfile"):
    os.unlink(path)
pids = [os.getpid()]
if how == "shared":
    copies = [os.dup(fd), os.dup(fd)]  # three descriptors, and a child holding them too
    child = os.fork()
    if child == 0:
        sys.stdin.read()
        os._exit(0)
    pids.append(child)
print(" ".join(map(str, pids)), flush=True)
sys.stdin.read()
"""


class Holder:
    def __init__(self, folder: Path, size: int, how: str, cgroup: Path | None = None) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(folder), str(size), how],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            preexec_fn=in_cgroup(cgroup) if cgroup is not None else None,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, "the holder died before it was ready"
        self.pids = [int(p) for p in line.split()]

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(10)


@pytest.fixture
def holders() -> Iterator[list[Holder]]:
    made: list[Holder] = []
    yield made
    for h in made:
        h.close()


def held(folder: Path, pids: list[int]) -> int:
    """What one look finds the folder holding (a limit of 0: any byte is over it)."""
    return Measurer().look({1: Running(folder, lambda: pids)}, lambda _: 0).get(1, 0)


@pytest.mark.parametrize("how", ["top", "deep", "shared", "tmpfile"])
def test_bytes_a_job_deleted_but_keeps_open_count_once_toward_its_folder(
    tmp_path: Path, holders: list[Holder], how: str
) -> None:
    folder = tmp_path / "7"
    folder.mkdir()
    holder = Holder(folder, 3 * MIB, how)
    holders.append(holder)
    found = held(folder, holder.pids)
    assert 3 * MIB <= found < 3 * MIB + 64 * 1024  # once, however many descriptors
    assert held(folder, []) < 64 * 1024  # what the names alone show: the folders


def test_a_named_open_file_is_counted_once(tmp_path: Path, holders: list[Holder]) -> None:
    folder = tmp_path / "7"
    folder.mkdir()
    holder = Holder(folder, 3 * MIB, "named")
    holders.append(holder)
    assert 3 * MIB <= held(folder, holder.pids) < 3 * MIB + 64 * 1024


def test_deleted_files_on_another_filesystem_are_not_the_folders(
    tmp_path: Path, holders: list[Holder]
) -> None:
    elsewhere = Path("/dev/shm")
    if not elsewhere.is_dir() or elsewhere.stat().st_dev == tmp_path.stat().st_dev:
        pytest.skip("no second filesystem here")
    folder = tmp_path / "7"
    folder.mkdir()
    other = elsewhere / f"ddpq-test-{os.getpid()}"
    other.mkdir()
    try:
        holder = Holder(other, 3 * MIB, "top")
        holders.append(holder)
        assert held(folder, holder.pids) == 0
    finally:
        holder.close()
        holders.remove(holder)
        other.rmdir()


@needs_cgroups
def test_the_disk_watch_stops_a_job_hiding_its_bytes_in_deleted_open_files(
    tmp_path: Path, scratch: Path, holders: list[Holder]
) -> None:
    rig = make_rig(tmp_path / "home", job_folder_max=MIB, state_reserve_bytes=0)
    try:
        tracking = cgroups.detect(rig.settings.home, mode="auto", root=scratch)
        assert tracking.tree is not None
        job, folder = running_with_folder(rig)
        cgroup = cgroups.create(cgroups.job_cgroup(tracking.tree, job, rig.job(job).attempt))
        holders.append(Holder(folder, 3 * MIB, "top", cgroup))
        asked = DiskWatch(rig.settings, clock=rig.clock).step()
        assert list(asked) == [job] and "over the 1M per-job limit" in asked[job]
    finally:
        rig.close()


# ---- many files: streamed, bounded, in rotation, stopped early --------------------------


def many_files(folder: Path, count: int, size: int = 0, name_len: int = 8) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for n in range(count):
        (folder / f"{n:0{name_len}d}").write_bytes(b"\1" * size)


def test_a_walk_stops_soon_after_the_folder_is_over_the_limit(tmp_path: Path) -> None:
    folder = tmp_path / "7"
    many_files(folder, 3000, size=4096)
    walk = FolderWalk(folder)
    seen = walk.advance(1_000_000, FAR, enough=1 * MIB)
    walk.close()
    block = os.stat(folder / "00000000").st_blocks * 512
    assert walk.counted > MIB and not walk.done
    assert seen <= MIB // block + 2 * measure._CHECK_EVERY < 3000


@pytest.mark.parametrize("layout", ["flat", "nested"])
def test_a_folder_bigger_than_a_look_is_measured_over_several_looks(
    tmp_path: Path, layout: str
) -> None:
    """Each look counts 500 entries; the folder's 2000 files of 4K pass a 6M limit only
    counted whole: a walk started afresh each look would never find it."""
    folder = tmp_path / "7"
    if layout == "flat":
        many_files(folder, 2000, size=4096)
    else:
        for part in range(20):
            many_files(folder / f"d{part}" / "e", 100, size=4096)
    watcher = Measurer(entries=500, min_share=500)
    running = {7: Running(folder, lambda: [])}
    looks = 0
    while not watcher.look(running, lambda _: 6 * MIB):
        looks += 1
        assert looks < 10, "never found over its limit"
    assert looks >= 2


def test_jobs_are_measured_in_rotation_when_a_look_runs_out_of_time(tmp_path: Path) -> None:
    running = {}
    for job in (1, 2, 3):
        many_files(tmp_path / str(job), 1, size=2 * MIB)
        running[job] = Running(tmp_path / str(job), lambda: [])
    watcher = Measurer(seconds=0.0)  # each look measures one job only
    found = [list(watcher.look(running, lambda _: MIB)) for _ in range(4)]
    assert found == [[1], [2], [3], [1]]


def test_a_walk_holds_no_list_of_the_folders_names(tmp_path: Path) -> None:
    folder = tmp_path / "7"
    many_files(folder, 20_000, name_len=200)  # listed at once: about 5M of names
    for measuring in (
        lambda: FolderWalk(folder).advance(1_000_000, FAR, None),
        lambda: sweep.folder_usage(tmp_path, "7"),
    ):
        tracemalloc.start()
        try:
            measuring()
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 1 * MIB, peak


def test_walks_of_jobs_no_longer_running_are_closed(tmp_path: Path) -> None:
    folder = tmp_path / "7"
    many_files(folder, 2000)
    watcher = Measurer(entries=100, min_share=100)
    watcher.look({7: Running(folder, lambda: [])}, lambda _: MIB)
    fds = len(os.listdir("/proc/self/fd"))
    watcher.look({}, lambda _: MIB)
    assert len(os.listdir("/proc/self/fd")) < fds  # the walk's descriptors closed


def test_a_run_of_empty_folders_gives_the_walk_its_clock(tmp_path: Path) -> None:
    """Folders with nothing in them yield no entry: once a folder's names were counted, a
    job's million empty subfolders were entered in one step, past the look's deadline.
    Each folder entered is a step now, so a look stops at its bound however empty."""
    folder = tmp_path / "job"
    for i in range(600):
        (folder / f"empty{i}").mkdir(parents=True)
    walk = FolderWalk(folder)
    try:
        # The names (600), then a few of the folders: not all of them in the last step.
        assert walk.advance(610, float("inf"), None) == 610 and not walk.done
        while not walk.done:
            walk.advance(500, float("inf"), None)
    finally:
        walk.close()


def holding_deleted(path: Path, size: int, dups: int) -> tuple[subprocess.Popen[str], int]:
    """A child process holding ``path``, ``size`` bytes, deleted, open through ``dups``
    more descriptors; and its bytes on disk. Kill it when done."""
    holding = (
        "import os, sys\n"
        "p, size, dups = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])\n"
        "open(p, 'wb').write(b'\\1' * size)\n"
        "fd = os.open(p, os.O_RDONLY)\n"
        "os.unlink(p)\n"
        "held = [os.dup(fd) for _ in range(dups)]\n"
        "print(os.fstat(fd).st_blocks * 512, flush=True)\n"
        "sys.stdin.read()\n"
    )
    holder = subprocess.Popen(
        [sys.executable, "-S", "-c", holding, str(path), str(size), str(dups)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None
    return holder, int(holder.stdout.readline())


def test_a_job_with_a_million_descriptors_is_counted_a_share_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A deleted file held open through many descriptors (a job can dup one a million
    times: seconds of stat every look, which all other jobs' looks waited for): each look
    stats at most DESCRIPTORS_PER_LOOK of them, and the count goes on at the next."""
    monkeypatch.setattr(measure, "DESCRIPTORS_PER_LOOK", 100)
    holder, size = holding_deleted(tmp_path / "deleted", MIB, 450)
    try:
        looked: list[int] = []

        def pids() -> list[int]:
            looked.append(1)
            return [holder.pid]

        deleted = measure.DeletedFiles(pids, os.stat(tmp_path).st_dev)
        deleted.advance(measure.DESCRIPTORS_PER_LOOK)
        assert deleted.whole == 0  # under way: 450 descriptors are more than a look's 100
        for _ in range(10):
            deleted.advance(measure.DESCRIPTORS_PER_LOOK)
        assert deleted.whole == size and deleted.counted == size  # whole, once
        assert len(looked) >= 2  # and started again
    finally:
        holder.kill()
        holder.wait()


def test_a_retry_is_counted_afresh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The count under way was the first attempt's processes': once the job runs again,
    its new attempt's deleted files are the ones counted, from the next look."""
    monkeypatch.setattr(measure, "DESCRIPTORS_PER_LOOK", 100)
    folder = tmp_path / "7"
    folder.mkdir()
    first, _ = holding_deleted(tmp_path / "first", MIB, 450)
    second, size = holding_deleted(tmp_path / "second", 3 * MIB, 0)
    try:
        measurer = Measurer()
        measurer.look({7: Running(folder, lambda: [first.pid], 1)}, lambda _: 0)
        held = measurer.look({7: Running(folder, lambda: [second.pid], 2)}, lambda _: 0)
        assert size <= held[7] < size + MIB  # the second attempt's, not both
    finally:
        for p in (first, second):
            p.kill()
            p.wait()


def test_climbing_out_of_a_deep_chain_is_a_step_a_level(tmp_path: Path) -> None:
    """A chain of nested folders is walked down a folder a step, and back up as well: the
    climb out of a million levels was one step, seconds past the look's deadline."""
    folder = tmp_path / "job"
    deep = folder
    for i in range(300):
        deep = deep / f"d{i}"
    deep.mkdir(parents=True)
    walk = FolderWalk(folder)
    steps = 0
    try:
        while not walk.done:
            steps += walk.advance(1, float("inf"), None)
    finally:
        walk.close()
    # Down: each folder entered and its one entry; up: each level climbed.
    assert steps >= 3 * 300
