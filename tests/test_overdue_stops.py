"""The local executor ends by force an attempt whose shim has not ended it after a stop.

The shim runs as the job's account, so the job may stop it (SIGSTOP) or hang it; only the
shim turns a stop into a kill. Past the stop's grace (and a preemption's time to
checkpoint) by ``KILL_SLACK_S``, the executor SIGKILLs the shim: through its pidfd, or by
its pid where the kernel gave none. The end is then gathered as any shim's that left no
record, nothing of the job outlives it, and it says why. (tests/test_supervision.py runs
the same through a daemon, with the real slack.)
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from ddpq.config import Settings
from ddpq.executors.base import Ended
from ddpq.executors.local import cgroups, procs
from ddpq.executors.local import executor as local_executor
from ddpq.executors.local.executor import OVERDUE, LocalExecutor
from tests.helpers import wait_for
from tests.launches import a_launch

# Its pid first (it stays when bash becomes sleep), then its parent, the shim, stopped.
FREEZE = 'echo $$ > "$DDPQ_JOB_DIR/pids"; kill -STOP "$PPID"; exec sleep 300'


@pytest.fixture(params=["pidfd", "no pidfd"])
def executor(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[LocalExecutor]:
    monkeypatch.setattr(local_executor, "KILL_SLACK_S", 0.2)
    if request.param == "no pidfd":  # an old kernel, as procs.pidfd meets it
        monkeypatch.setattr(procs, "pidfd", lambda pid: None)
    settings = Settings(home=tmp_path / "home", grace_s=0.3, preempt_grace_s=0.3)
    settings.home.mkdir()
    made = LocalExecutor(settings, gpu_count=0)
    yield made
    left = [w.ident.pid for w in made._watched.values()]  # a failed test's: killed
    procs.kill_all(left)
    made.close()
    tree = made.tracking.tree
    cgroups_left = list(tree.glob("job-*")) if tree is not None else []
    for cgroup in cgroups_left:
        cgroups.destroy(cgroup, timeout=10)
    if tree is not None:
        cgroups.remove(tree)
    assert left == [] and cgroups_left == [], (left, cgroups_left)


def alive(pid: int) -> bool:
    seen = procs.stat(pid)
    return seen is not None and seen.state != "Z"


@pytest.mark.parametrize("preempt", [False, True])
def test_a_stop_its_stopped_shim_cannot_act_on_ends_the_job_all_the_same(
    executor: LocalExecutor, tmp_path: Path, preempt: bool
) -> None:
    folder = tmp_path / "jobs" / "1"
    folder.parent.mkdir()
    kw = {"preempt_signal": "USR1"} if preempt else {}
    launch = a_launch(folder, command=["bash", "-c", FREEZE], **kw)
    executor.start(launch)
    executor.proceed([1])
    pid_file = folder / "pids"

    def written() -> str | None:
        return pid_file.read_text().strip() or None if pid_file.exists() else None

    job_pid = int(wait_for(written, 30, "the job's pid"))
    shim = executor._watched[1].ident.pid

    def stopped() -> bool:
        seen = procs.stat(shim)
        return seen is not None and seen.state == "T"

    wait_for(stopped, 30, "the shim stopped by its job")
    assert executor.stop(1, preempt=preempt)
    found: list[Ended] = []

    def ended() -> bool:
        found.extend(executor.ended())
        return bool(found)

    wait_for(ended, 30, "the attempt to end")
    assert [(e.job_id, e.record.error) for e in found] == [(1, OVERDUE)]
    assert not alive(job_pid) and not alive(shim)
    assert os.path.exists(folder / "output.log")
