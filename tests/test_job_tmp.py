"""A job's TMPDIR is its attempt's own folder (``$DDPQ_JOB_DIR/tmp``): empty when the job
starts, gone when it ends, whatever the job left in it; a TMPDIR the submission chose is
the job's to keep (``executors.contract.own_tmp``, ``executors.local.shim_tmp``)."""

from __future__ import annotations

import json
import os
import stat
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from ddpq.core import jobenv
from ddpq.core.spec import JobSpec
from ddpq.executors.base import Launch
from ddpq.executors.contract import job_env
from ddpq.executors.local import shim_tmp
from ddpq.schemas import JobSubmit
from tests.helpers import Daemon, reachable_folder, what_it_said


def launch(exported: dict[str, str] | None, env: dict[str, str]) -> Launch:
    spec = JobSpec("j", "alice", ["true"], "/", 0, "plain", env=jobenv.pack(exported, env))
    return Launch(7, 1, Path("/srv/ddpq/jobs/7"), spec, (), None, None)


@pytest.mark.parametrize(
    ("exported", "env", "tmpdir"),
    [
        (None, {}, "/srv/ddpq/jobs/7/tmp"),  # the daemon's TMPDIR is not the job's
        ({"PATH": "/bin"}, {}, "/srv/ddpq/jobs/7/tmp"),
        (None, {"TMPDIR": "/scratch/a"}, "/scratch/a"),  # --env TMPDIR=...
        ({"TMPDIR": "/tmp/user/1000"}, {}, "/tmp/user/1000"),  # the submitter's shell's
    ],
)
def test_tmpdir_is_the_attempts_own_unless_the_submission_chose_one(
    exported: dict[str, str] | None, env: dict[str, str], tmpdir: str
) -> None:
    got = job_env(launch(exported, env), {"TMPDIR": "/daemon/tmp"}, omp_threads=1)
    assert got["TMPDIR"] == tmpdir


def leftover_tree(tmp: Path, outside: Path, make: bool = False) -> None:
    """An earlier attempt's leftovers: nested files, a link out, an unreadable folder."""
    if make:
        tmp.mkdir()
    (tmp / "a" / "b").mkdir(parents=True)
    (tmp / "a" / "b" / "f").write_bytes(b"x" * 100)
    (tmp / "link").symlink_to(outside)
    (tmp / "a" / "dirlink").symlink_to(outside.parent, target_is_directory=True)
    (tmp / "closed").mkdir()
    (tmp / "closed" / "f").write_text("x")
    (tmp / "closed").chmod(0)


# What a job may leave where its temporary folder goes: a class of entries, not one.
LEFTOVERS: dict[str, Callable[[Path, Path], object]] = {
    "nothing": lambda tmp, outside: None,
    "a tree with links out and a closed folder": lambda tmp, outside: leftover_tree(
        tmp, outside, make=True
    ),
    "a link to another folder": lambda tmp, outside: tmp.symlink_to(outside.parent),
    "a link to a file": lambda tmp, outside: tmp.symlink_to(outside),
    "a dangling link": lambda tmp, outside: tmp.symlink_to(tmp.parent / "nowhere"),
    "a file": lambda tmp, outside: tmp.write_text("not a folder"),
    "a FIFO": lambda tmp, outside: os.mkfifo(tmp),
}


@pytest.mark.parametrize("leftover", LEFTOVERS.values(), ids=LEFTOVERS.keys())
def test_fresh_makes_an_empty_private_folder_and_follows_no_link(
    tmp_path: Path, leftover: Callable[[Path, Path], object]
) -> None:
    outside = tmp_path / "elsewhere" / "precious"
    outside.parent.mkdir()
    outside.write_text("keep me")
    tmp = tmp_path / "job" / "tmp"
    tmp.parent.mkdir()
    leftover(tmp, outside)

    assert shim_tmp.fresh(str(tmp)) is None
    info = tmp.lstat()
    assert stat.S_ISDIR(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o700
    assert list(tmp.iterdir()) == []
    assert outside.read_text() == "keep me" and sorted(os.listdir(outside.parent)) == ["precious"]

    leftover_tree(tmp, outside)
    assert shim_tmp.remove(str(tmp)) is True
    assert not os.path.lexists(tmp) and outside.read_text() == "keep me"


def test_removal_is_bounded_in_time_and_depth_and_never_raises(tmp_path: Path) -> None:
    tmp = tmp_path / "tmp"
    deep = tmp.joinpath(*["d"] * (shim_tmp.MAX_DEPTH + 5))
    deep.mkdir(parents=True)
    (deep / "f").write_text("x")
    (tmp / "shallow").write_text("x")
    (tmp / "d" / "shallow").write_text("x")
    assert shim_tmp.remove(str(tmp)) is False  # the deepest levels stay, nothing raised
    assert (deep / "f").exists()  # the chain too deep to walk is left whole
    assert not (tmp / "shallow").exists() and not (tmp / "d" / "shallow").exists()
    # A leftover that could not be emptied is the same job's: used as it is.
    assert shim_tmp.fresh(str(tmp)) is None and tmp.is_dir()

    wide = tmp_path / "wide"
    wide.mkdir()
    for i in range(50):
        (wide / str(i)).write_text("x")
    assert shim_tmp.remove(str(wide), within_s=0.0) is False  # out of time at once
    assert wide.is_dir()
    assert shim_tmp.remove(str(wide)) is True and not wide.exists()


def as_nobody(work: Path, step: Callable[[Path], object]) -> object:
    """``step(work)`` in a child that has become nobody (root ignores a folder's mode), its
    answer as JSON; ``work`` is reachable by nobody."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.setgid(65534)
            os.setuid(65534)
            os.write(write, json.dumps(step(work)).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as got:
        answer = got.read()
    os.waitpid(pid, 0)
    return json.loads(answer)


def closed_and_read_only(work: Path) -> object:
    """As nobody: a TMPDIR left read-only, holding a closed folder and a read-only one, each
    with files in it; then fresh, and what is there."""
    tmp = work / "tmp"
    for folder in (tmp / "closed" / "deeper", tmp / "read-only" / "deeper"):
        folder.mkdir(parents=True)
        (folder / "f").write_text("x")
    (tmp / "closed").chmod(0)
    (tmp / "read-only" / "deeper").chmod(0o555)
    (tmp / "read-only").chmod(0o555)
    tmp.chmod(0o555)
    why = shim_tmp.fresh(str(tmp))
    return [why, sorted(os.listdir(tmp)), oct(stat.S_IMODE(tmp.stat().st_mode))]


def test_what_the_job_closed_or_left_read_only_is_emptied_all_the_same() -> None:
    work = reachable_folder("ddpq-tmp-")
    os.chmod(work, 0o777)
    assert as_nobody(work, closed_and_read_only) == [None, [], "0o700"]


def test_a_folder_it_cannot_make_is_said(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-folder" / "tmp"
    why = shim_tmp.fresh(str(missing))
    assert why == f"cannot make its temporary folder {missing}: No such file or directory"


# The job: where its temporary files go, what it leaves there, and where torchrun's went.
USES_TMP = """
import json, os, sys, tempfile
made = tempfile.mkdtemp()
open(os.path.join(made, "left"), "w").write("x")
os.makedirs(os.path.join(os.environ["TMPDIR"], "a", "b"))
os.symlink(sys.argv[1], os.path.join(os.environ["TMPDIR"], "a", "link"))  # a folder outside
print("SAW=" + json.dumps({"tmpdir": os.environ["TMPDIR"], "made": made,
      "listed": sorted(os.listdir(os.environ["TMPDIR"]))}))
"""


def saw(d: Daemon, job_id: int) -> dict[str, object]:
    return what_it_said(d.client(), job_id)


def test_a_jobs_temporary_files_are_its_own_and_gone_when_it_ends(
    shared_daemon: Daemon, tmp_path: Path
) -> None:
    d = shared_daemon
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("keep me")
    job = d.client().submit(JobSubmit(command=[sys.executable, "-c", USES_TMP, str(outside)]))
    seen = saw(d, job.id)
    folder = d.home / "jobs" / str(job.id)
    assert seen["tmpdir"] == str(folder / "tmp")
    assert str(seen["made"]).startswith(f"{folder / 'tmp'}/")
    assert not (folder / "tmp").exists()  # removed after the job, with what it left
    assert (folder / "output.log").exists()
    assert (outside / "precious").read_text() == "keep me"  # the link went, not its folder


def test_a_tmpdir_the_job_chose_is_kept(shared_daemon: Daemon, tmp_path: Path) -> None:
    d = shared_daemon
    mine = tmp_path / "scratch"
    mine.mkdir()
    job = d.client().submit(
        JobSubmit(command=[sys.executable, "-c", USES_TMP, str(mine)], env={"TMPDIR": str(mine)})
    )
    seen = saw(d, job.id)
    assert seen["tmpdir"] == str(mine) and Path(str(seen["made"])).parent == mine
    assert (Path(str(seen["made"])) / "left").exists()  # the job's to keep
    assert not (d.home / "jobs" / str(job.id) / "tmp").exists()


def test_torchrun_leaves_nothing_in_the_hosts_tmp(shared_daemon: Daemon, tmp_path: Path) -> None:
    """torchrun makes a ``torchelastic_*`` log folder on every run and never removes it:
    under ddpq it is made in the attempt's folder, and goes with it."""
    d = shared_daemon
    script = tmp_path / "uses_tmp.py"
    script.write_text(USES_TMP)
    job = d.client().submit(JobSubmit(command=[str(script), str(tmp_path)], gpus=1, torchrun=True))
    seen = saw(d, job.id)
    listed = seen["listed"]
    assert isinstance(listed, list)
    assert any(name.startswith("torchelastic_") for name in listed), listed
    assert not (d.home / "jobs" / str(job.id) / "tmp").exists()
