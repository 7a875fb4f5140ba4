"""A disk of job folders that someone else fills (found by hand: bob kept the disk full
from his shell, and alice's jobs failed). A launch that finds no room is put off, not
failed; a job launched with room ends with its own status, not "lost", however full the
disk is by the time it ends: the worker takes its exit record's room at the launch."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from ddpq.executors.base import LaunchFailed
from ddpq.executors.local import shim_record
from ddpq.executors.local.executor import LocalExecutor
from tests.launches import a_launch
from tests.test_resources import small_disk
from tests.test_start_many import all_ended, executor

__all__ = ["executor", "small_disk"]  # fixtures, used by name


def fill(disk: Path) -> Path:
    """Fill ``disk`` to its last block, as a user's shell would; the file that did it."""
    filler = disk / "filler"
    chunk = b"\0" * (1 << 20)
    with open(filler, "wb", buffering=0) as f:
        while True:
            try:
                f.write(chunk)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
                chunk = chunk[: len(chunk) // 2]
                if not chunk:
                    return filler


def test_a_launch_on_a_full_disk_is_put_off_and_runs_once_there_is_room(
    executor: LocalExecutor, small_disk: Path
) -> None:
    filler = fill(small_disk)
    launch = a_launch(small_disk / "jobs" / "1", command=["true"])
    [refused] = executor.start_many([launch])
    assert isinstance(refused, LaunchFailed) and refused.put_off, refused
    assert "no room on the disk of its folder" in str(refused)
    filler.unlink()  # room again: the same launch starts and ends as the job did
    [handle] = executor.start_many([launch])
    assert isinstance(handle, str)
    executor.proceed([1])
    record = all_ended(executor, 1)[1].record
    assert (record.exit_code, record.error) == (0, None)


def test_a_job_ends_with_its_own_status_however_full_the_disk_became(
    executor: LocalExecutor, small_disk: Path
) -> None:
    """Launched with room, then the disk filled by someone else before the job ran: its
    shim writes the record over the room the launch took (before, it could not write it,
    and the job ended "lost")."""
    launch = a_launch(small_disk / "jobs" / "1", command=["sh", "-c", "exit 3"])
    [handle] = executor.start_many([launch])
    assert isinstance(handle, str)
    fill(small_disk)
    executor.proceed([1])
    record = all_ended(executor, 1)[1].record
    assert (record.exit_code, record.error) == (3, None)


def _blanks(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    room = folder / "exit.json.tmp"
    room.write_bytes(b" " * shim_record.RECORD_SPACE)
    return room


def _hard_linked(room: Path) -> None:
    (room.parent / "other-name").hardlink_to(room)


def _fifo(room: Path) -> None:
    room.unlink()
    os.mkfifo(room)


def _link(room: Path) -> None:
    room.rename(room.with_name("elsewhere"))
    room.symlink_to(room.with_name("elsewhere"))


def _grown(room: Path) -> None:
    with open(room, "ab") as f:
        f.write(b"x")


@pytest.mark.parametrize("spoil", [_hard_linked, _fifo, _link, _grown])
def test_the_shim_writes_over_the_launchs_blanks_only_as_the_worker_left_them(
    tmp_path: Path, spoil: Callable[[Path], None]
) -> None:
    """The shim writes its record over the launch's blanks (no new block, no moment
    where a filler could take the room), but only into its own one-name file of their
    size: anything else put at the name (the account's own doing) is never written."""
    record = tmp_path / "ok" / "exit.json"
    room = _blanks(record.parent)
    shim_record.reserve_record(str(record))
    try:
        assert os.fstat(shim_record.RESERVED["fd"]).st_ino == room.stat().st_ino
    finally:
        os.close(shim_record.RESERVED["fd"])
        shim_record.RESERVED["fd"] = -1
    spoilt = tmp_path / "spoilt" / "exit.json"
    room = _blanks(spoilt.parent)
    spoil(room)
    before = {p.name: p.lstat() for p in spoilt.parent.iterdir()}
    assert shim_record.room_left_at_launch(str(room)) == -1
    assert {p.name: p.lstat() for p in spoilt.parent.iterdir()} == before  # untouched


def test_what_the_job_appended_to_its_record_room_does_not_spoil_the_record(
    executor: LocalExecutor, tmp_path: Path
) -> None:
    """The room is the job's own file while it runs: anything it appends there is cut
    when the shim writes its record over the blanks (found by hand: the attempt read as
    lost instead of its exit status)."""
    grow = 'echo junk >> "$DDPQ_JOB_DIR/exit.json.tmp"; exit 6'
    [handle] = executor.start_many([a_launch(tmp_path / "jobs" / "1", command=["sh", "-c", grow])])
    assert isinstance(handle, str)
    executor.proceed([1])
    record = all_ended(executor, 1)[1].record
    assert (record.exit_code, record.error) == (6, None)
