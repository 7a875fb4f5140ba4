"""Outside GPU use: whose a PID is (``/proc``, hostile input), how samples become intervals,
and the worker charging it to its user's fair share (in process, on a moved clock)."""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ddpq.config import Settings
from ddpq.core.gpus import Gpu, GpuProcess
from ddpq.core.states import JobState
from ddpq.core.usage import MERGE_GAP_S
from ddpq.executors.fake import FakeExecutor, FakeHost
from ddpq.store import devices as device_store
from ddpq.store import users as user_store
from ddpq.store.db import Database
from ddpq.store.models import OutsideUse as Row
from ddpq.worker import inventory
from ddpq.worker.loop import Worker
from ddpq.worker.outside import STATUS_LIMIT, OutsideUse, account_name, process_uid
from tests.template_db import migrated
from tests.worker.rig import Clock, Rig

STATUS = (
    "Name:\tpython\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t{pid}\nPid:\t{pid}\n"
    "PPid:\t1\nTracerPid:\t0\nUid:\t{uid}\nGid:\t100\t100\t100\t100\nFDSize:\t64\n"
)


def proc_with(root: Path, pid: int, status: str | bytes) -> Path:
    (root / str(pid)).mkdir(parents=True)
    data = status.encode() if isinstance(status, str) else status
    (root / str(pid) / "status").write_bytes(data)
    return root


# ---- /proc ------------------------------------------------------------------------------


def test_the_owner_is_the_real_uid_of_the_status_file(tmp_path: Path) -> None:
    proc = proc_with(tmp_path, 4242, STATUS.format(pid=4242, uid="1000\t0\t0\t0"))
    assert process_uid(4242, proc) == 1000  # real, not effective: whoever ran a setuid one


def test_a_process_name_that_forges_a_uid_line_is_not_believed(tmp_path: Path) -> None:
    forged = "Name:\tx\nUid:\t0\t0\t0\t0\n" + STATUS.format(pid=7, uid="1000\t1000\t1000\t1000")
    assert process_uid(7, proc_with(tmp_path, 7, forged)) == 1000


@pytest.mark.parametrize(
    "uid_line",
    [
        "-1\t-1\t-1\t-1",
        "abc\t1\t1\t1",
        "1000\t1000\t1000",  # three fields
        "1000 1000 1000 1000 1000",
        "99999999999\t1\t1\t1",  # more than a uid holds
        "4294967295\t1\t1\t1",  # (uid_t)-1: no uid at all
        "１０００\t1\t1\t1",  # other scripts' digits
        "",
    ],
)
def test_a_uid_line_that_is_not_four_uids_gives_no_owner(tmp_path: Path, uid_line: str) -> None:
    proc = proc_with(tmp_path, 9, STATUS.format(pid=9, uid=uid_line))
    assert process_uid(9, proc) is None


@pytest.mark.parametrize(
    "content",
    [b"", b"\x00\xff\xfe garbage", b"Name:\tx\n", b"Uid:" + b"9" * 100_000],
    ids=["empty", "binary", "no-uid-line", "endless-line"],
)
def test_a_status_file_without_a_uid_line_gives_no_owner(tmp_path: Path, content: bytes) -> None:
    assert process_uid(11, proc_with(tmp_path, 11, content)) is None


def test_only_the_first_part_of_a_status_file_is_read(tmp_path: Path) -> None:
    padded = "Name:\tx\n" + "Pad:\t" + "x" * STATUS_LIMIT + "\nUid:\t1000\t1000\t1000\t1000\n"
    assert process_uid(12, proc_with(tmp_path, 12, padded)) is None


@pytest.mark.parametrize("pid", [0, -1, 1 << 22 | 1, 2**63])
def test_a_pid_out_of_the_kernels_range_is_not_looked_up(tmp_path: Path, pid: int) -> None:
    assert process_uid(pid, tmp_path) is None


def test_a_gone_or_unreadable_process_gives_no_owner(tmp_path: Path) -> None:
    assert process_uid(13, tmp_path) is None  # no such process
    (tmp_path / "14" / "status").mkdir(parents=True)  # not a file
    assert process_uid(14, tmp_path) is None
    assert process_uid(15, tmp_path / "no-proc-at-all") is None


def test_the_real_proc_names_this_process_and_not_an_ended_one() -> None:
    assert process_uid(os.getpid()) == os.getuid()
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # reaped: its PID names nothing now
    assert process_uid(child.pid) in (None, os.getuid())  # None, unless the PID came back


def test_an_account_name_comes_from_the_password_database() -> None:
    assert account_name(os.getuid()) == pwd.getpwuid(os.getuid()).pw_name
    unused = next(uid for uid in range(2**31 - 1, 2**31 - 1000, -1) if not _has_entry(uid))
    assert account_name(unused) is None


def _has_entry(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return False
    return True


# ---- samples into intervals ----------------------------------------------------------------


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    migrated(tmp_path / "ddpq.db")
    database = Database(tmp_path / "ddpq.db")
    yield database
    database.dispose()


def on_gpu(index: int, *pids: int) -> Gpu:
    return Gpu(index, f"GPU-{index}", "g", 16384, 0, tuple(GpuProcess(p, 10) for p in pids), False)


def rows(db: Database) -> list[tuple[int | None, str | None, int, float, float]]:
    with db.read() as s:
        found = s.query(Row).order_by(Row.id).all()
        return [(r.uid, r.account, r.gpu, r.started_at, r.ended_at) for r in found]


def test_consecutive_samples_make_one_interval_and_a_long_gap_a_new_one(db: Database) -> None:
    asked: list[int] = []

    def name_of(uid: int) -> str:
        asked.append(uid)
        return "alice"

    outside = OutsideUse(5.0, uid_of={100: 1000, 101: 1000}.get, name_of=name_of)
    t = 1_000_000.0

    def sample(at: float, *pids: int) -> None:
        gpus = outside.name_owners([on_gpu(0, *pids), on_gpu(1)])
        with db.write() as s:
            outside.sample(s, gpus, at)

    sample(t, 100, 101)  # two processes, one account: one sighting, credited 5 s
    assert rows(db) == [(1000, "alice", 0, t - 5, t)]
    for i in range(1, 13):
        sample(t + 5 * i, 100)
    assert rows(db) == [(1000, "alice", 0, t - 5, t + 60)]
    # Away for less than MERGE_GAP_S: the same interval, the gap charged.
    sample(t + 60 + MERGE_GAP_S / 2)
    sample(t + 60 + MERGE_GAP_S, 100)
    assert rows(db) == [(1000, "alice", 0, t - 5, t + 60 + MERGE_GAP_S)]
    # Away for longer: a new interval, credited the time since the last sample.
    back = t + 60 + 4 * MERGE_GAP_S
    sample(back - 7)
    sample(back, 100)
    assert rows(db)[1:] == [(1000, "alice", 0, back - 7, back)]
    assert asked == [1000]  # the password database is asked once, not every sample


def test_a_process_restarted_in_a_loop_costs_one_row(db: Database) -> None:
    outside = OutsideUse(5.0, uid_of=lambda pid: 1000, name_of=lambda uid: "alice")
    t = 2_000_000.0
    for i in range(720):  # an hour of samples, the process there every other one
        gpus = outside.name_owners([on_gpu(0, *([500 + i] if i % 2 else []))])
        with db.write() as s:
            outside.sample(s, gpus, t + 5 * i)
    assert len(rows(db)) == 1


def test_unknown_owners_and_uids_without_a_name_are_kept_apart(db: Database) -> None:
    outside = OutsideUse(5.0, uid_of={1: None, 2: 4321}.get, name_of=lambda uid: None)
    gpus = outside.name_owners([on_gpu(0, 1, 2)])
    assert [(p.uid, p.account) for p in gpus[0].processes] == [(None, None), (4321, None)]
    with db.write() as s:
        outside.sample(s, gpus, 100.0)
        outside.sample(s, gpus, 105.0)
    assert rows(db) == [(None, None, 0, 95.0, 105.0), (4321, None, 0, 95.0, 105.0)]


# ---- the worker: named on the GPU map, charged to fair share ----------------------------------

ALICE, BOB = 1000, 1001


def outside_rig(
    home: Path, monkeypatch: pytest.MonkeyPatch, *, mapped: bool = False, **settings: object
) -> Rig:
    """A worker on NVML's GPUs (two, 16 GiB), where alice's notebook (pid 777, uid 1000)
    holds GPU 0 outside the queue."""
    cfg = Settings(home=home, grace_s=1.0, port_range=(29600, 29609), **settings)  # type: ignore[arg-type]
    migrated(cfg.db_path)
    if mapped:
        with Database(cfg.db_path).write() as s:
            user_store.add_user(s, "alice", admin=False, unix_user="alice", now=0.0)
    gpus = [on_gpu(0, 777), on_gpu(1)]
    monkeypatch.setattr(inventory, "discover", lambda fake: gpus)
    clock = Clock()
    host = FakeHost(clock=clock)
    worker = Worker(cfg, FakeExecutor(host), devices=gpus, clock=clock, listen=False)
    worker.scheduler.ports.port_free = lambda port: True
    if worker.inventory.outside is not None:  # None: a worker that samples nothing
        worker.inventory.outside.uid_of = {777: ALICE}.get
        worker.inventory.outside.name_of = {ALICE: "alice", BOB: "bob"}.get
    worker.reconcile()  # the first look at the GPUs: a sample
    return Rig(cfg, clock, host, Database(cfg.db_path), worker)


def test_the_gpu_map_names_the_account_of_an_outside_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rig = outside_rig(tmp_path / "home", monkeypatch)
    try:
        with rig.api.read() as s:
            procs = [d.processes for d in device_store.all_devices(s)]
        assert procs == [(GpuProcess(777, 10, uid=ALICE, account="alice"),), ()]
        assert rows(rig.api) == [(ALICE, "alice", 0, rig.clock() - 5.0, rig.clock())]
    finally:
        rig.close()


@pytest.mark.parametrize(
    ("settings", "mapped", "first"),
    [
        ({}, False, "bob"),  # count, and without --auth the account is the user of its name
        ({"outside_use": "show"}, False, "alice"),  # shown, not counted: submission order
        ({"auth": True}, False, "alice"),  # with --auth an account is nobody's until mapped
        ({"auth": True}, True, "bob"),  # ... and mapped, it is alice's
        # Jobs on Slurm: the worker's GPUs are budget slots, nobody's use is sampled here.
        ({"executor": "slurm"}, False, "alice"),
    ],
)
def test_outside_use_counts_towards_its_users_fair_share(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    settings: dict[str, object],
    mapped: bool,
    first: str,
) -> None:
    rig = outside_rig(tmp_path / "home", monkeypatch, mapped=mapped, **settings)
    try:
        alice = rig.submit(owner="alice")  # first in line, but her notebook holds GPU 0
        bob = rig.submit(owner="bob")
        rig.step()
        started = {owner: rig.job(j).state for owner, j in (("alice", alice), ("bob", bob))}
        assert started[first] is JobState.RUNNING
        assert rig.job(bob if first == "alice" else alice).state is JobState.QUEUED
        assert rig.job(alice if first == "alice" else bob).gpus == [1]  # never GPU 0
    finally:
        rig.close()


def test_with_jobs_on_slurm_no_process_here_is_sampled_or_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Budget slots list no processes; were some listed, they would be no use of the slots.
    rig = outside_rig(tmp_path / "home", monkeypatch, executor="slurm")
    try:
        assert rig.worker.inventory.outside is None  # and reconcile's look stored the map
        with rig.api.read() as s:
            procs = [d.processes for d in device_store.all_devices(s)]
        assert procs == [(GpuProcess(777, 10),), ()]  # shown as NVML said, owner untold
        assert rows(rig.api) == []
    finally:
        rig.close()
