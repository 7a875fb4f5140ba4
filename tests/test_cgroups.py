"""A cgroup per job: processes a job cannot take out of supervision, and its GPU fence.

The unit tests work in scratch cgroups under this process's own (cgroup v2) and the
daemon tests need it too; both skip cleanly where there is no v2 hierarchy or no
right to create cgroups. The fence tests also need root and ``bpf()``: they make
fake GPU nodes (char 195:N) in a temporary folder, where an open the fence allows
fails with ENXIO (no driver behind the node) and one it denies with EPERM.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import json
import os
import random
import signal
import stat
import struct
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ddpq.executors.local import cgroups, gpu_fence
from ddpq.schemas import JobSubmit
from tests.helpers import Daemon, alive, lose_shim_while_down, wait_done, wait_for, wait_state
from tests.test_supervision import JOBS, job_pids


def _scratch_parent() -> Path | None:
    """Our own v2 cgroup, if we may make cgroups under it."""
    own = cgroups.own_cgroup()
    if own is None:
        return None
    probe = own / f"ddpq-test-probe-{os.getpid()}"
    try:
        probe.mkdir()
        probe.rmdir()
    except OSError:
        return None
    return own


PARENT = _scratch_parent()
needs_cgroups = pytest.mark.skipif(PARENT is None, reason="no cgroup v2 we may create cgroups in")
FENCE_ERROR = (
    "not root"
    if os.geteuid() != 0
    else ("no cgroup v2" if PARENT is None else gpu_fence.probe(PARENT))
)
needs_fence = pytest.mark.skipif(FENCE_ERROR is not None, reason=f"no GPU fence: {FENCE_ERROR}")


@pytest.fixture
def scratch() -> Iterator[Path]:
    """An empty cgroup of this test's own; it and everything in it are gone afterwards."""
    assert PARENT is not None
    path = PARENT / f"ddpq-test-{os.getpid()}-{random.randrange(1 << 30)}"
    path.mkdir()
    yield path
    for child in sorted(path.rglob("*"), key=lambda p: -len(p.parts)):
        if child.is_dir():
            cgroups.destroy(child, timeout=5)
    cgroups.destroy(path, timeout=5)


def token() -> str:
    """A sleep duration no other process on this machine has on its command line."""
    return f"{random.randrange(1000, 9000)}.{random.randrange(10**6):06d}"


def with_token(tok: str) -> list[int]:
    """Live processes running ``sleep TOK`` (found by command line, whatever their session,
    environment or parent)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{name}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if tok.encode() in cmdline and alive(int(name)):
            found.append(int(name))
    return found


@contextlib.contextmanager
def killing(*tokens: str) -> Iterator[None]:
    """Whatever the outcome, end every process a test started under these tokens."""
    try:
        yield
    finally:
        for tok in tokens:
            for pid in with_token(tok):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)


def in_cgroup(path: Path) -> Callable[[], None]:
    """A preexec_fn putting the child in ``path`` before it runs anything."""
    return lambda: cgroups.add(path, os.getpid())


# ---- cgroups.py against the real hierarchy ------------------------------------


@needs_cgroups
def test_detect_makes_one_tree_per_state_folder(tmp_path: Path, scratch: Path) -> None:
    a = cgroups.detect(tmp_path / "a", mode="auto", root=scratch)
    b = cgroups.detect(tmp_path / "b", mode="auto", root=scratch)
    assert a.kind == b.kind == "cgroup"
    assert a.tree is not None and b.tree is not None and a.tree != b.tree
    assert a.tree.parent == scratch and a.tree.name.startswith("ddpq-") and a.tree.is_dir()
    assert a.trees == (a.tree,)
    assert cgroups.detect(tmp_path / "a", mode="auto", root=scratch).tree == a.tree
    assert "tracked by cgroup" in a.describe()
    forced = cgroups.detect(tmp_path / "a", mode="session", root=scratch)
    assert forced.kind == "session" and forced.tree is None and forced.trees == ()
    assert "tracked by session" in forced.describe() and "DDPQ_TRACKING" in forced.describe()
    missing = cgroups.detect(tmp_path / "a", mode="auto", root=tmp_path)
    assert missing.kind == "session" and "not a cgroup v2 folder" in missing.why


@needs_cgroups
def test_own_cgroup_is_where_this_process_is() -> None:
    own = cgroups.own_cgroup()
    assert own is not None
    assert os.getpid() in cgroups.members(own)


@needs_cgroups
def test_a_job_cgroup_holds_every_descendant_and_destroy_ends_them(scratch: Path) -> None:
    job = cgroups.create(cgroups.job_cgroup(scratch, 7, 2))
    assert job.name == "job-7-2" and cgroups.members(job) == [] and not cgroups.populated(job)
    tok = token()
    script = f"sleep {tok} & setsid -f env -i sleep {tok}; exec sleep {tok}"
    with killing(tok):
        proc = subprocess.Popen(["sh", "-c", script], preexec_fn=in_cgroup(job))
        wait_for(lambda: len(with_token(tok)) == 3, what="three sleeps")

        # setsid -f forks once more before the exec: for a moment that fork is a member too.
        def just_the_sleeps() -> bool:
            return sorted(cgroups.members(job)) == sorted(with_token(tok))

        wait_for(just_the_sleeps, what="the cgroup to hold the three sleeps and nothing else")
        assert cgroups.populated(job)
        assert cgroups.destroy(job, timeout=5)
        proc.wait(5)
        assert with_token(tok) == [] and not job.exists()
    assert cgroups.destroy(job)  # gone already: nothing to do


@needs_cgroups
def test_kill_without_cgroup_kill_sigkills_member_by_member(
    scratch: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kernels before 5.14 have no cgroup.kill: each member is killed, until none is left."""

    def no_kill_file(path: Any, *args: Any, **kw: Any) -> Any:
        if str(path).endswith("cgroup.kill"):
            raise FileNotFoundError(errno.ENOENT, "no such file", str(path))
        return builtins.open(path, *args, **kw)

    monkeypatch.setattr(cgroups, "open", no_kill_file, raising=False)
    job = cgroups.create(scratch / "job-1-1")
    tok = token()
    # Keeps forking: a single pass over the members could miss a new child.
    script = f"while :; do sleep {tok} & sleep 0.01; done"
    with killing(tok):
        proc = subprocess.Popen(["sh", "-c", script], preexec_fn=in_cgroup(job))
        wait_for(lambda: len(with_token(tok)) >= 3, what="a few sleeps")
        assert cgroups.destroy(job, timeout=5)
        proc.wait(5)
        assert with_token(tok) == []


@needs_cgroups
def test_a_restart_from_another_cgroup_still_finds_busy_job_cgroups(
    tmp_path: Path, scratch: Path
) -> None:
    first, second = scratch / "first", scratch / "second"
    first.mkdir()
    second.mkdir()
    old = cgroups.detect(tmp_path, mode="auto", root=first)
    assert old.tree is not None
    busy = cgroups.create(old.tree / "job-1-1")
    cgroups.create(old.tree / "job-2-1")  # empty: left by an interrupted launch
    tok = token()
    with killing(tok):
        proc = subprocess.Popen(["sleep", tok], preexec_fn=in_cgroup(busy))
        new = cgroups.detect(tmp_path, mode="auto", root=second)
        assert new.tree is not None and new.tree.parent == second
        assert new.trees == (new.tree, old.tree)
        assert not (old.tree / "job-2-1").exists() and busy.exists()
        assert cgroups.destroy(busy)
        proc.wait(5)
    # Once its last job cgroup is gone, the old tree is forgotten and removed.
    assert cgroups.detect(tmp_path, mode="auto", root=second).trees == (new.tree,)
    assert not old.tree.exists()


# ---- the device program ---------------------------------------------------------


def run_program(code: bytes, dev_type: int, major: int, minor: int) -> int:
    """Interpret the few eBPF instructions gpu_fence emits (a check that needs no kernel)."""
    regs = [0] * 11
    ctx = [(2 << 16) | dev_type, major, minor]
    insns = [struct.unpack("=BBhi", code[i : i + 8]) for i in range(0, len(code), 8)]
    pc = 0
    while True:
        op, reg_byte, off, imm = insns[pc]
        dst, src = (reg_byte & 15, reg_byte >> 4)
        if sys.byteorder != "little":
            dst, src = src, dst
        pc += 1
        if op == 0x61:
            assert src == 1  # loads come from the context only
            regs[dst] = ctx[off // 4]
        elif op == 0x54:
            regs[dst] &= imm
        elif op in (0x55, 0x15):
            if (regs[dst] != imm) == (op == 0x55):
                pc += off
        elif op == 0xB7:
            regs[dst] = imm
        elif op == 0x95:
            return regs[0]
        else:
            raise AssertionError(f"unexpected opcode {op:#x}")


def test_the_device_program_denies_only_unleased_nvidia_gpus() -> None:
    code = gpu_fence.program([1, 3])
    char, block = 2, 1
    assert [run_program(code, char, 195, m) for m in range(5)] == [0, 1, 0, 1, 0]
    assert run_program(code, char, 195, 255) == 1  # nvidiactl
    assert run_program(code, char, 195, 254) == 1  # nvidia-modeset
    assert run_program(code, char, 508, 0) == 1  # nvidia-uvm (a dynamic major)
    assert run_program(code, char, 1, 3) == 1  # /dev/null
    assert run_program(code, block, 195, 0) == 1  # a block device that happens to be 195
    none = gpu_fence.program([])
    assert [run_program(none, char, 195, m) for m in range(3)] == [0, 0, 0]
    assert run_program(none, char, 195, 255) == 1


def fake_gpu_nodes(folder: Path, count: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for n in range(count):
        os.mknod(folder / f"nvidia{n}", stat.S_IFCHR | 0o666, os.makedev(195, n))
    os.mknod(folder / "nvidiactl", stat.S_IFCHR | 0o666, os.makedev(195, 255))
    try:
        os.close(os.open(folder / "nvidia0", os.O_RDWR))
    except OSError as exc:
        if exc.errno not in (errno.ENXIO, errno.ENODEV):  # e.g. EACCES on a nodev mount
            pytest.skip(f"device nodes cannot be opened in {folder}: {exc.strerror}")
    return folder


# Prints {node: errno or 0} for each fake node, tried with CUDA_VISIBLE_DEVICES unset,
# and what CUDA_VISIBLE_DEVICES was.
OPEN_ALL = """
import json, os, sys
result = {"cvd": os.environ.pop("CUDA_VISIBLE_DEVICES", None)}
for name in sorted(os.listdir(sys.argv[1])):
    try:
        os.close(os.open(os.path.join(sys.argv[1], name), os.O_RDWR))
        result[name] = 0
    except OSError as exc:
        result[name] = exc.errno
print(json.dumps(result))
"""
OPENED = (errno.ENXIO, errno.ENODEV)  # allowed: the node opens, but no driver answers


@needs_fence
def test_the_fence_lets_a_cgroup_open_only_its_gpus(tmp_path: Path, scratch: Path) -> None:
    nodes = fake_gpu_nodes(tmp_path / "dev", 4)
    job = cgroups.create(scratch / "job-1-1")
    gpu_fence.attach(job, [1])
    out = subprocess.run(
        [sys.executable, "-c", OPEN_ALL, str(nodes)],
        preexec_fn=in_cgroup(job),
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    seen = json.loads(out.stdout)
    assert seen["nvidia1"] in OPENED and seen["nvidiactl"] in OPENED
    assert [seen[f"nvidia{n}"] for n in (0, 2, 3)] == [errno.EPERM] * 3
    outside = json.loads(subprocess.check_output([sys.executable, "-c", OPEN_ALL, str(nodes)]))
    assert all(v in OPENED for k, v in outside.items() if k != "cvd")  # only the job is fenced


@needs_fence
def test_a_gpu_set_s_program_is_loaded_once_and_fences_every_cgroup_it_is_given(
    tmp_path: Path, scratch: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    nodes = fake_gpu_nodes(tmp_path / "dev", 4)
    loads: list[tuple[int, ...]] = []
    real_load = gpu_fence.load

    def counted(minors: Any) -> int:
        loads.append(tuple(minors))
        return real_load(minors)

    monkeypatch.setattr(gpu_fence, "load", counted)
    monkeypatch.setattr(gpu_fence, "_LOADED", type(gpu_fence._LOADED)())
    jobs = {n: cgroups.create(scratch / f"job-{n}-1") for n in (1, 2, 3)}
    try:
        gpu_fence.attach(jobs[1], [2])
        gpu_fence.attach(jobs[2], [2])
        gpu_fence.attach(jobs[3], [0])
    finally:
        gpu_fence.forget_programs()  # the attached programs stay: the cgroups hold them
    assert loads == [(2,), (0,)]  # the second job's program was the first's
    for n, allowed in ((1, 2), (2, 2), (3, 0)):
        out = subprocess.run(
            [sys.executable, "-c", OPEN_ALL, str(nodes)],
            preexec_fn=in_cgroup(jobs[n]),
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
        seen = json.loads(out.stdout)
        assert seen[f"nvidia{allowed}"] in OPENED, (n, seen)
        denied = [seen[f"nvidia{g}"] for g in range(4) if g != allowed]
        assert denied == [errno.EPERM] * 3, (n, seen)


class FakePrograms:
    """``gpu_fence.load`` without the kernel: each program is the read end of a pipe of its
    own, so whether the fence closed it is told by its write end (a closed read end makes a
    write fail), whatever number the descriptor had or was given again."""

    def __init__(self) -> None:
        self.write_ends: list[int] = []  # by load, first to last
        self.refusals: list[gpu_fence.FenceUnavailable] = []  # each refuses the next load

    def load(self, minors: Any) -> int:
        if self.refusals:
            raise self.refusals.pop()
        read, write = os.pipe()
        self.write_ends.append(write)
        return read

    def closed(self) -> list[int]:
        """The loads (by their order, from 0) whose program the fence has closed."""
        out = []
        for i, write in enumerate(self.write_ends):
            try:
                os.write(write, b"?")
            except BrokenPipeError:
                out.append(i)
        return out


@pytest.fixture
def programs(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakePrograms]:
    fake = FakePrograms()
    monkeypatch.setattr(gpu_fence, "load", fake.load)
    monkeypatch.setattr(gpu_fence, "_LOADED", type(gpu_fence._LOADED)())
    yield fake
    gpu_fence.forget_programs()
    for write in fake.write_ends:
        os.close(write)


def test_loaded_programs_are_bounded_and_the_oldest_closed(
    programs: FakePrograms, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gpu_fence, "LOADED_MAX", 3)
    for minor in (0, 1, 2, 0, 3):  # 0 used again: 1 is the oldest when 3 comes
        gpu_fence._program_fd([minor])
    assert len(programs.write_ends) == 4
    assert sorted(gpu_fence._LOADED) == [(0, 254, 255), (2, 254, 255), (3, 254, 255)]
    assert programs.closed() == [1]  # the program of minor 1


def test_a_load_refused_for_locked_memory_gives_back_the_kept_programs(
    programs: FakePrograms,
) -> None:
    """Before Linux 5.11 every loaded program counts against RLIMIT_MEMLOCK: the programs
    kept for later jobs must not be what leaves the next job unfenced."""
    gpu_fence._program_fd([0])
    gpu_fence._program_fd([1])
    programs.refusals.append(gpu_fence.FenceUnavailable(errno.EPERM, "Operation not permitted"))
    gpu_fence._program_fd([2])  # refused once: the two kept are given back, then loaded
    assert not programs.refusals and len(programs.write_ends) == 3
    assert list(gpu_fence._LOADED) == [(2, 254, 255)]
    assert programs.closed() == [0, 1]
    # Refused with nothing kept to give back: the job's start hears it (and runs unfenced).
    gpu_fence.forget_programs()
    programs.refusals.append(gpu_fence.FenceUnavailable(errno.EPERM, "Operation not permitted"))
    with pytest.raises(gpu_fence.FenceUnavailable):
        gpu_fence._program_fd([3])


# ---- the daemon: jobs cannot leave supervision ----------------------------------

needs_root_cgroups = pytest.mark.skipif(
    PARENT is None or os.geteuid() != 0, reason="needs root and a cgroup v2 hierarchy"
)


def daemon_log(d: Daemon) -> str:
    return (d.home / "daemon.log").read_text(errors="replace")


@pytest.fixture(scope="module")
def one_gpu(module_daemons: Callable[..., Daemon]) -> Daemon:
    """The daemon (1 fake GPU, a 1 s grace) of the module's tests that neither restart it
    nor change its settings: each submits its own jobs and waits until they have ended, so
    the next finds the GPU free. A test that restarts its daemon has one of its own."""
    return module_daemons("--fake-gpus", "1", "--grace", "1s")


@needs_root_cgroups
def test_serve_says_jobs_are_tracked_by_cgroup(one_gpu: Daemon) -> None:
    d = one_gpu
    assert "jobs tracked by cgroup" in wait_for(
        lambda: log if "tracked by" in (log := daemon_log(d)) else None, what="the tracking line"
    )


@needs_root_cgroups
def test_a_job_that_escapes_and_kills_its_shim_leaves_nothing_running(one_gpu: Daemon) -> None:
    """The issue's escape: a process that left the session and the environment, then the
    shim killed by the job itself. The job ends lost, with nothing of it left, and only
    then is its GPU leased again (the next job checks that at its start)."""
    c = one_gpu.client()
    tok = token()
    script = f"env -i setsid -f sleep {tok}; sleep 0.3; kill -9 $PPID; exec sleep 1000"
    check = (
        "import os, sys\n"
        f"tok = b'{tok}'\n"
        "for p in filter(str.isdigit, os.listdir('/proc')):\n"
        "    try:\n"
        "        args = open(f'/proc/{p}/cmdline', 'rb').read().split(b'\\0')\n"
        "        state = open(f'/proc/{p}/stat', 'rb').read().rsplit(b')', 1)[1].split()[0]\n"
        "    except OSError:\n"
        "        continue\n"
        "    if tok in args and state != b'Z':\n"
        "        sys.exit(7)\n"
    )
    with killing(tok):
        job = c.submit(JobSubmit(command=["sh", "-c", script], gpus=1))
        after = c.submit(JobSubmit(command=[sys.executable, "-c", check], gpus=1))
        done = wait_done(c, job.id)
        assert done.state == "failed" and "lost" in done.reason
        assert with_token(tok) == []
        nxt = wait_done(c, after.id)
        assert (nxt.state, nxt.exit_code) == ("succeeded", 0)  # nothing was left at its start


@needs_root_cgroups
def test_a_lost_job_is_cleaned_up_by_its_cgroup_after_a_restart(
    make_daemon: Callable[..., Daemon],
) -> None:
    d = make_daemon("--fake-gpus", "1", "--grace", "1s")
    c = d.client()
    tok = token()
    job = c.submit(
        JobSubmit(command=["sh", "-c", f"env -i setsid -f sleep {tok}; exec sleep 1000"], gpus=1)
    )
    with killing(tok):
        running = wait_state(c, job.id, "running")
        wait_for(lambda: with_token(tok), what="the escaped sleep")
        assert running.job_dir is not None
        c = lose_shim_while_down(d, running)
        done = wait_done(c, job.id)
        assert done.state == "failed" and "lost" in done.reason
        assert with_token(tok) == []
        assert all(g.status == "free" for g in c.devices().items)


@needs_root_cgroups
def test_an_escaped_process_holding_the_log_cannot_keep_a_job_running(one_gpu: Daemon) -> None:
    """What the race of the job's first instant could leave: a process of the job (in its
    cgroup) in another session, without the job's environment, not a child of the shim,
    writing to the job's log. Cancelling must still end the job, and that process."""
    c = one_gpu.client()
    job = c.submit(JobSubmit(command=["sh", "-c", 'echo $$ > "$DDPQ_JOB_DIR/pids"; sleep 1000']))
    running = wait_state(c, job.id, "running")
    assert running.job_dir is not None
    (main,) = job_pids(running.job_dir)
    mount = cgroups.v2_mount()
    where = cgroups.cgroup_of(main)
    assert mount is not None and where is not None
    its_cgroup = mount[0] / where.lstrip("/")
    tok = token()
    with killing(tok), open(f"/proc/{main}/fd/1", "wb") as log_pipe:
        escaped = subprocess.Popen(
            ["sleep", tok],
            stdout=log_pipe,
            env={},
            start_new_session=True,
            preexec_fn=in_cgroup(its_cgroup),
        )
        try:
            log_pipe.close()
            c.cancel(job.id)
            done = wait_done(c, job.id, timeout=30)
            assert done.state == "cancelled"
            assert escaped.wait(10) == -signal.SIGKILL
        finally:
            escaped.kill()
            escaped.wait()


@needs_root_cgroups
def test_a_double_forked_setsid_child_ends_with_its_job(one_gpu: Daemon) -> None:
    c = one_gpu.client()
    tok = token()
    script = f'env -i setsid -f sh -c "sleep {tok} & exec sleep {tok}"; sleep 0.3; echo started'
    with killing(tok):
        job = c.submit(JobSubmit(command=["sh", "-c", script]))
        done = wait_done(c, job.id)
        assert done.state == "succeeded"
        assert with_token(tok) == []


def opened_by_job(done: Any) -> dict[str, Any]:
    assert done.state == "succeeded", done.reason
    return dict(json.loads(Path(done.job_dir, "opens.json").read_text()))


OPEN_ALL_TO_FILE = OPEN_ALL.replace(
    "print(json.dumps(result))",
    "open(os.path.join(os.environ['DDPQ_JOB_DIR'], 'opens.json'), 'w').write(json.dumps(result))",
)


@needs_fence
def test_a_job_can_open_only_its_leased_gpus(
    make_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    nodes = fake_gpu_nodes(tmp_path / "dev", 4)
    d = make_daemon("--fake-gpus", "4")
    c = d.client()
    cmd = [sys.executable, "-c", OPEN_ALL_TO_FILE, str(nodes)]
    holder = c.submit(JobSubmit(command=["sleep", "30"], gpus=1))  # takes GPU 0
    wait_state(c, holder.id, "running")
    one = wait_done(c, c.submit(JobSubmit(command=cmd, gpus=1)).id)
    none = wait_done(c, c.submit(JobSubmit(command=cmd, gpus=0)).id)
    c.cancel(holder.id)
    (leased,) = one.attempts[-1].gpus
    seen = opened_by_job(one)
    assert seen["cvd"] == str(leased)  # fake GPUs: no CUDA to renumber them
    assert seen["nvidiactl"] in OPENED
    for n in range(4):
        assert (seen[f"nvidia{n}"] in OPENED) == (n == leased), (n, seen)
        if n != leased:
            assert seen[f"nvidia{n}"] == errno.EPERM
    denied = {k: v for k, v in opened_by_job(none).items() if k.startswith("nvidia")}
    assert denied.pop("nvidiactl") in OPENED and set(denied.values()) == {errno.EPERM}
    wait_done(c, holder.id)
    assert "GPUs fenced per job" in daemon_log(d)


# ---- fallback: session tracking ---------------------------------------------------


def test_session_tracking_still_supervises_jobs(
    make_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    d = make_daemon("--fake-gpus", "2", "--grace", "1s", DDPQ_TRACKING="session")
    assert "jobs tracked by session (DDPQ_TRACKING=session); GPUs not fenced" in daemon_log(d)
    c = d.client()
    job = c.submit(JobSubmit(command=[sys.executable, str(JOBS / "stubborn.py"), "exit"]))
    done = wait_done(c, job.id)
    assert done.state == "succeeded" and done.job_dir is not None
    assert [p for p in job_pids(done.job_dir) if alive(p)] == []
    stubborn = c.submit(JobSubmit(command=[sys.executable, str(JOBS / "stubborn.py")], gpus=1))
    running = wait_state(c, stubborn.id, "running")
    assert running.job_dir is not None
    pids = job_pids(running.job_dir)
    assert cgroups.cgroup_of(pids[0]) == cgroups.cgroup_of(os.getpid())  # no job cgroup
    c.cancel(stubborn.id)
    assert wait_done(c, stubborn.id).state == "cancelled"
    assert [p for p in pids if alive(p)] == []


# ---- the shim's side of the handshake ---------------------------------------------


def test_a_shim_whose_worker_dies_before_its_word_never_starts_the_job(tmp_path: Path) -> None:
    from ddpq.executors.local.shim_command import gated, shim_argv
    from ddpq.jobdir import JobDir

    ran = tmp_path / "ran"
    gate_r, gate_w = os.pipe()
    folder = JobDir(tmp_path)
    argv = [*shim_argv(sys.executable, folder, "/", 1.0, 1 << 20, None), "touch", str(ran)]
    proc = subprocess.Popen(
        gated(argv, gate_r, None),
        pass_fds=(gate_r,),
        start_new_session=True,
        env={**os.environ, "DDPQ_ATTEMPT": "7"},
    )
    os.close(gate_r)
    os.close(gate_w)  # as if the worker died: no word
    assert proc.wait(30) == 3
    # Its record says nothing ran: a restarted worker puts the job back in the queue.
    record = folder.read_exit_record(7)
    assert not ran.exists() and record is not None and not record.launched


def test_fenced_gpus_are_renumbered_as_cuda_sees_them(monkeypatch: pytest.MonkeyPatch) -> None:
    from ddpq.executors.local import shim

    for leased, seen in [("1,3", "0,1"), ("3,1", "1,0"), ("2", "0"), ("0,1,2", "0,1,2"), ("", "")]:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", leased)
        shim.renumber_gpus()
        assert os.environ["CUDA_VISIBLE_DEVICES"] == seen


@needs_fence
def test_on_real_gpus_a_fenced_job_sees_its_gpus_numbered_from_zero(
    make_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    """NVML (a fake libnvidia-ml.so.1 with 4 GPUs), not --fake-gpus: the job is fenced, and
    CUDA_VISIBLE_DEVICES is renumbered as CUDA sees the GPUs the fence leaves it."""
    from tests.nvml.conftest import _compile

    lib = _compile(tmp_path / "nvml")
    nodes = fake_gpu_nodes(tmp_path / "dev", 4)
    d = make_daemon(LD_LIBRARY_PATH=str(lib), FAKE_NVML_GPUS="4")
    c = d.client()
    holder = c.submit(JobSubmit(command=["sleep", "30"], gpus=1))
    wait_state(c, holder.id, "running")
    job = c.submit(JobSubmit(command=[sys.executable, "-c", OPEN_ALL_TO_FILE, str(nodes)], gpus=2))
    done = wait_done(c, job.id)
    c.cancel(holder.id)
    leased = done.attempts[-1].gpus
    seen = opened_by_job(done)
    order = sorted(leased)
    assert seen["cvd"] == ",".join(str(order.index(g)) for g in leased)
    for n in range(4):
        assert (seen[f"nvidia{n}"] in OPENED) == (n in leased), (n, leased, seen)
    wait_done(c, holder.id)
