"""The worker's wait has no descriptor ceiling (issue 21, item 1).

The local executor gives the worker one pidfd per running job. ``select`` cannot watch a
descriptor numbered 1024 or more: at about a thousand running jobs the worker's wait
raised ValueError, its thread died, and nothing was scheduled again. Here the wait and a
real worker thread watch more than 1024 descriptors, numbered past 1023.
"""

from __future__ import annotations

import os
import resource
import threading
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

from ddpq import wake
from ddpq.config import Settings
from ddpq.core.spec import JobSpec
from ddpq.executors.fake import FakeExecutor, FakeHost
from ddpq.jobdir import JobDir
from ddpq.store import jobs as job_store
from ddpq.store.db import Database
from ddpq.worker import loop
from ddpq.worker.loop import Worker
from tests.helpers import wait_for
from tests.template_db import migrated

PIPES = 1100  # 2,200 descriptors: both more than 1024 and numbered past 1023


@pytest.fixture
def pipes() -> Iterator[list[tuple[int, int]]]:
    """``PIPES`` pipes (read end, write end), with room made for them under the soft limit."""
    limits = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = len(os.listdir("/proc/self/fd")) + 2 * PIPES + 64
    if limits[0] != resource.RLIM_INFINITY and limits[0] < wanted:
        if limits[1] != resource.RLIM_INFINITY and limits[1] < wanted:
            pytest.skip(f"the hard limit on open files ({limits[1]}) is below {wanted}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, limits[1]))
    made = [os.pipe() for _ in range(PIPES)]
    try:
        assert max(r for r, _ in made) > 1023
        yield made
    finally:
        for r, w in made:
            os.close(r)
            os.close(w)
        resource.setrlimit(resource.RLIMIT_NOFILE, limits)


def test_the_wait_wakes_for_any_of_more_than_1024_descriptors(
    pipes: list[tuple[int, int]],
) -> None:
    readable = [r for r, _ in pipes]
    assert wake.wait_readable(readable, 0.01) == set()
    high = next(i for i, (r, _) in enumerate(pipes) if r > 1023)
    for index in (0, high, len(pipes) - 1):  # the first, the first past 1023, the last
        r, w = pipes[index]
        os.write(w, b"x")
        started = time.monotonic()
        assert wake.wait_readable(readable, 60.0) == {r}
        assert time.monotonic() - started < 30.0  # woken, not timed out
        os.read(r, 1)


class ManyFdsExecutor(FakeExecutor):
    """The fake executor, with the descriptors of a thousand running jobs to wait on."""

    def __init__(self, host: FakeHost, fds: list[int]) -> None:
        super().__init__(host)
        self.fds = fds

    def wait_fds(self) -> list[int]:
        return list(self.fds)


def test_a_worker_waiting_on_more_than_1024_descriptors_keeps_scheduling(
    tmp_path: Path, pipes: list[tuple[int, int]]
) -> None:
    settings = Settings(home=tmp_path / "home", fake_gpus=2, port_range=(29600, 29609))
    migrated(settings.db_path)
    host = FakeHost()
    worker = Worker(settings, ManyFdsExecutor(host, [r for r, _ in pipes]), listen=True)
    worker.scheduler.ports.port_free = lambda port: True  # no real sockets
    died: list[BaseException] = []

    def run() -> None:
        try:
            worker.run()
        except BaseException as exc:
            died.append(exc)
            raise

    def started_or_died(job_id: int) -> bool:
        return bool(died) or job_id in host.running()

    thread = threading.Thread(target=run, name="test-worker", daemon=True)
    thread.start()
    api = Database(settings.db_path)
    try:
        for n in range(3):  # each after the worker has waited at least once more
            with api.write() as s:
                new = JobSpec(name=f"j{n}", owner="alice", command=["true"], cwd="/", gpus=1)
                job_id = job_store.create_job(s, new, time.time()).id
            wake.nudge(settings.wake_socket)
            wait_for(partial(started_or_died, job_id), 30, f"job {job_id} to be started")
            assert not died, f"the worker died: {died[0]!r}"
            host.finish(job_id)
    finally:
        worker.stop()
        thread.join(30)
        api.dispose()
    assert not thread.is_alive() and not died


class RecordedStop(threading.Event):
    """The worker's stop event, noting each wait asked of it and returning at once."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: list[float] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(-1.0 if timeout is None else timeout)
        return self.is_set()


@pytest.fixture
def gapped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Worker, RecordedStop]]:
    """A listening worker whose gap waits are noted, not slept; the gap a minute long, so
    that no slowness of the machine between two lines of a test can end it."""
    monkeypatch.setattr(loop, "PASS_GAP_S", 60.0)
    settings = Settings(home=tmp_path / "home", fake_gpus=1, port_range=(29600, 29609))
    migrated(settings.db_path)
    worker = Worker(settings, FakeExecutor(FakeHost()), listen=True)
    stop = RecordedStop()
    worker._stop = stop
    try:
        yield worker, stop
    finally:
        worker.close()


def test_a_wake_soon_after_a_pass_waits_out_the_gap_and_takes_what_came_meanwhile(
    gapped: tuple[Worker, RecordedStop],
) -> None:
    worker, stop = gapped
    sock = worker._sock
    assert sock is not None
    worker._running[1] = JobDir(worker.settings.jobs_dir / "1")  # a job runs
    worker._passed_at = time.monotonic()  # a pass has just ended
    wake.nudge(worker.settings.wake_socket)
    wake.nudge(worker.settings.wake_socket)  # the next submission, within the gap
    worker._wait()
    assert len(stop.waits) == 1 and 0 < stop.waits[0] <= loop.PASS_GAP_S
    # Both wakes were drained: the pass after the gap is the one that answers them both.
    assert wake.wait_readable([sock.fileno()], 0.0) == set()


@pytest.mark.parametrize("case", ["quiet", "window", "idle"])
def test_a_wake_after_a_quiet_spell_a_full_window_or_on_an_idle_host_is_answered_at_once(
    gapped: tuple[Worker, RecordedStop], case: str
) -> None:
    worker, stop = gapped
    worker._passed_at = time.monotonic()  # a pass has just ended
    if case != "idle":  # idle: no job runs, so there is no end to gather
        worker._running[1] = JobDir(worker.settings.jobs_dir / "1")
    if case == "quiet":
        worker._passed_at -= 10 * loop.PASS_GAP_S
    elif case == "window":  # the last pass started a whole planning window
        worker._pass_again = True
    wake.nudge(worker.settings.wake_socket)
    worker._wait()
    assert stop.waits == []
