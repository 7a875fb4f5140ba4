"""The local executor ends by force an attempt whose shim has not ended it after a stop.

The shim runs as the job's account, so the job may stop it (SIGSTOP) or hang it; only the
shim turns a stop into a kill. Past the stop's grace (and a preemption's time to
checkpoint) by ``KILL_SLACK_S``, the executor SIGKILLs the shim: through its pidfd, or by
its pid where the kernel gave none. The end is then gathered as any shim's that left no
record, nothing of the job outlives it, and it says why. (tests/test_supervision.py runs
the same through a daemon, with the real slack.)
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from ddpq.config import Settings
from ddpq.executors.base import Ended
from ddpq.executors.local import executor as local_executor
from ddpq.executors.local import procs, shim_procs
from ddpq.executors.local.executor import OVERDUE, LocalExecutor
from tests.helpers import FREEZES_ITS_SHIM, alive, stopped, wait_for
from tests.launches import a_launch, leaving_nothing


@pytest.fixture(params=["pidfd", "no pidfd"])
def executor(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[LocalExecutor]:
    monkeypatch.setattr(local_executor, "KILL_SLACK_S", 0.2)
    if request.param == "no pidfd":  # an old kernel, as procs.pidfd meets it
        monkeypatch.setattr(procs, "pidfd", lambda pid: None)
    settings = Settings(home=tmp_path / "home", grace_s=0.3, preempt_grace_s=0.3)
    settings.home.mkdir()
    with leaving_nothing(settings) as made:
        yield made


def start_freezing(executor: LocalExecutor, tmp_path: Path, **kw: str) -> tuple[int, int]:
    """Start the job that stops its shim; its pid and its shim's, once the shim is stopped."""
    folder = tmp_path / "jobs" / "1"
    folder.parent.mkdir()
    executor.start(a_launch(folder, command=["bash", "-c", FREEZES_ITS_SHIM], **kw))
    executor.proceed([1])
    pid_file = folder / "pids"

    def written() -> str | None:
        return pid_file.read_text().strip() or None if pid_file.exists() else None

    job_pid = int(wait_for(written, 30, "the job's pid"))
    shim = executor._watched[1].ident.pid
    wait_for(lambda: stopped(shim), 30, "the shim stopped by its job")
    return job_pid, shim


def gathered(executor: LocalExecutor) -> list[Ended]:
    found: list[Ended] = []

    def ended() -> bool:
        found.extend(executor.ended())
        return bool(found)

    wait_for(ended, 30, "the attempt to end")
    return found


@pytest.mark.parametrize("preempt", [False, True])
def test_a_stop_its_stopped_shim_cannot_act_on_ends_the_job_all_the_same(
    executor: LocalExecutor, tmp_path: Path, preempt: bool
) -> None:
    job_pid, shim = start_freezing(
        executor, tmp_path, **({"preempt_signal": "USR1"} if preempt else {})
    )
    assert executor.stop(1, preempt=preempt)
    found = gathered(executor)
    assert [(e.job_id, e.record.error) for e in found] == [(1, OVERDUE)]
    assert not alive(job_pid) and not alive(shim)


def test_a_shim_at_work_at_the_deadline_is_given_its_own_time_then_killed(
    executor: LocalExecutor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A shim that is not stopped may be waiting for the job's last processes to go (a
    # GPU's teardown): killed only once the time it allows itself for that is past.
    monkeypatch.setattr(shim_procs, "KILL_WAIT_S", 0.5)
    job_pid, shim = start_freezing(executor, tmp_path)
    real_stat = procs.stat

    def seen_at_work(pid: int) -> procs.ProcStat | None:
        seen = real_stat(pid)
        return replace(seen, state="S") if seen is not None and pid == shim else seen

    monkeypatch.setattr(procs, "stat", seen_at_work)  # as the executor sees it
    assert executor.stop(1)
    watched = executor._watched[1]

    def given_time() -> bool:
        assert executor.ended() == []
        return watched.patient

    wait_for(given_time, 30, "the first deadline")
    assert alive(shim) and alive(job_pid)  # not killed at the first deadline
    given = watched.kill_at
    assert executor.stop(1) and watched.kill_at == given  # a later stop takes none of it
    found = gathered(executor)
    assert [(e.job_id, e.record.error) for e in found] == [(1, OVERDUE)]
    assert not alive(job_pid) and not alive(shim)
