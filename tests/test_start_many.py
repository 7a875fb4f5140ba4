"""A pass's starts together (``LocalExecutor.start_many``): every request goes to the fork
server before any answer is read, and each job still gets its own shim, its own failure,
and nothing of a failed one left behind."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from ddpq.config import Settings
from ddpq.executors.base import Ended, Launch, LaunchFailed
from ddpq.executors.local import cgroups, procs
from ddpq.executors.local.executor import LocalExecutor
from ddpq.executors.local.forkclient import ForkServer, ForkServerLost, Ticket
from ddpq.jobdir import JobDir, make_folder
from tests.helpers import wait_for
from tests.launches import a_launch, leaving_nothing


@pytest.fixture
def executor(tmp_path: Path) -> Iterator[LocalExecutor]:
    settings = Settings(home=tmp_path / "home", grace_s=0.3)
    settings.home.mkdir()
    with leaving_nothing(settings) as made:
        yield made


def all_ended(executor: LocalExecutor, count: int) -> dict[int, Ended]:
    found: dict[int, Ended] = {}

    def ended() -> bool:
        found.update((e.job_id, e) for e in executor.ended())
        return len(found) == count

    wait_for(ended, 30, f"{count} attempts to end")
    return found


def three_launches(tmp_path: Path, second: Path | None = None) -> list[Launch]:
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    folders = [jobs / "1", second or jobs / "2", jobs / "3"]
    return [
        a_launch(folder, job_id=n, command=["sh", "-c", f"echo job {n}"])
        for n, folder in enumerate(folders, 1)
    ]


def its_own_shim(executor: LocalExecutor, tmp_path: Path, n: int) -> None:
    """Job ``n``'s handle is the shim of its folder, not of another job of the pass (a
    forked shim shows its folder once it has retitled itself, just after the fork)."""
    pid = executor._watched[n].ident.pid
    folder = str(tmp_path / "jobs" / str(n))
    wait_for(lambda: procs.find_shim(folder) == pid, 30, f"job {n}'s shim")


def test_each_job_of_a_pass_runs_in_its_own_shim(executor: LocalExecutor, tmp_path: Path) -> None:
    launches = three_launches(tmp_path)
    handles = executor.start_many(launches)
    assert all(isinstance(h, str) for h in handles), handles
    for n in (1, 2, 3):
        its_own_shim(executor, tmp_path, n)
    executor.proceed([1, 2, 3])
    ended = all_ended(executor, 3)
    assert {n: e.record.exit_code for n, e in ended.items()} == {1: 0, 2: 0, 3: 0}
    for n in (1, 2, 3):
        assert f"job {n}\n" in (tmp_path / "jobs" / str(n) / "output.log").read_text()


def test_a_job_that_cannot_start_fails_alone(executor: LocalExecutor, tmp_path: Path) -> None:
    # Its folder cannot be made (a file where its parent should be): the others start.
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    handles = executor.start_many(three_launches(tmp_path, blocker / "2"))
    assert isinstance(handles[1], LaunchFailed) and "cannot start the job" in str(handles[1])
    assert isinstance(handles[0], str) and isinstance(handles[2], str)
    assert 2 not in executor._watched
    executor.proceed([1, 3])
    ended = all_ended(executor, 2)
    assert {n: e.record.exit_code for n, e in ended.items()} == {1: 0, 3: 0}


@pytest.mark.parametrize(
    ("fault", "put_off"),
    [(errno.ENOSPC, True), (errno.EDQUOT, False), (errno.EIO, False), (errno.EACCES, False)],
    ids=["disk-full", "quota-full", "io-error", "denied"],
)
def test_a_job_whose_folder_finds_no_room_is_put_off_and_other_faults_fail_it(
    executor: LocalExecutor,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    fault: int,
    put_off: bool,
) -> None:
    """A full disk is the host's state, not the job's fault: its launch is put off (the
    worker queues it again for later); any other fault fails it, as before, a full quota
    (the account's own) among them."""
    launches = three_launches(tmp_path)

    def second_has_no_room(folder: JobDir, *args: object, **kwargs: object) -> None:
        if folder.path == launches[1].job_dir:
            raise OSError(fault, os.strerror(fault), str(folder.path))
        make_folder(folder, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr("ddpq.executors.local.spawn.make_folder", second_has_no_room)
    handles = executor.start_many(launches)
    second = handles[1]
    assert isinstance(second, LaunchFailed) and not second.interrupted
    assert second.put_off is put_off, second
    assert ("no room on the disk of its folder" in str(second)) is put_off
    executor.proceed([1, 3])
    assert sorted(all_ended(executor, 2)) == [1, 3]


@pytest.mark.parametrize("lost", [False, True], ids=["refused", "lost"])
def test_a_fork_failed_in_the_middle_fails_that_job_and_the_next_gets_its_own_answer(
    executor: LocalExecutor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lost: bool
) -> None:
    # The server forked the second shim, but its answer says it could not (or the answer
    # is lost): that job fails, its shim (told nothing) ends without running it, and the
    # third job's answer is still the third's. A lost answer is the executor's own loss:
    # the worker queues that job again (LaunchFailed.interrupted).
    answers: list[int] = []
    real_answer = ForkServer.answer

    def failing_second(self: ForkServer, ticket: Ticket) -> int:
        pid = real_answer(self, ticket)
        answers.append(pid)
        if len(answers) == 2 and tree is not None:  # the shim is in its cgroup by then
            procs_file = cgroups.job_cgroup(tree, 2, 1) / "cgroup.procs"
            wait_for(lambda: str(pid) in procs_file.read_text().split(), 30, "shim 2 joined")
        if len(answers) == 2 and lost:
            raise ForkServerLost("no answer from the fork server: lost for the test")
        if len(answers) == 2:
            raise OSError("the fork server could not fork: refused for the test")
        return pid

    tree = executor.tracking.tree
    monkeypatch.setattr(ForkServer, "answer", failing_second)
    handles = executor.start_many(three_launches(tmp_path))
    second = handles[1]
    assert isinstance(second, LaunchFailed) and "for the test" in str(second)
    assert second.interrupted is lost
    if tree is not None:  # its shim killed and its cgroup removed, not left behind
        assert not cgroups.job_cgroup(tree, 2, 1).exists()
    its_own_shim(executor, tmp_path, 3)
    executor.proceed([1, 3])
    ended = all_ended(executor, 2)
    assert {n: e.record.exit_code for n, e in ended.items()} == {1: 0, 3: 0}
    shim = procs.identity(answers[1])
    wait_for(lambda: shim is None or not procs.is_alive(shim), 30, "the second shim to end")
    assert not (tmp_path / "jobs" / "2" / "output.log").read_text().count("job 2")


def test_a_pass_larger_than_the_sockets_buffers_is_forked_by_the_server(
    executor: LocalExecutor, tmp_path: Path
) -> None:
    # Unread answers count against the server's socket buffer: with every request of a
    # large pass sent before any answer was read, the server waited to answer while the
    # worker waited to send (~290 in, here), until a timeout sent the rest of the pass to
    # the exec path. Every one of 400 starts goes through the fork server.
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    launches = [a_launch(jobs / str(n), job_id=n, command=["true"]) for n in range(1, 401)]
    handles = executor.start_many(launches)
    assert all(isinstance(h, str) for h in handles), handles
    assert [n for n in range(1, 401) if executor._watched[n].child is not None] == []
    executor.proceed(list(range(1, 401)))
    ended = all_ended(executor, 400)
    assert {e.record.exit_code for e in ended.values()} == {0}


def test_no_room_outside_the_jobs_folder_fails_the_job_not_puts_it_off(
    executor: LocalExecutor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ENOSPC where it does not mean a full disk (a v1 cpuset without memory nodes says it
    when a process joins): put off, the job would wait for good."""

    def cpuset_refuses(*_: object) -> object:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "cpuset.tasks")

    monkeypatch.setattr("ddpq.executors.local.spawn.Spawner._request", cpuset_refuses)
    [refused] = executor.start_many(three_launches(tmp_path)[:1])
    assert isinstance(refused, LaunchFailed) and not refused.put_off
    assert "no room" not in str(refused)
