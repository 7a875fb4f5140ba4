"""Retention's file removal (``ddpq.daemon.sweep``) on folders a hostile job wrote: links
planted inside never make it measure or remove anything outside the job's folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ddpq.daemon import sweep
from ddpq.jobdir import EXIT_RECORD, LOG, METRICS, RECORDS, is_checkpoint


@pytest.fixture
def jobs(tmp_path: Path) -> Path:
    folder = tmp_path / "home" / "jobs"
    folder.mkdir(parents=True)
    return folder


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """Someone else's files, which links in the job's folder point at."""
    folder = tmp_path / "outside"
    (folder / "sub").mkdir(parents=True)
    (folder / "precious.txt").write_bytes(b"x" * 10_000)
    (folder / "sub" / "also.txt").write_text("keep me")
    return folder


def job_folder(jobs: Path, job_id: int = 7) -> Path:
    folder = jobs / str(job_id)
    (folder / "ckpt" / "epoch-3").mkdir(parents=True)
    (folder / LOG).write_text("training...\n")
    (folder / EXIT_RECORD).write_text('{"attempt": 1}')
    (folder / METRICS).write_text('{"epoch": 3}\n')
    (folder / "ckpt" / "epoch-3" / "model.pt").write_bytes(os.urandom(50_000))
    (folder / "last.pt").write_bytes(os.urandom(20_000))
    return folder


def everything(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def test_the_records_are_what_is_not_a_checkpoint() -> None:
    # A session's terminal socket and notice are ddpq's too (tiny), never a checkpoint.
    assert {"output.log", "exit.json", "metrics.jsonl", "tty.sock", "notice"} == (RECORDS)
    assert not any(is_checkpoint(name) for name in RECORDS)
    assert all(is_checkpoint(n) for n in ("last.pt", "ckpt", "output.log.1", ".hidden"))


def test_removing_checkpoints_keeps_the_log_and_the_records(jobs: Path) -> None:
    folder = job_folder(jobs)
    usage = sweep.folder_usage(jobs, "7")
    assert usage is not None and usage.checkpoint_bytes >= 70_000
    assert 0 < usage.record_bytes < usage.checkpoint_bytes
    removed = sweep.remove_checkpoints(jobs, "7")
    assert sorted(os.listdir(folder)) == ["exit.json", "metrics.jsonl", "output.log"]
    assert removed.checkpoint_bytes == usage.checkpoint_bytes and removed.record_bytes == 0
    assert (removed.left, removed.gone) == (0, False)
    after = sweep.folder_usage(jobs, "7")
    assert after is not None and (after.checkpoint_bytes, after.record_bytes) == (
        0,
        usage.record_bytes,
    )


def test_removing_a_folder_takes_all_of_it(jobs: Path) -> None:
    job_folder(jobs)
    usage = sweep.folder_usage(jobs, "7")
    removed = sweep.remove_folder(jobs, "7")
    assert not (jobs / "7").exists() and removed.gone and removed.left == 0
    assert usage is not None
    assert (removed.checkpoint_bytes, removed.record_bytes) == (
        usage.checkpoint_bytes,
        usage.record_bytes,
    )
    assert sweep.folder_usage(jobs, "7") is None
    assert sweep.remove_folder(jobs, "7").gone  # gone already: nothing to do, no error


def test_a_planted_link_to_a_file_or_a_folder_outside_removes_only_the_link(
    jobs: Path, outside: Path
) -> None:
    folder = job_folder(jobs)
    (folder / "model.pt").symlink_to(outside / "precious.txt")
    (folder / "ckpt" / "data").symlink_to(outside)
    (folder / "ckpt" / "sub").symlink_to(outside / "sub")
    (folder / LOG).unlink()
    (folder / LOG).symlink_to(outside / "precious.txt")  # in a record's place too
    before = everything(outside)
    usage = sweep.folder_usage(jobs, "7")
    assert usage is not None and usage.checkpoint_bytes < 100_000  # links counted as links
    sweep.remove_checkpoints(jobs, "7")
    assert everything(outside) == before
    assert (folder / LOG).is_symlink()  # a record stays, even a forged one
    sweep.remove_folder(jobs, "7")
    assert not folder.exists()
    assert everything(outside) == before
    assert (outside / "precious.txt").read_bytes() == b"x" * 10_000


def test_a_job_folder_that_is_itself_a_link_is_unlinked_not_followed(
    jobs: Path, outside: Path
) -> None:
    """Without --auth, jobs run as the daemon's account and could swap their folder."""
    (jobs / "8").symlink_to(outside)
    before = everything(outside)
    assert sweep.folder_usage(jobs, "8") is None
    assert sweep.remove_checkpoints(jobs, "8").left == 0
    assert (jobs / "8").is_symlink()  # checkpoints only: the link is no checkpoint of its own
    removed = sweep.remove_folder(jobs, "8")
    assert removed.gone and not os.path.lexists(jobs / "8")
    assert everything(outside) == before


def test_folders_deeper_than_a_descriptor_per_level_allows_are_removed(jobs: Path) -> None:
    folder = jobs / "9"
    folder.mkdir()
    cur = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(sweep.MAX_DEPTH * 3 + 5):
        os.mkdir("d", dir_fd=cur)
        deeper = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=cur)
        os.close(cur)
        cur = deeper
    leaf = os.open("leaf.pt", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=cur)
    os.write(leaf, b"y" * 4096)
    os.close(leaf)
    os.close(cur)
    removed = sweep.remove_folder(jobs, "9")
    assert removed.gone and removed.left == 0 and not folder.exists()
    assert removed.checkpoint_bytes >= 4096


def test_a_fifo_and_other_odd_files_are_removed_without_being_opened(jobs: Path) -> None:
    folder = job_folder(jobs)
    os.mkfifo(folder / "pipe")
    (folder / METRICS).unlink()
    os.mkfifo(folder / METRICS)  # a record that is a FIFO
    assert sweep.folder_usage(jobs, "7") is not None  # no hang on the FIFO
    sweep.remove_folder(jobs, "7")
    assert not folder.exists()
