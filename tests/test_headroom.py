"""The database's reserve on a full state disk (store.headroom), where a real full disk is
not needed: the reserve file itself, the writes that must happen done again once a part of
it is given back (a full disk injected as SQLite and the kernel report it), submissions
refused while the disk is short while cancel, hold and release still work, and the
worker's own writes (a stop sent, an end recorded) done in the same pass."""

from __future__ import annotations

import errno
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.exc import OperationalError

from ddpq.core.states import JobState
from ddpq.store import attempts as attempt_store
from ddpq.store import headroom
from ddpq.store.db import Database, is_disk_full, storage_fault
from ddpq.store.headroom import Reserve
from ddpq.worker import loop
from tests.inprocess import client_with_gpus
from tests.worker.rig import Rig, make_rig

MIB = 1 << 20


def full_sqlite() -> Exception:
    return sqlite3.OperationalError("database or disk is full")


# Each way a full disk reaches a write: SQLite's own error, as SQLAlchemy wraps it, and
# the kernel's for a file ddpq writes itself (the disk, or the account's quota).
DISK_FULL: list[Callable[[], Exception]] = [
    full_sqlite,
    lambda: OperationalError("COMMIT", {}, full_sqlite()),
    lambda: OSError(errno.ENOSPC, "No space left on device"),
    lambda: OSError(errno.EDQUOT, "Disk quota exceeded"),
]
NOT_FULL: list[Callable[[], Exception]] = [
    lambda: sqlite3.OperationalError("database is locked"),
    lambda: OperationalError("COMMIT", {}, sqlite3.OperationalError("disk I/O error")),
    lambda: OSError(errno.EIO, "Input/output error"),
    lambda: ValueError("a bug"),
]


@pytest.fixture
def reserve(tmp_path: Path) -> Reserve:
    r = Reserve(tmp_path / "db-reserve", 4 * MIB)
    assert r.fill()
    return r


def test_the_reserve_is_allocated_given_back_in_parts_and_made_whole_again(
    reserve: Reserve,
) -> None:
    assert reserve.held() == 4 * MIB  # blocks, not a sparse file's size
    held = [reserve.held()]
    while reserve.give_back():
        held.append(reserve.held())
    assert held == [4 * MIB, 3 * MIB, 2 * MIB, MIB, 0]
    assert reserve.fill() and reserve.held() == 4 * MIB


def test_the_reserve_is_not_made_where_it_would_leave_less_than_its_size_free(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    r = Reserve(tmp_path / "db-reserve", 4 * MIB)
    monkeypatch.setattr(headroom, "free_bytes", lambda _folder: 7 * MIB)
    assert not r.fill() and r.held() == 0
    monkeypatch.setattr(headroom, "free_bytes", lambda _folder: 8 * MIB)
    assert r.fill() and r.held() == 4 * MIB


@pytest.mark.parametrize("free", [0, 512 * 1024, 4 * MIB - 1])
def test_less_free_than_the_reserve_is_a_shortage_that_says_so(
    reserve: Reserve, monkeypatch: pytest.MonkeyPatch, free: int
) -> None:
    monkeypatch.setattr(headroom, "free_bytes", lambda _folder: free)
    why = reserve.shortage()
    assert why is not None
    assert why.startswith("the disk holding ddpq's state is full")
    assert "4M kept for cancels" in why and "cancel, hold and release still work" in why
    monkeypatch.setattr(headroom, "free_bytes", lambda _folder: 4 * MIB)
    assert reserve.shortage() is None


def test_a_reserve_of_0_is_none_and_frees_an_earlier_one(reserve: Reserve) -> None:
    off = Reserve(reserve.path, 0)
    assert off.fill() and not reserve.path.exists()
    assert off.shortage() is None and not off.give_back()


@pytest.mark.parametrize("error", DISK_FULL)
def test_a_full_disk_is_told_apart(error: Callable[[], Exception]) -> None:
    assert is_disk_full(error())
    assert storage_fault(error()) == "the disk holding ddpq's state is full"


@pytest.mark.parametrize("error", NOT_FULL)
def test_other_faults_are_no_full_disk(error: Callable[[], Exception]) -> None:
    assert not is_disk_full(error())


@pytest.mark.parametrize("error", DISK_FULL)
@pytest.mark.parametrize("failures", [1, 3])
def test_a_write_that_must_happen_is_done_again_while_the_reserve_lasts(
    tmp_path: Path,
    reserve: Reserve,
    error: Callable[[], Exception],
    failures: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    disk_full(monkeypatch)
    db = Database(tmp_path / "ddpq.db", reserve=reserve)
    tries: list[int] = []

    def work() -> str:
        tries.append(1)
        if len(tries) <= failures:
            raise error()
        return "written"

    assert db.making_room(work) == "written"
    assert len(tries) == failures + 1
    assert reserve.held() == 4 * MIB - failures * MIB  # a part per refusal, no more


def test_once_the_reserve_is_spent_the_full_disk_is_raised(
    tmp_path: Path, reserve: Reserve, monkeypatch: pytest.MonkeyPatch
) -> None:
    disk_full(monkeypatch)
    db = Database(tmp_path / "ddpq.db", reserve=reserve)
    tries: list[int] = []

    def never() -> None:
        tries.append(1)
        raise full_sqlite()

    with pytest.raises(sqlite3.OperationalError):
        db.making_room(never)
    assert len(tries) == headroom.PARTS + 1 and reserve.held() == 0


@pytest.mark.parametrize("error", NOT_FULL)
def test_other_faults_are_raised_at_once_and_keep_the_reserve(
    tmp_path: Path, reserve: Reserve, error: Callable[[], Exception]
) -> None:
    db = Database(tmp_path / "ddpq.db", reserve=reserve)
    tries: list[int] = []

    def broken() -> None:
        tries.append(1)
        raise error()

    with pytest.raises(type(error())):
        db.making_room(broken)
    assert len(tries) == 1 and reserve.held() == 4 * MIB


def disk_full(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing free beside the reserve: what is given back and not written stays given
    back (on a real full disk, a job took it)."""
    monkeypatch.setattr(headroom, "free_bytes", lambda _folder: 0)


def refuse_once(monkeypatch: pytest.MonkeyPatch, owner: object, name: str) -> list[Exception]:
    """``owner.name`` fails once as a full disk makes SQLite fail; the list empties then."""
    real = getattr(owner, name)
    refusals = [full_sqlite()]

    def refused(*args: object, **kw: object) -> object:
        if refusals:
            raise refusals.pop()
        return real(*args, **kw)

    monkeypatch.setattr(owner, name, refused)
    return refusals


# ---- the API: new work refused while short, cancel, hold and release taken ---------------


@pytest.fixture
def api(tmp_path: Path) -> Iterator[TestClient]:
    yield from client_with_gpus(tmp_path / "home", gpus=2, state_reserve_bytes=4 * MIB)


def test_submissions_wait_while_the_disk_is_short_and_cancel_hold_release_do_not(
    api: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    waiting = api.post("/v1/jobs", json={"command": ["true"], "hold": True}).json()["id"]
    other = api.post("/v1/jobs", json={"command": ["true"]}).json()["id"]
    monkeypatch.setattr(headroom, "free_bytes", lambda _folder: 1 * MIB)
    for path, body in [
        ("/v1/jobs", {"command": ["true"]}),
        ("/v1/sweeps", {"template": {"command": ["echo", "{x}"]}, "params": {"x": ["1", "2"]}}),
    ]:
        r = api.post(path, json=body)
        assert r.status_code == 507, r.text
        assert r.json()["code"] == "insufficient_storage"
        assert r.json()["detail"].startswith("the disk holding ddpq's state is full (1M free")
    assert api.post(f"/v1/jobs/{waiting}/release").status_code == 200
    assert api.post(f"/v1/jobs/{waiting}/hold").json()["state"] == "held"
    assert api.post(f"/v1/jobs/{other}/cancel").json()["state"] == "cancelled"
    monkeypatch.setattr(headroom, "free_bytes", lambda _folder: 64 * MIB)
    assert api.post("/v1/jobs", json={"command": ["true"]}).status_code == 201
    documented = api.get("/openapi.json").json()["paths"]
    for path in ("/v1/jobs", "/v1/sweeps"):
        assert "507" in documented[path]["post"]["responses"], path


def test_a_cancel_refused_by_a_full_disk_is_written_with_the_reserve(
    api: TestClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cancel's transaction fails once as SQLite fails on a full disk: the API gives
    back a part of the reserve and writes it, instead of answering 503."""
    reserve = Reserve(tmp_path / "home" / "db-reserve", 4 * MIB)
    assert reserve.fill()
    job = api.post("/v1/jobs", json={"command": ["true"]}).json()["id"]
    disk_full(monkeypatch)
    refusals = refuse_once(monkeypatch, Database, "write")
    r = api.post(f"/v1/jobs/{job}/cancel")
    assert r.status_code == 200 and r.json()["state"] == "cancelled", r.text
    assert not refusals and reserve.held() == 3 * MIB


# ---- the worker: a stop sent and an end recorded in the pass the disk refused ------------


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    r = make_rig(tmp_path / "home", state_reserve_bytes=4 * MIB)
    assert Reserve(r.settings.reserve_path, 4 * MIB).fill()
    yield r
    r.close()


def test_the_worker_sends_a_stop_in_the_pass_the_full_disk_refused_it(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = rig.submit()
    rig.step()
    assert rig.job(job).state is JobState.RUNNING
    rig.cancel(job)
    disk_full(monkeypatch)
    refusals = refuse_once(monkeypatch, attempt_store, "mark_stop_sent")
    rig.step()  # the stop: refused, then written with the reserve; the fake job ends at once
    assert not refusals
    rig.step()
    assert rig.job(job).state is JobState.CANCELLED
    assert Reserve(rig.settings.reserve_path, 4 * MIB).held() == 3 * MIB


def test_the_worker_records_an_end_in_the_pass_the_full_disk_refused_it(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = rig.submit()
    rig.step()
    rig.host.finish(job, 0)
    refusals = refuse_once(monkeypatch, loop, "record_exits")
    rig.step()
    assert not refusals
    assert rig.job(job).state is JobState.SUCCEEDED
