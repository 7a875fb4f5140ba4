"""A shim born in its v2 cgroup (``clone_into``), and the fork server's way when the kernel
cannot: each case runs in a ``python -S`` process of one thread, as the fork server does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ddpq.executors.local import cgroups

LOCAL = Path(cgroups.__file__).parent  # the fork server's folder: first on its sys.path

# The child's first act is to read its own cgroup: a child moved after its birth would
# still name its parent's there.
SCRIPT = """
import json, os, sys
sys.path.insert(0, sys.argv[1])
import clone_into, forkserver
target, case = sys.argv[2], sys.argv[3]
hooks = []
os.register_at_fork(
    after_in_child=lambda: hooks.append("child"), after_in_parent=lambda: hooks.append("parent")
)
if case == "no-clone3":
    clone_into.SYS_CLONE3 = 1023  # no system call has this number: ENOSYS
    assert clone_into.fork_into(target) is None
    clone_into.SYS_CLONE3 = 435  # remembered: not tried again
read, write = os.pipe()
if case == "module":
    pid, born_in = clone_into.fork_into(target), True
else:
    pid, born_in = forkserver.fork_for({"cgroup": target})
if pid == 0:
    first = open("/proc/self/cgroup").read()
    refused = forkserver.join_cgroups({"cgroup": target}, born_in)
    after = open("/proc/self/cgroup").read()
    import ctypes  # the thread's id as glibc keeps it: the child's own, as fork() leaves it
    where = ctypes.c_void_p()
    clone_into.shim_libc.libc().prctl(clone_into.PR_GET_TID_ADDRESS, ctypes.byref(where), 0, 0, 0)
    kept = ctypes.c_int.from_address(where.value).value
    said = {"first": first, "after": after, "refused": refused, "hooks": hooks,
            "kept_tid": kept, "pid": os.getpid()}
    os.write(write, json.dumps(said).encode())
    os._exit(0)
os.close(write)
child = json.loads(os.read(read, 65536))
_, status = os.waitpid(pid, 0)
print(json.dumps({
    "child": child, "status": status, "born_in": born_in, "parent_hooks": hooks,
    "unavailable": clone_into.unavailable(),
}))
"""


@pytest.fixture
def target() -> Iterator[Path]:
    """A fresh v2 cgroup beneath the test's own; skipped where none can be made."""
    own = cgroups.own_cgroup()
    if own is None:
        pytest.skip("no v2 cgroup of our own here")
    folder = own / f"ddpq-clone-test-{os.getpid()}"
    try:
        folder.mkdir()
    except OSError as exc:
        pytest.skip(f"cannot make a cgroup beneath ours: {exc.strerror}")
    yield folder
    folder.rmdir()


def run(target: Path, case: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-S", "-c", SCRIPT, str(LOCAL), str(target), case],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    said: dict[str, object] = json.loads(done.stdout)
    said["stderr"] = done.stderr
    return said


def v2_line(cgroup_file: str) -> str:
    return next(line for line in cgroup_file.splitlines() if line.startswith("0::"))


@pytest.mark.parametrize("case", ["module", "fork server"])
def test_a_child_is_born_in_its_cgroup_with_pythons_fork_hooks_run(target: Path, case: str) -> None:
    said = run(target, case)
    child = said["child"]
    assert isinstance(child, dict)
    assert v2_line(child["first"]).endswith("/" + target.name), child["first"]
    assert child["refused"] is None and child["first"] == child["after"]
    assert child["hooks"] == ["child"]  # as os.fork runs them: the child's in the child,
    assert said["parent_hooks"] == ["parent"]  # the parent's in the parent
    assert child["kept_tid"] == child["pid"]  # not the parent's (pthread calls on itself)
    assert said["status"] == 0 and said["born_in"] is True and said["unavailable"] is None
    assert said["stderr"] == ""


def test_without_the_kernels_call_the_server_forks_and_joins_by_writing(target: Path) -> None:
    said = run(target, "no-clone3")
    child = said["child"]
    assert isinstance(child, dict)
    assert not v2_line(child["first"]).endswith("/" + target.name)  # forked where it was
    assert child["refused"] is None and v2_line(child["after"]).endswith("/" + target.name)
    assert said["born_in"] is False and said["status"] == 0
    assert said["unavailable"] == "clone3 into a cgroup: Function not implemented"
    # Said once in the daemon's log, with why.
    assert said["stderr"] == (
        "ddpq fork server: shims move into their cgroups by writing "
        "(clone3 into a cgroup: Function not implemented)\n"
    )


def test_a_cgroup_that_cannot_be_opened_forks_nothing_and_the_write_says_why(
    tmp_path: Path,
) -> None:
    missing = tmp_path / "no-such-cgroup"
    said = run(missing, "fork server")
    child = said["child"]
    assert isinstance(child, dict) and said["born_in"] is False
    assert f"cannot join its cgroup {missing}" in str(child["refused"])
    assert said["unavailable"] is None  # this cgroup's fault, not the kernel's
