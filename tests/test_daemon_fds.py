"""A real daemon whose jobs' pidfds are numbered past 1023 keeps scheduling (issue 21,
item 1).

At about a thousand running jobs the worker's ``select`` met a pidfd numbered 1024, raised
ValueError and its thread died. Running a thousand jobs here would take minutes; the daemon
is instead started holding 1,100 pipes first (``sitecustomize`` below, before ``ddpq``
runs), so that the pidfd of its very first job is numbered past 1023, as the thousandth
job's was. The jobs are real: the local executor, the fork server, a shim each.
"""

from __future__ import annotations

import os
import resource
from collections.abc import Callable
from pathlib import Path

import pytest

from ddpq.schemas import JobSubmit
from tests.helpers import Daemon, wait_done

PADDING = 1100  # pipes: 2,200 descriptors held before the first job starts

SITECUSTOMIZE = """
import os

# Descriptors held for the daemon's life, as many jobs' would be (tests/test_daemon_fds.py).
HELD = [os.pipe() for _ in range(int(os.environ.get("TEST_HOLD_PIPES", "0")))]
"""


def test_jobs_whose_pidfds_pass_1023_are_started_and_recorded(
    make_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < 2 * PADDING + 1024:
        pytest.skip(f"the hard limit on open files ({hard}) leaves no room for the padding")
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p)
    d = make_daemon("--fake-gpus", "1", PYTHONPATH=path, TEST_HOLD_PIPES=str(PADDING))
    assert d.proc is not None
    held = [int(fd) for fd in os.listdir(f"/proc/{d.proc.pid}/fd")]
    assert max(held) > 1023  # anything the daemon opens now is numbered past it
    client = d.client()
    for n in range(3):  # one at a time: each is found ended through its pidfd
        job = client.submit(JobSubmit(command=["sh", "-c", f"exit {n}"]))
        done = wait_done(client, job.id, timeout=60)
        assert (done.state, done.exit_code) == (("succeeded", 0) if n == 0 else ("failed", n))
    assert d.proc.poll() is None
    assert "the worker died" not in (d.home / "daemon.log").read_text()
