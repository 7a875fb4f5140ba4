"""A daemon whose worker dies exits non-zero and says why; it raises its open-files limit at
its start (issue 21, item 1).

The worker thread died at about a thousand running jobs, and the daemon stayed up answering
the API while nothing was scheduled, so ``Restart=on-failure`` never fired. Here a real
``ddpq serve`` and ``ddpq worker`` (in a temporary home, with fake GPUs) whose worker is made
to fail on a signal from the test: the process must end with status 1 and a log line.
"""

from __future__ import annotations

import os
import re
import resource
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ddpq.daemon import watchdog
from ddpq.daemon.watchdog import Shutdown, watched
from tests.helpers import free_port, root_flags, wait_for

# The daemon, with its worker's wait made to fail once the file $TEST_WORKER_DIES names exists.
DYING_DAEMON = """
import os, sys
from pathlib import Path
from ddpq.worker import loop

trigger = Path(os.environ["TEST_WORKER_DIES"])
real_wait = loop.Worker._wait

def wait(self):
    if trigger.exists():
        raise RuntimeError("injected by the test")
    real_wait(self)

loop.Worker._wait = wait
from ddpq.entry import main
sys.argv[0] = "ddpq"
main()
"""
SOFT_LIMIT = 1024  # systemd's default soft limit on open files


class Dying:
    def __init__(self, tmp_path: Path, command: str) -> None:
        self.home = tmp_path / "home"
        self.home.mkdir()
        self.trigger = tmp_path / "die"
        self.log_path = tmp_path / "daemon.log"
        self.port = free_port()
        args = ["--home", str(self.home), "--fake-gpus", "1"]
        if command == "serve":
            args += ["--port", str(self.port)]
        env = {**os.environ, "TEST_WORKER_DIES": str(self.trigger)}
        env.pop("DDPQ_URL", None)
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        self.hard = hard
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", DYING_DAEMON, command, *args, *root_flags(args)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                # Started as systemd starts a service: a soft limit of 1024.
                preexec_fn=lambda: resource.setrlimit(
                    resource.RLIMIT_NOFILE, (min(SOFT_LIMIT, hard), hard)
                ),
            )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


@pytest.fixture
def dying(tmp_path: Path) -> Iterator[list[Dying]]:
    started: list[Dying] = []
    yield started
    for d in started:
        d.stop()


def open_files_limit(pid: int) -> int:
    limits = Path(f"/proc/{pid}/limits").read_text()
    found = re.search(r"^Max open files\s+(\d+)", limits, re.MULTILINE)
    assert found, limits
    return int(found.group(1))


@pytest.mark.parametrize("command", ["serve", "worker"])
def test_a_worker_that_dies_takes_the_daemon_down_with_status_1(
    tmp_path: Path, dying: list[Dying], command: str
) -> None:
    d = Dying(tmp_path, command)
    dying.append(d)
    wait_for(
        lambda: d.proc.poll() is not None or "worker: 1 GPU(s) (fake)" in d.log(),
        60,
        "the worker to start",
    )
    if command == "serve":

        def healthy() -> bool:
            assert d.proc.poll() is None, d.log()
            try:
                return httpx.get(f"http://127.0.0.1:{d.port}/healthz", timeout=1).is_success
            except httpx.TransportError:
                return False

        wait_for(healthy, 60, "the API to answer")
    assert d.proc.poll() is None, d.log()
    # Raised at its start from the soft limit it was given, and said so.
    if d.hard > SOFT_LIMIT:
        assert open_files_limit(d.proc.pid) > SOFT_LIMIT
        assert f"the soft limit was {SOFT_LIMIT}" in d.log()
    d.trigger.touch()
    try:
        status = d.proc.wait(60)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the daemon outlived its worker:\n{d.log()}") from None
    log = d.log()
    assert status == 1, log
    assert "CRITICAL ddpq: the worker died (RuntimeError: injected by the test)" in log
    assert "stopping the daemon (exit status 1)" in log
    assert "Traceback" in log  # where it died
    # The command's own last line says it too (the journal's last word).
    assert log.rstrip().splitlines()[-1].startswith("ddpq: the worker died (RuntimeError")


# ---- the pieces, in-process ------------------------------------------------------------------


class FakeServer:
    should_exit = False
    force_exit = False


def test_a_worker_that_returns_unasked_is_a_death_too() -> None:
    shutdown = Shutdown()
    watched("worker", lambda: None, shutdown)()
    assert shutdown.died == "the worker stopped without being asked to"
    assert shutdown.event.is_set()
    asked = Shutdown()
    asked.stopping = True  # the daemon's own stop: the worker's end is no death
    watched("worker", lambda: None, asked)()
    assert asked.died is None


def test_a_death_before_the_api_serves_stops_it_as_soon_as_it_does() -> None:
    """The worker starts before the API: a death in between must not be missed."""
    shutdown = Shutdown()

    def boom() -> None:
        raise KeyboardInterrupt  # not an Exception: caught all the same

    watched("worker", boom, shutdown)()
    server = FakeServer()
    shutdown.attach(server)
    assert server.should_exit and server.force_exit  # force: not after every logs -f ends
    assert shutdown.died is not None and "KeyboardInterrupt" in shutdown.died


class FakeLimits:
    RLIMIT_NOFILE = resource.RLIMIT_NOFILE
    RLIM_INFINITY = resource.RLIM_INFINITY

    def __init__(self, soft: int, hard: int, refuse: bool = False) -> None:
        self.limits = (soft, hard)
        self.refuse = refuse

    def getrlimit(self, _which: int) -> tuple[int, int]:
        return self.limits

    def setrlimit(self, _which: int, limits: tuple[int, int]) -> None:
        if self.refuse:
            raise ValueError("not allowed")
        self.limits = limits


@pytest.mark.parametrize(
    ("soft", "hard", "refuse", "now"),
    [
        (1024, 524288, False, 524288),  # systemd's defaults: raised to the hard limit
        (1024, resource.RLIM_INFINITY, False, 777777),  # unlimited: the kernel's nr_open
        (1024, 4096, True, 1024),  # refused: said, and the daemon runs on
        (4096, 4096, False, 4096),  # nothing to raise
    ],
)
def test_the_open_files_limit_is_raised_to_what_the_kernel_allows(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    soft: int,
    hard: int,
    refuse: bool,
    now: int,
) -> None:
    limits = FakeLimits(soft, hard, refuse)
    monkeypatch.setattr(watchdog, "resource", limits)
    nr_open = tmp_path / "nr_open"
    nr_open.write_text("777777\n")
    monkeypatch.setattr(watchdog, "NR_OPEN", str(nr_open))
    with caplog.at_level("INFO", logger="ddpq"):
        assert watchdog.raise_open_files_limit() == now
    assert limits.limits[0] == now
    assert f"open files: at most {now}" in caplog.text
    if refuse:
        assert "cannot raise it" in caplog.text


@pytest.mark.parametrize("which", ["notifier", "janitor"])
def test_the_notifier_and_the_janitor_are_watched_as_the_worker_is(
    which: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Dead alone, one would leave every message unsent, the other every folder kept:
    their death stops the daemon too (with the thread's name in the reason)."""
    from ddpq.config import Settings
    from ddpq.daemon import janitor, notifier, run

    def boom(_self: object) -> None:
        raise RuntimeError("broken")

    monkeypatch.setattr(notifier.Notifier, "run", boom)
    monkeypatch.setattr(janitor.Janitor, "run", boom)
    settings = Settings(home=tmp_path, keep_finished_s=3600.0)
    shutdown = Shutdown()
    if which == "notifier":
        run._start_notifier(settings, shutdown)
    else:
        run._start_janitor(settings, shutdown)
    assert wait_for(lambda: shutdown.died is not None, timeout=10)
    assert shutdown.died == f"the {which} died (RuntimeError: broken)"
