"""A job's /dev/shm is its own (``executors.local.shim_shm``): empty when it starts, shared by
its processes, unseen by the host and other jobs, freed with what it left when it ends, as
large as the job's memory limit; ``--no-private-shm`` gives jobs the host's."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ddpq.executors.local import shim_shm, spawn
from ddpq.schemas import JobSubmit
from tests.helpers import Daemon, what_it_said

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not os.path.isdir("/dev/shm"),
    reason="a private /dev/shm is made by a root daemon, on a host that has one",
)

# The job: what it sees in /dev/shm, and what it leaves there (a file, and a file its
# child process writes: the job's processes share it).
USES_SHM = """
import json, os, subprocess, sys
name = sys.argv[1]
with open(f"/dev/shm/{name}", "w") as f:
    f.write("left behind")
subprocess.run(["sh", "-c", f"echo child > /dev/shm/{name}-child"], check=True)
shm = os.statvfs("/dev/shm")
print("SAW=" + json.dumps({"listed": sorted(os.listdir("/dev/shm")),
      "size": shm.f_blocks * shm.f_frsize, "ns": os.stat("/proc/self/ns/mnt").st_ino}))
"""


@pytest.fixture
def host_marker() -> Iterator[Path]:
    """A file in the host's /dev/shm, which a job with its own must not see."""
    marker = Path(f"/dev/shm/ddpq-test-host-{os.getpid()}")
    marker.write_text("the host's")
    yield marker
    marker.unlink()


def run(d: Daemon, name: str, mem: str | None = None, cwd: str | None = None) -> dict[str, object]:
    c = d.client()
    command = [sys.executable, "-c", USES_SHM, name]
    job = c.submit(JobSubmit(command=command, mem=mem, cwd=cwd))
    return {**what_it_said(c, job.id), "job": job.id}


def test_a_jobs_shm_is_its_own_and_freed_when_it_ends(
    shared_daemon: Daemon, host_marker: Path
) -> None:
    name = f"ddpq-test-job-{os.getpid()}"
    seen = run(shared_daemon, name, mem="64M")
    assert seen["listed"] == [name, f"{name}-child"]  # nothing of the host's, both its own
    assert seen["size"] == 64 << 20  # its memory limit
    assert host_marker.read_text() == "the host's"
    # Its namespace, and the tmpfs in it, went with the job's last process: no process of
    # this job is in it (the kernel may give its number to another job's meanwhile).
    assert seen["ns"] != os.stat("/proc/self/ns/mnt").st_ino
    assert in_namespace(seen["ns"], f"DDPQ_JOB_ID={seen['job']}".encode()) == []


def in_namespace(ns: object, marker: bytes) -> list[int]:
    """The processes in mount namespace ``ns`` whose environment holds ``marker``."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):  # gone meanwhile
            if os.stat(f"/proc/{pid}/ns/mnt").st_ino != ns:
                continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                if marker in f.read(1 << 20).split(b"\x00"):
                    found.append(int(pid))
    return found


def test_a_job_working_under_dev_shm_keeps_the_hosts(
    shared_daemon: Daemon, host_marker: Path
) -> None:
    """Its own would hide its working folder: it gets the host's, as before."""
    here = Path(f"/dev/shm/ddpq-test-cwd-{os.getpid()}")
    here.mkdir()
    name = f"ddpq-test-cwd-job-{os.getpid()}"
    try:
        seen = run(shared_daemon, name, cwd=str(here))
        listed = seen["listed"]
        assert isinstance(listed, list) and host_marker.name in listed
    finally:
        shutil.rmtree(here)
        for left in (name, f"{name}-child"):
            Path(f"/dev/shm/{left}").unlink(missing_ok=True)


@pytest.mark.parametrize(
    ("path", "under"),
    [
        ("/dev/shm", True),
        ("/dev/shm/a/b", True),
        ("/dev/shm/../tmp", False),
        ("/dev//shm/", True),
        ("/dev/shmx", False),
        ("/tmp", False),
    ],
)
def test_what_lies_on_the_hosts_dev_shm(path: str, under: bool) -> None:
    assert spawn.under_shm(path) is under


def test_no_private_shm_gives_jobs_the_hosts(
    make_daemon: Callable[..., Daemon], host_marker: Path
) -> None:
    d = make_daemon("--fake-gpus", "1", "--no-private-shm")
    name = f"ddpq-test-shared-{os.getpid()}"
    try:
        seen = run(d, name)
        listed = seen["listed"]
        assert isinstance(listed, list) and host_marker.name in listed and name in listed
        assert Path(f"/dev/shm/{name}").read_text() == "left behind"  # as before ddpq had it
    finally:
        for left in (name, f"{name}-child"):
            Path(f"/dev/shm/{left}").unlink(missing_ok=True)


def in_child(step: Callable[[], str | None]) -> tuple[str | None, int]:
    """``step`` run in a forked child; what it returned and the size of the child's
    /dev/shm then."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            why = step()
            shm = os.statvfs("/dev/shm")
            os.write(write, json.dumps([why, shm.f_blocks * shm.f_frsize]).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as got:
        why, size = json.loads(got.read())
    os.waitpid(pid, 0)
    return why, size


def test_make_private_mounts_a_tmpfs_of_the_size_asked_only_for_its_process() -> None:
    host = os.statvfs("/dev/shm")
    why, size = in_child(lambda: shim_shm.make_private(8 << 20))
    assert (why, size) == (None, 8 << 20)
    assert os.statvfs("/dev/shm").f_blocks == host.f_blocks  # ours is unchanged


def test_without_root_it_says_why_and_changes_nothing() -> None:
    def as_nobody() -> str | None:
        os.setgid(65534)
        os.setuid(65534)
        return shim_shm.make_private(8 << 20)

    host = os.statvfs("/dev/shm")
    why, size = in_child(as_nobody)
    assert why == "cannot give the job a mount namespace of its own: Operation not permitted"
    assert size == host.f_blocks * host.f_frsize


def test_a_host_that_refuses_it_is_found_once_by_a_child() -> None:
    def as_nobody() -> str | None:  # where mounting is refused, as in a container
        os.setgid(65534)
        os.setuid(65534)
        shim_shm._REFUSED_HERE.clear()
        first = shim_shm.refused_here()
        again = shim_shm.refused_here()
        return first if again == first and len(shim_shm._REFUSED_HERE) == 1 else "tried twice"

    why, _ = in_child(as_nobody)
    assert why == "cannot give the job a mount namespace of its own: Operation not permitted"
    assert in_child(shim_shm.refused_here)[0] is None  # as root it is not refused


def test_a_trial_that_failed_on_its_own_is_tried_again() -> None:
    """A trial child killed before it could answer says nothing of the host: that job gets
    the host's /dev/shm, and the next is tried again (kept, it was every job's for the
    fork server's life)."""

    def silent_then_sound() -> str | None:
        real = shim_shm.make_private
        shim_shm._REFUSED_HERE.clear()
        shim_shm.make_private = lambda size: os._exit(1)
        first = shim_shm.refused_here()
        shim_shm.make_private = real
        kept = len(shim_shm._REFUSED_HERE)
        second = shim_shm.refused_here()
        return f"{first}|{kept}|{second}"

    said, _ = in_child(silent_then_sound)
    assert said == "cannot give a job a /dev/shm of its own: the trial child said nothing|0|None"
