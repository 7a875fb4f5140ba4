"""Shared test helpers: a real daemon in a subprocess, and waiting on conditions."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import httpx
import httpx2

from ddpq.client.api import DdpqClient
from ddpq.executors.local import procs
from ddpq.executors.local.procs import stat as proc_stat
from ddpq.schemas import JobDetail
from tests.shared_install import shared_install
from tests.template_db import migrated
from tests.zygote import DAEMON, Forked, Zygote

# What a test reads of an answer, from a live daemon (httpx) or from the in-process app
# (httpx2: Starlette's TestClient, tests/inprocess.py).
Answer = httpx.Response | httpx2.Response

T = TypeVar("T")
# This pytest process's daemons, forked with their imports done (``tests/zygote.py``).
ZYGOTE = Zygote(DAEMON, start_env=dict(os.environ))
# Those that run jobs as other accounts, on the shared install's interpreter: one zygote of
# its own each (``shared_zygote``), closed with ZYGOTE.
SHARED_ZYGOTES: dict[str, Zygote] = {}


def shared_zygote(python: str, env: dict[str, str]) -> Zygote:
    """The zygote for daemons on the interpreter ``python`` (the shared install's), started
    with the first such daemon's environment."""
    if python not in SHARED_ZYGOTES:
        SHARED_ZYGOTES[python] = Zygote(DAEMON, start_env=dict(env), python=python)
    return SHARED_ZYGOTES[python]


TERMINAL = {"succeeded", "failed", "cancelled", "timed_out"}


# How often ``wait_for`` looks: at once, then less and less often, to every LONGEST_PAUSE_S.
# Most checks ask a daemon (a job's state), and each answer costs it milliseconds of CPU: a
# look every 20 ms kept a daemon about half busy for as long as a test waited, on a machine
# whose cores every test shares. A short wait is seen as soon as before.
FIRST_PAUSE_S, LONGEST_PAUSE_S = 0.02, 0.1


def wait_for(check: Callable[[], T | None], timeout: float = 30.0, what: str = "condition") -> T:
    """Poll ``check`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    pause = FIRST_PAUSE_S
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(pause)
        pause = min(pause * 1.5, LONGEST_PAUSE_S)


def root_flags(args: list[str]) -> list[str]:
    """CI runs as root: a daemon without --auth then needs --allow-root to start."""
    return ["--allow-root"] if os.geteuid() == 0 and "--auth" not in args else []


def runs_jobs_as_others(args: list[str]) -> bool:
    """A root daemon with --auth runs jobs as their owners' accounts, so it starts only from
    an install they can reach (``tests/shared_install.py``), not from the checkout."""
    return os.geteuid() == 0 and "--auth" in args


def reserve_flags(args: list[str]) -> list[str]:
    """A small database reserve (the default is 64M of allocated blocks): a test run starts
    hundreds of daemons, and pytest keeps their folders."""
    return [] if any(a.startswith("--state-reserve") for a in args) else ["--state-reserve", "1M"]


def cpu_flags(args: list[str], env: dict[str, str]) -> list[str]:
    """A test daemon leases CPU-only jobs one core each out of 64, as on a lab box, and GPU
    jobs none (they share the cores, as before cores were leased), unless the test sets
    either: on this 2-core machine the default (the host's 2 cores) would run two of a
    test's CPU jobs at once. tests/test_cores.py and tests/core/test_host_cores.py hold
    the defaults."""
    chose = any(a.startswith(("--cpu-capacity", "--cpus-per-gpu", "--config")) for a in args)
    if chose or "DDPQ_CPU_CAPACITY" in env or "DDPQ_CPUS_PER_GPU" in env:
        return []
    return ["--cpu-capacity", "64", "--cpus-per-gpu", "0"]


def port_range_flags(args: list[str], env: dict[str, str]) -> list[str]:
    """Under pytest-xdist, the daemons of one worker lease rendezvous ports from a range of
    that worker's own (30000 + 100 per worker, below the ephemeral ports), unless the test
    picks a range itself (a flag, DDPQ_PORT_RANGE or a --config file). Two workers' daemons
    on the default range leased the same port, both test-binds passed, and the second
    torchrun failed EADDRINUSE: a requeue on another port the test did not expect."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    chose = any(a.startswith(("--port-range", "--config")) for a in args)
    if not worker.startswith("gw") or chose or "DDPQ_PORT_RANGE" in env:
        return []
    lo = 30000 + 100 * (int(worker[2:]) % 27)
    return ["--port-range", f"{lo}-{lo + 99}"]


# Each pytest worker's own block of ports for daemons' HTTP and torchrun's rendezvous, below
# the kernel's ephemeral ports and apart from the workers' lease ranges (30000 and up).
PORT_BLOCK, PORT_BLOCKS_AT = 250, 20000
_ports_walked = itertools.count()


def free_port() -> int:
    """A port free here now, from this pytest worker's own block below the ephemeral range.

    Not bind(0): the kernel hands a port it gave and took back to the next bind(0) anywhere,
    and gloo's ranks bind theirs so. In CI another worker's rank bound the port a test had
    just chosen for torchrun's store before torchrun did, and torchrun exited 1 at its start.
    Below the ephemeral range only an explicit bind takes a port; a worker runs its tests
    one at a time and walks its own block, so its ports are not another worker's."""
    from ddpq.worker.ports import port_is_free

    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    index = int(worker[2:]) if worker.startswith("gw") else 0
    lo = PORT_BLOCKS_AT + PORT_BLOCK * (index % 36)  # the last block ends at 28999
    for _ in range(PORT_BLOCK):
        port = lo + next(_ports_walked) % PORT_BLOCK
        if port_is_free(port):
            return port
    raise AssertionError(f"no free port in {lo}-{lo + PORT_BLOCK - 1}")


def free_block(size: int) -> int:
    """The first of ``size`` consecutive ports (in a rendezvous range) free here now."""
    from ddpq.worker.ports import port_is_free

    for lo in range(29700, 29990, size):
        if all(port_is_free(p) for p in range(lo, lo + size)):
            return lo
    raise AssertionError("no block of free ports")


@dataclass
class Daemon:
    """`ddpq serve` in its own session, on a temporary state folder."""

    home: Path
    port: int
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | Forked | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> Daemon:
        env = {**os.environ, **self.env}
        env.pop("DDPQ_URL", None)
        python = sys.executable
        if runs_jobs_as_others(self.args):
            shared = shared_install()  # skips the test where there can be none
            python, env = shared.python, shared.env(env)
        if not (self.home / "ddpq.db").exists():
            # A fresh state folder: the session's migrated template, not a migration per
            # daemon (the daemon still runs `migrate`, which finds the newest schema).
            migrated(self.home / "ddpq.db")
        self.log = open(self.home / "daemon.log", "ab")  # noqa: SIM115 - closed in stop()
        argv = [
            "serve",
            "--home",
            str(self.home),
            "--port",
            str(self.port),
            *self.args,
            *root_flags(self.args),
            *reserve_flags(self.args),
            *port_range_flags(self.args, env),
            *cpu_flags(self.args, env),
        ]
        zygote = ZYGOTE if python == sys.executable else shared_zygote(python, env)
        if zygote.accepts(env):
            self.proc = zygote.spawn("ddpq", argv, env, self.log.fileno())
        else:
            self.proc = subprocess.Popen(
                [python, "-X", "faulthandler", "-m", "ddpq", *argv],
                stdout=self.log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )

        # One client for the whole wait: a client made per poll (httpx.get) loads the CA
        # bundle each time, ~40 ms of CPU every 20 ms, taken from the daemon that starts.
        with httpx.Client(timeout=1) as http:

            def healthy() -> bool:
                assert self.proc is not None
                if self.proc.poll() is not None:
                    raise AssertionError(f"daemon exited: {(self.home / 'daemon.log').read_text()}")
                try:
                    return http.get(self.url + "/healthz").status_code == 200
                except httpx.TransportError:
                    return False

            wait_for(healthy, timeout, "the daemon to answer /healthz")
        return self

    def client(self, token: str | None = None) -> DdpqClient:
        return DdpqClient(self.url, token)

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def kill_session(self) -> None:
        """SIGKILL to the daemon, its worker half and its fork server (its process group:
        it was started leading a session of its own); the jobs' shims lead their own."""
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self.log.close()

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        if self.proc is None:
            return 0
        ended = self.proc.poll()
        if ended is not None:
            return ended
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            why = f"the daemon did not stop within {timeout:g}s; its log ends:\n"
            raise AssertionError(why + self.stacks()) from None
        finally:
            self.log.close()

    def stacks(self) -> str:
        """Where each of the daemon's processes is stuck (its threads' stacks, which the
        fault handler writes into the log on SIGABRT), then the session killed."""
        assert self.proc is not None
        log = self.home / "daemon.log"
        start = log.stat().st_size
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGABRT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        self.kill_session()
        with open(log, "rb") as f:
            f.seek(max(0, start - 4000))  # what it said last, then the stacks
            return f.read().decode(errors="replace")

    def cli(self, *args: str, check: bool = True, **kw: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "DDPQ_URL": self.url, **kw}
        r = subprocess.run(
            [sys.executable, "-m", "ddpq", *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        if check and r.returncode != 0:
            raise AssertionError(f"ddpq {' '.join(args)} -> {r.returncode}: {r.stderr}")
        return r


def wait_done(client: DdpqClient, job_id: int, timeout: float = 60.0) -> JobDetail:
    return wait_for(
        lambda: j if (j := client.show(job_id)).state in TERMINAL else None,
        timeout,
        f"job {job_id} to finish",
    )


def what_it_said(client: DdpqClient, job_id: int, tag: str = "SAW=") -> dict[str, object]:
    """The JSON object a job printed after ``tag`` on a line of its log, once it has
    succeeded (within 120 s); the log in the failure's message if it did not."""
    done = wait_done(client, job_id, timeout=120)
    log = client.log_tail(job_id, 1 << 20).decode()
    assert done.state == "succeeded", (done.reason, log)
    line = next(ln for ln in log.splitlines() if ln.startswith(tag))
    said: dict[str, object] = json.loads(line.removeprefix(tag))
    return said


def wait_state(client: DdpqClient, job_id: int, state: str, timeout: float = 30.0) -> JobDetail:
    return wait_for(
        lambda: j if (j := client.show(job_id)).state == state else None,
        timeout,
        f"job {job_id} to be {state}",
    )


def shim_of(job: JobDetail) -> procs.Identity:
    """The shim of the job's latest attempt, from the handle the local executor gave it."""
    handle = job.attempts[-1].handle if job.attempts else None
    assert handle is not None and job.attempts[-1].executor == "local", job.attempts
    pid, _, ticks = handle.partition(":")
    return procs.Identity(int(pid), int(ticks))


# A job that stops its own shim (its parent: the shim runs as the job's account, so it
# may), its pid first in its folder's "pids" (it stays when bash becomes sleep).
FREEZES_ITS_SHIM = 'echo $$ > "$DDPQ_JOB_DIR/pids"; kill -STOP "$PPID"; exec sleep 300'


def alive(pid: int) -> bool:
    """Running, or stopped: neither gone nor a zombie. As the kernel says, whatever a test
    makes the code under test see of ``procs.stat``."""
    seen = proc_stat(pid)
    return seen is not None and seen.state != "Z"


def stopped(pid: int) -> bool:
    seen = proc_stat(pid)
    return seen is not None and seen.state == "T"


def lose_shim_while_down(d: Daemon, job: JobDetail) -> DdpqClient:
    """kill -9 the daemon, then the job's shim (so no exit record is ever written),
    restart the daemon and return a client of it: the job must come back as `lost`."""
    d.kill9()
    shim = shim_of(job)
    assert procs.is_alive(shim)
    os.kill(shim.pid, signal.SIGKILL)
    d.start()
    return d.client()


_REACHABLE: list[Path] = []


def reachable_folder(prefix: str) -> Path:
    """A fresh folder other accounts can reach (pytest's ``tmp_path`` is under a 0700
    folder), removed when the session ends (``remove_reachable_folders``)."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    folder.chmod(0o755)
    _REACHABLE.append(folder)
    return folder


def remove_reachable_folders() -> None:
    while _REACHABLE:
        shutil.rmtree(_REACHABLE.pop(), ignore_errors=True)
