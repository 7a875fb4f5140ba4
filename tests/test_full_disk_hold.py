"""A full disk kept full by a job that keeps writing (review finding 1): the reserve given
back for a must-write is not the job's to take, and a stop goes out even when its sending
cannot be recorded.

- ``Database.making_room`` holds the jobs still (``Reserve.pause_jobs``) from the first
  give-back until the write is done and what it left is taken back (``Reserve.reclaim``);
- ``executors.local.freeze`` holds them still by freezing their cgroups, each holder
  counted, and a worker's start thaws any left frozen;
- the worker sends a stop whose record the disk refused, once, and records it later.
"""

from __future__ import annotations

import errno
import sqlite3
import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from ddpq.core.states import JobState
from ddpq.executors.local import cgroups, freeze
from ddpq.store import attempts as attempt_store
from ddpq.store import headroom
from ddpq.store.db import Database
from ddpq.store.headroom import Reserve
from tests.test_cgroups import in_cgroup, killing, needs_cgroups, scratch, token
from tests.test_headroom import DISK_FULL, full_sqlite
from tests.worker.rig import Rig, make_rig

__all__ = ["scratch"]  # a fixture, used by name

MIB = 1 << 20


class Events:
    """What happened, in order: the jobs held and let go, parts given back, writes."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    @contextmanager
    def pause(self) -> Iterator[None]:
        self.seen.append("hold")
        try:
            yield
        finally:
            self.seen.append("let go")


def watched_reserve(path: Path, events: Events, monkeypatch: pytest.MonkeyPatch) -> Reserve:
    reserve = Reserve(path, 4 * MIB, pause_jobs=events.pause)
    assert reserve.fill()
    for name in ("give_back", "reclaim"):
        real = getattr(reserve, name)

        def spy(real: Callable[[], object] = real, name: str = name) -> object:
            events.seen.append(name)
            return real()

        monkeypatch.setattr(reserve, name, spy)
    return reserve


@pytest.mark.parametrize("error", DISK_FULL)
@pytest.mark.parametrize("failures", [1, 3])
def test_the_jobs_are_held_from_the_first_give_back_until_the_reserve_is_taken_back(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    error: Callable[[], Exception],
    failures: int,
) -> None:
    events = Events()
    reserve = watched_reserve(tmp_path / "db-reserve", events, monkeypatch)
    db = Database(tmp_path / "ddpq.db", reserve=reserve)

    def work() -> str:
        events.seen.append("write")
        if events.seen.count("write") <= failures:
            raise error()
        return "written"

    assert db.making_room(work) == "written"
    assert events.seen == (
        ["write", "hold"] + ["give_back", "write"] * failures + ["reclaim", "let go"]
    )
    # Nothing else wrote here: all that was given back and not used is the reserve's again.
    assert reserve.held() == 4 * MIB


def test_a_write_the_spent_reserve_cannot_save_still_lets_the_jobs_go(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events = Events()
    reserve = watched_reserve(tmp_path / "db-reserve", events, monkeypatch)
    monkeypatch.setattr(headroom, "free_bytes", lambda _folder: 0)  # the job took it all
    db = Database(tmp_path / "ddpq.db", reserve=reserve)

    def never() -> None:
        events.seen.append("write")
        raise full_sqlite()

    with pytest.raises(sqlite3.OperationalError):
        db.making_room(never)
    assert events.seen[:2] == ["write", "hold"] and events.seen[-2:] == ["reclaim", "let go"]
    assert events.seen.count("give_back") == headroom.PARTS + 1  # the last finds none


def test_a_write_that_needs_no_room_holds_no_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events = Events()
    reserve = watched_reserve(tmp_path / "db-reserve", events, monkeypatch)
    db = Database(tmp_path / "ddpq.db", reserve=reserve)
    assert db.making_room(lambda: "written") == "written"
    with pytest.raises(sqlite3.OperationalError):
        db.making_room(lambda: (_ for _ in ()).throw(sqlite3.OperationalError("locked")))
    assert events.seen == []


@pytest.mark.parametrize("free_mib", [0, 1, 2, 3, 100])
def test_reclaim_takes_back_what_is_free_up_to_the_reserves_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, free_mib: int
) -> None:
    reserve = Reserve(tmp_path / "db-reserve", 4 * MIB)
    assert reserve.fill()
    assert reserve.give_back() and reserve.give_back()  # 2M left
    monkeypatch.setattr(headroom, "free_bytes", lambda _folder: free_mib * MIB)
    reserve.reclaim()
    assert reserve.held() == min(4, 2 + free_mib) * MIB


# ---- the jobs' cgroups, frozen and thawed -----------------------------------------------


def events_of(cgroup: Path) -> dict[str, str]:
    lines = (cgroup / "cgroup.events").read_text().splitlines()
    return dict(line.split(" ", 1) for line in lines)


@needs_cgroups
def test_every_job_of_the_state_folder_is_frozen_until_the_last_holder_is_done(
    tmp_path: Path, scratch: Path
) -> None:
    for name in ("ours", "theirs"):
        (scratch / name).mkdir()
    for name in ("home", "other"):
        (tmp_path / name).mkdir()
    ours = cgroups.detect(tmp_path / "home", mode="auto", root=scratch / "ours")
    theirs = cgroups.detect(tmp_path / "other", mode="auto", root=scratch / "theirs")
    assert ours.tree is not None and theirs.tree is not None
    jobs = [cgroups.create(ours.tree / f"job-{n}-1") for n in (1, 2)]
    other = cgroups.create(theirs.tree / "job-1-1")
    tok = token()
    with killing(tok):
        procs = [
            subprocess.Popen(["sleep", tok], preexec_fn=in_cgroup(where))
            for where in [*jobs, other]
        ]
        outer = freeze.jobs_frozen(tmp_path / "home")
        inner = freeze.jobs_frozen(tmp_path / "home")
        with outer:
            assert all(freeze.is_frozen(job) for job in jobs)
            with inner:
                pass
            # Another holder (the API while the worker writes) is done: still held.
            assert all(freeze.is_frozen(job) for job in jobs)
            assert events_of(other)["frozen"] == "0"  # another state folder's job
        assert all(events_of(job)["frozen"] == "0" for job in jobs)
        for proc in procs:
            proc.kill()
            proc.wait(5)


@needs_cgroups
def test_holders_in_several_threads_share_one_freeze(tmp_path: Path, scratch: Path) -> None:
    tracking = cgroups.detect(tmp_path, mode="auto", root=scratch)
    assert tracking.tree is not None
    job = cgroups.create(tracking.tree / "job-1-1")
    inside, done = threading.Barrier(3), threading.Event()

    def hold() -> None:
        with freeze.jobs_frozen(tmp_path):
            inside.wait(10)
            done.wait(10)

    threads = [threading.Thread(target=hold) for _ in range(2)]
    for t in threads:
        t.start()
    inside.wait(10)
    assert events_of(job)["frozen"] == "1"
    done.set()
    for t in threads:
        t.join(10)
    assert events_of(job)["frozen"] == "0"


@needs_cgroups
def test_a_workers_start_thaws_jobs_a_dead_daemon_left_frozen(
    tmp_path: Path, scratch: Path
) -> None:
    tracking = cgroups.detect(tmp_path, mode="auto", root=scratch)
    assert tracking.tree is not None
    job = cgroups.create(tracking.tree / "job-1-1")
    tok = token()
    with killing(tok):
        proc = subprocess.Popen(["sleep", tok], preexec_fn=in_cgroup(job))
        assert freeze.freeze_all(tmp_path) == [job]  # and never thawed: the daemon died
        assert events_of(job)["frozen"] == "1"
        cgroups.detect(tmp_path, mode="auto", root=scratch)
        assert events_of(job)["frozen"] == "0"
        proc.kill()
        proc.wait(5)


def test_no_cgroups_recorded_freezes_nothing_and_slurm_holds_no_job(tmp_path: Path) -> None:
    with freeze.jobs_frozen(tmp_path):
        pass
    from ddpq.config import Settings

    assert freeze.pauser(Settings(home=tmp_path, executor="slurm")) is None
    assert freeze.pauser(Settings(home=tmp_path)) is not None


# ---- the worker: a stop sent once, even when the disk refuses its record ----------------


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    r = make_rig(tmp_path / "home", state_reserve_bytes=0)  # no reserve: the record fails
    r.host.stop_ends_with_signal = None  # the job takes its grace to end
    yield r
    r.close()


UNRECORDED: list[Callable[[], Exception]] = [
    full_sqlite,
    lambda: OSError(errno.ENOSPC, "No space left on device"),
    lambda: sqlite3.OperationalError("database is locked"),
]


@pytest.mark.parametrize("error", UNRECORDED)
def test_a_stop_the_disk_will_not_record_is_sent_once_and_recorded_later(
    rig: Rig, monkeypatch: pytest.MonkeyPatch, error: Callable[[], Exception]
) -> None:
    job = rig.submit()
    rig.step()
    rig.cancel(job)
    real = attempt_store.mark_stop_sent
    refusing = [True]

    def mark(*args: object, **kw: object) -> bool:
        if refusing:
            raise error()
        return real(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(attempt_store, "mark_stop_sent", mark)
    rig.step(3)
    assert rig.host.attempt_of(job).stops == 1  # sent, and not again every pass
    refusing.clear()
    rig.step(2)
    assert rig.host.attempt_of(job).stops == 1  # recorded now, still not sent again
    with rig.api.read() as s:
        from ddpq.store import jobs as job_store

        assert job_store.get_job(s, job).stop_sent_at is not None
    rig.host.finish(job, None, 15)
    rig.step()
    assert rig.job(job).state is JobState.CANCELLED


def test_a_time_limit_the_disk_will_not_record_is_sent_once(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = rig.submit(time_limit_s=60)
    rig.step()
    rig.clock.advance(61)

    def refused(*args: object, **kw: object) -> bool:
        raise full_sqlite()

    monkeypatch.setattr(attempt_store, "mark_stop_sent", refused)
    rig.step(3)
    assert rig.host.attempt_of(job).stops == 1


# ---- the admin told at start when the job folders share the state's filesystem ----------


def test_job_folders_on_the_states_filesystem_are_told_at_start(tmp_path: Path) -> None:
    from ddpq.config import Settings
    from ddpq.daemon.quota import shared_disk

    settings = Settings(home=tmp_path)
    settings.jobs_dir.mkdir()
    said = shared_disk(settings)
    assert said is not None and 'docs/admin.md, "A full disk"' in said
    assert str(settings.jobs_dir) in said


def test_job_folders_on_a_filesystem_of_their_own_are_not(tmp_path: Path) -> None:
    from ddpq.config import Settings
    from ddpq.daemon.quota import shared_disk

    elsewhere = Path("/dev/shm")
    if not elsewhere.is_dir() or elsewhere.stat().st_dev == tmp_path.stat().st_dev:
        pytest.skip("no second filesystem to put job folders on here")
    settings = Settings(home=tmp_path)
    settings.jobs_dir.symlink_to(elsewhere)  # as a mount at jobs/ would be
    assert shared_disk(settings) is None
