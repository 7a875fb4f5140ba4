"""A job's limits, enforced by its cgroups (issue 23, items 2, 3 and 5): its cores, its
memory (killed past it, and told so), its processes (a fork bomb stops at its own cap).

The executor tests run real jobs through the local executor, with ``Launch.cores`` and
``Launch.ram_bytes`` set as the scheduler sets them; they need root and the controllers
(this CI machine is hybrid: v1 ``cpuset``, ``memory``, ``pids`` beside a v2 tree with
none), and skip with the reason where a controller is missing. The v2 controllers' path,
which needs a delegated v2 subtree, is tested against a fake cgroupfs in a folder.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ddpq import enforcement
from ddpq.config import Settings
from ddpq.core.disposition import JobFacts, after_exit
from ddpq.core.enforcement import Control, phrase
from ddpq.core.rules import ExitRecord, describe_exit
from ddpq.core.states import JobState
from ddpq.executors.base import Ended
from ddpq.executors.local import cgroup_v1, cgroups, limits
from ddpq.executors.local.executor import LocalExecutor
from tests.helpers import Daemon, wait_for
from tests.launches import a_launch

MIB = 1 << 20


# ---- the executor, on this machine's own controllers ----------------------------------


@pytest.fixture(params=["fork", "exec"])
def executor(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[LocalExecutor]:
    """The local executor, starting shims by either path (each joins its cgroups its way)."""
    monkeypatch.setenv("DDPQ_SPAWN", str(request.param))
    settings = Settings(home=tmp_path / "home", grace_s=1.0, job_pids_max=24)
    settings.home.mkdir()
    made = LocalExecutor(settings, gpu_count=0)
    yield made
    for job_id in list(made._watched):
        made.stop(job_id)
    wait_for(lambda: not made._watched or (made.ended() and not made._watched), 30, "jobs")
    made.close()
    tree = made.tracking.tree
    if tree is not None:
        cgroups.remove(tree)
    for trees in made.limits.v1_trees.values():
        for t in trees:
            t.rmdir()


def needs(executor: LocalExecutor, controller: str) -> None:
    if executor.limits.how(controller) is None:
        pytest.skip(f"no {controller} controller here: {executor.limits.missing.get(controller)}")


def run(executor: LocalExecutor, tmp_path: Path, job_id: int, script: str, **kw: object) -> Ended:
    """Start a Python job, let it run, and wait (bounded) until the executor reports it."""
    launch = a_launch(
        tmp_path / "jobs" / str(job_id),
        job_id=job_id,
        command=[sys.executable, "-c", textwrap.dedent(script)],
        **kw,
    )
    launch.job_dir.parent.mkdir(exist_ok=True)
    executor.start(launch)
    executor.proceed([job_id])
    found: list[Ended] = []

    def done() -> bool:
        found.extend(executor.ended())
        return any(e.job_id == job_id for e in found)

    wait_for(done, 60, f"job {job_id} to end")
    return next(e for e in found if e.job_id == job_id)


def log_of(tmp_path: Path, job_id: int) -> str:
    return (tmp_path / "jobs" / str(job_id) / "output.log").read_text(errors="replace")


def no_job_cgroups(executor: LocalExecutor, job_id: int) -> bool:
    return limits.v1_cgroups(executor.limits, job_id, 1) == [] and not any(
        cgroups.job_cgroup(t, job_id, 1).exists() for t in executor.tracking.trees
    )


def test_a_job_past_its_memory_ends_saying_it_ran_out(
    executor: LocalExecutor, tmp_path: Path
) -> None:
    needs(executor, "memory")
    ended = run(
        executor,
        tmp_path,
        1,
        """
        chunks = []
        for _ in range(40):  # 400 MiB at most, each page written, so really used
            chunks.append(b"x" * (10 << 20))
        print("never here")
        """,
        ram_bytes=150 * MIB,
    )
    assert ended.record.oom_limit_bytes == 150 * MIB
    assert describe_exit(ended.record).startswith("out of memory: used its 150M; ")
    assert "never here" not in log_of(tmp_path, 1)
    assert no_job_cgroups(executor, 1)


def test_a_job_within_its_memory_is_not_called_out_of_memory(
    executor: LocalExecutor, tmp_path: Path
) -> None:
    needs(executor, "memory")
    ended = run(executor, tmp_path, 2, "x = b'x' * (60 << 20)", ram_bytes=150 * MIB)
    assert ended.record.oom_limit_bytes is None
    assert (ended.record.exit_code, ended.record.error) == (0, None)
    # The most it held, as its cgroup counted it: its 60 MiB and the interpreter's own.
    peak = ended.record.peak_ram_bytes
    assert peak is not None and 60 * MIB < peak <= 150 * MIB, peak


def test_a_fork_bomb_stops_at_its_own_cap(executor: LocalExecutor, tmp_path: Path) -> None:
    needs(executor, "pids")
    # Bounded: 200 children at most, each a sleep that its parent kills.
    ended = run(
        executor,
        tmp_path,
        3,
        """
        import os, signal, time
        kids = []
        try:
            for _ in range(200):
                pid = os.fork()
                if pid == 0:
                    time.sleep(60)
                    os._exit(0)
                kids.append(pid)
        except OSError as exc:
            print("refused after", len(kids), exc.errno, flush=True)
        for pid in kids:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        """,
    )
    assert ended.record.exit_code == 0
    words = log_of(tmp_path, 3).split("refused after ")[1].split()
    # The shim and the job itself count against the cap of 24 too.
    assert int(words[0]) <= 22 and int(words[1]) == errno.EAGAIN
    assert no_job_cgroups(executor, 3)


def test_a_job_sees_only_its_cores(executor: LocalExecutor, tmp_path: Path) -> None:
    needs(executor, "cpuset")
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip("one core: a cpuset of it would prove nothing")
    mine = (cores[-1],)
    ended = run(
        executor,
        tmp_path,
        4,
        "import os; print('cores', sorted(os.sched_getaffinity(0)))",
        cores=mine,
    )
    assert ended.record.exit_code == 0
    assert f"cores {list(mine)}" in log_of(tmp_path, 4)
    assert no_job_cgroups(executor, 4)


def test_a_restarted_worker_finds_and_removes_a_jobs_limit_cgroups(
    executor: LocalExecutor, tmp_path: Path
) -> None:
    needs(executor, "pids")
    launch = a_launch(
        tmp_path / "jobs" / "5", job_id=5, command=["sleep", "60"], ram_bytes=64 * MIB
    )
    launch.job_dir.parent.mkdir(exist_ok=True)
    handle = executor.start(launch)
    executor.proceed([5])
    made = limits.v1_cgroups(executor.limits, 5, 1)
    assert made
    # Forked by the fork server, the shim joins them itself, a moment after start.
    wait_for(lambda: all(cgroups.members(p) for p in made), 10, "the shim in its cgroups")
    executor.close()
    executor._watched.clear()  # the first worker is gone; its job runs on

    again = LocalExecutor(executor.settings, gpu_count=0)
    try:
        assert limits.v1_cgroups(again.limits, 5, 1) == made  # busy: kept, and found
        assert again.adopt(5, 1, launch.job_dir, handle) == handle
        assert again.stop(5)
        found: list[Ended] = []

        def ended_now() -> list[Ended]:
            found.extend(again.ended())
            return found

        wait_for(ended_now, 30, "the adopted job to end")
        assert [p for p in made if p.exists()] == []
    finally:
        again.close()


# ---- v1 hierarchies, read from /proc ------------------------------------------------


def test_own_v1_folder_is_read_from_mountinfo_and_proc_cgroup(tmp_path: Path) -> None:
    mnt = tmp_path / "memory"
    (mnt / "lab" / "svc").mkdir(parents=True)
    (mnt / "lab" / "svc" / "cgroup.procs").touch()
    info = tmp_path / "mountinfo"
    info.write_text(
        f"35 31 0:32 / {mnt} rw,relatime - cgroup cgroup rw,memory\n"
        f"36 31 0:33 / {tmp_path}/pids rw,relatime - cgroup cgroup rw,pids\n"
        "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"
    )
    own = tmp_path / "cgroup"
    own.write_text("4:memory:/lab/svc\n8:pids:/\n0::/\n")
    assert cgroup_v1.own_folder("memory", str(info), str(own)) == mnt / "lab" / "svc"
    assert cgroup_v1.own_folder("cpuset", str(info), str(own)) == "no cpuset controller"
    assert "not a cgroup v1 folder" in str(cgroup_v1.own_folder("pids", str(info), str(own)))


# ---- v2 controllers, on a fake cgroupfs -----------------------------------------------


@pytest.fixture
def fake_v2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A daemon's delegated v2 cgroup, as files: it offers cpuset, memory and pids, holds
    the daemon's process, and (as v2 does) refuses to hand a controller down while it does."""
    own = tmp_path / "svc"
    own.mkdir()
    (own / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (own / "cgroup.procs").write_text(f"{os.getpid()}\n")
    (own / "cgroup.subtree_control").write_text("")
    real_write = cgroup_v1.write

    def write(path: Path, value: str) -> None:
        if path == own / "cgroup.subtree_control":
            if cgroup_v1.read(own / "cgroup.procs"):
                raise OSError(errno.EBUSY, "Device or resource busy")
            value = f"{cgroup_v1.read(path)} {value.lstrip('+')}".strip()
        real_write(path, value)

    def add(path: Path, pid: int) -> None:  # a move: out of the parent, into the leaf
        left = [p for p in cgroup_v1.read(own / "cgroup.procs").split() if p != str(pid)]
        (own / "cgroup.procs").write_text("".join(f"{p}\n" for p in left))
        real_write(path / "cgroup.procs", str(pid))

    monkeypatch.setattr(cgroup_v1, "write", write)
    monkeypatch.setattr(cgroups, "add", add)
    monkeypatch.delenv(cgroups.MODE_ENV, raising=False)
    return own


def no_v1(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "mountinfo").write_text("")
    (tmp_path / "cgroup").write_text("0::/svc\n")
    return {"mountinfo": str(tmp_path / "mountinfo"), "proc_cgroup": str(tmp_path / "cgroup")}


def test_v2_controllers_are_enabled_from_a_leaf_and_set_per_job(
    fake_v2: Path, tmp_path: Path
) -> None:
    tree = fake_v2 / "ddpq-test"
    tree.mkdir()
    tracking = cgroups.Tracking("cgroup", tree=tree, trees=(tree,))
    found = limits.detect(tmp_path, tracking, 512, **no_v1(tmp_path))
    assert found.v2 == {"cpuset", "memory", "pids"} and not found.v1
    # The daemon moved itself into a leaf, then handed the controllers down.
    assert (fake_v2 / "daemon" / "cgroup.procs").read_text() == str(os.getpid())
    assert cgroup_v1.read(fake_v2 / "cgroup.subtree_control").split() == [
        "cpuset",
        "memory",
        "pids",
    ]
    assert [phrase(c) for c in found.controls()] == [
        "CPU cores: enforced (cgroup v2)",
        "memory limits: enforced (cgroup v2)",
        "process caps: enforced (cgroup v2, at most 512 per job)",
    ]
    job = tree / "job-7-1"
    job.mkdir()
    launch = a_launch(tmp_path / "j", job_id=7, cores=(3, 1), ram_bytes=150 * MIB)
    assert limits.confine(found, launch, job) == []  # nothing to join beside it
    assert cgroup_v1.read(job / "cpuset.cpus") == "1,3"
    assert cgroup_v1.read(job / "memory.max") == str(150 * MIB)
    assert cgroup_v1.read(job / "memory.swap.max") == "0"
    assert cgroup_v1.read(job / "pids.max") == "512"
    (job / "memory.events").write_text("low 0\nhigh 0\nmax 9\noom 1\noom_kill 1\n")
    assert limits.oom_limit(found, limits.v1_cgroups(found, 7, 1), job) == 150 * MIB


def test_a_daemon_sharing_its_cgroup_moves_no_one_else_and_says_why(
    fake_v2: Path, tmp_path: Path
) -> None:
    """Run by hand from a login session (root, pure v2): the shell shares the daemon's
    cgroup. It is not moved; the controllers are said to be missing, with the reason."""
    (fake_v2 / "cgroup.procs").write_text(f"{os.getpid()}\n1\n")
    tree = fake_v2 / "ddpq-test"
    tree.mkdir()
    tracking = cgroups.Tracking("cgroup", tree=tree, trees=(tree,))
    found = limits.detect(tmp_path, tracking, 64, **no_v1(tmp_path))
    assert found.v2 == set()
    assert cgroup_v1.read(fake_v2 / "cgroup.procs").split() == [str(os.getpid()), "1"]
    said = found.describe()
    assert "memory limits: not enforced (cannot enable memory under " in said
    assert "other processes share the daemon's cgroup (PID 1)" in said


def test_serves_api_half_moves_into_the_leaf_beside_its_worker(
    fake_v2: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`ddpq serve` is two processes in the service's cgroup: the worker moves its API
    half (its parent, a companion) into the leaf with itself, or no controller could be
    handed down under systemd with cgroup v2."""
    api_half = os.getppid()
    (fake_v2 / "cgroup.procs").write_text(f"{api_half}\n{os.getpid()}\n")
    monkeypatch.setattr(cgroups, "_companions", {api_half})
    tree = fake_v2 / "ddpq-test"
    tree.mkdir()
    tracking = cgroups.Tracking("cgroup", tree=tree, trees=(tree,))
    found = limits.detect(tmp_path, tracking, 64, **no_v1(tmp_path))
    assert found.v2 == {"cpuset", "memory", "pids"}
    assert cgroup_v1.read(fake_v2 / "cgroup.procs") == ""  # both moved out of it


def test_a_missing_controller_is_said_missing_never_pretended(
    fake_v2: Path, tmp_path: Path
) -> None:
    (fake_v2 / "cgroup.controllers").write_text("cpu io pids\n")
    tree = fake_v2 / "ddpq-test"
    tree.mkdir()
    tracking = cgroups.Tracking("cgroup", tree=tree, trees=(tree,))
    found = limits.detect(tmp_path, tracking, 0, **no_v1(tmp_path))
    said = found.describe()
    assert "memory limits: not enforced (no memory controller)" in said
    assert "CPU cores: not enforced (no cpuset controller)" in said
    assert "process caps: not enforced (job_pids_max is 0)" in said


def test_session_tracking_enforces_no_limits_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(cgroups.MODE_ENV, "session")
    found = limits.detect(tmp_path, cgroups.Tracking("session", why="asked"), 4096)
    assert found.v2 == set() and not found.v1
    assert all(
        not c.enforced and c.how == "DDPQ_TRACKING=session: no job cgroups"
        for c in found.controls()
    )


# ---- the reason, the record for the API ------------------------------------------------


def test_the_oom_reason_names_the_limit_and_only_for_a_job_that_failed() -> None:
    killed = ExitRecord(None, 9, 0.0, 1.0, oom_limit_bytes=150 * MIB)
    assert describe_exit(killed) == "out of memory: used its 150M; killed by signal 9"
    survived = ExitRecord(0, None, 0.0, 1.0, oom_limit_bytes=150 * MIB)
    assert describe_exit(survived) == "exit code 0"


def test_an_oom_killed_attempt_fails_with_the_reason() -> None:
    record = ExitRecord(None, 9, 0.0, 1.0, oom_limit_bytes=150 * MIB)
    facts = JobFacts(attempt=1, max_retries=0, port_retries=0, stop=None)
    done = after_exit(record, facts, grace_s=1.0, max_port_retries=0, now=1.0)
    assert done.job_state is JobState.FAILED
    assert done.job_reason == "out of memory: used its 150M; killed by signal 9"


def test_the_enforcement_record_round_trips_and_rejects_junk(tmp_path: Path) -> None:
    controls = [Control("memory", False, "no memory controller"), Control("pids", True, "v1")]
    enforcement.publish(tmp_path, controls)
    assert enforcement.read(tmp_path) == controls
    (tmp_path / enforcement.FILE).write_text('[{"controller": 1}, "x", {"enforced": true}]')
    assert enforcement.read(tmp_path) == []
    enforcement.publish(tmp_path, None)
    assert enforcement.read(tmp_path) == []


# ---- the daemon says it --------------------------------------------------------------


def test_serve_and_gpus_say_what_enforces_jobs_limits(
    make_daemon: Callable[..., Daemon],
) -> None:
    d = make_daemon("--fake-gpus", "1")
    limits_said = d.client().devices().limits
    assert [x.controller for x in limits_said] == ["cpuset", "memory", "pids"]
    log = (d.home / "daemon.log").read_text(errors="replace")
    shown = subprocess.run(
        [sys.executable, "-m", "ddpq", "gpus"],
        capture_output=True,
        text=True,
        cwd="/tmp",
        env={**os.environ, "DDPQ_URL": d.url, "COLUMNS": "200"},
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    for x in limits_said:
        assert x.said in log and x.said in shown.stdout
        assert x.said.endswith(f"({x.how})")


def test_session_tracking_says_no_limits_in_gpus(make_daemon: Callable[..., Daemon]) -> None:
    d = make_daemon("--fake-gpus", "1", DDPQ_TRACKING="session")
    said = [x.said for x in d.client().devices().limits]
    assert said == [
        f"{noun}: not enforced (DDPQ_TRACKING=session: no job cgroups)"
        for noun in ("CPU cores", "memory limits", "process caps")
    ]


def test_a_daemon_started_in_its_leaf_makes_job_cgroups_beside_it(tmp_path: Path) -> None:
    """A restart (or systemd's DelegateSubgroup=daemon) starts the daemon in the leaf an
    earlier run moved into: its job cgroups go beside the leaf, not under it."""
    leaf = tmp_path / "svc" / limits.LEAF
    leaf.mkdir(parents=True)
    (tmp_path / "svc" / "cgroup.procs").touch()
    assert cgroups.outside_own_leaf(leaf) == tmp_path / "svc"
    assert cgroups.outside_own_leaf(tmp_path / "svc") == tmp_path / "svc"
    assert cgroups.outside_own_leaf(None) is None
