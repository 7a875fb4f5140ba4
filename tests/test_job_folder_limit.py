"""The per-job folder limit (``job_folder_max``): the setting as people write it, the rule,
the disk watch measuring real folders of every shape a job can fill (with the fake
executor), and a live daemon stopping a job that writes past a tiny limit."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ddpq.config import ConfigError
from ddpq.core import quota
from ddpq.core.disposition import JobFacts, after_exit
from ddpq.core.rules import ExitRecord, StopRequest
from ddpq.core.states import JobState
from ddpq.daemon.quota import DiskWatch
from ddpq.daemon.settings import load_settings
from ddpq.schemas import JobSubmit
from tests.helpers import Daemon, wait_done
from tests.worker.rig import Rig, make_rig

MIB = 1 << 20


@pytest.mark.parametrize(
    "written, read",
    [
        ("10G", 10 << 30),
        ("512M", 512 * MIB),
        (str(5 * MIB), 5 * MIB),
        ("50%", 0.5),
        (" 100% ", 1.0),
        ("unlimited", None),
        (0.25, 0.25),  # TOML: a number below 1 is a share
        (5e10, 50_000_000_000),  # TOML: a float that is whole is bytes
    ],
)
def test_the_limit_is_read_as_people_write_it(written: object, read: object) -> None:
    assert quota.read_limit(written) == read


@pytest.mark.parametrize(
    "written, words",
    [
        ("0%", "above 0%"),
        ("150%", "at most 100%"),
        ("nan%", "at most 100%"),
        ("x%", "not a percentage"),
        ("lots", "not a size"),
        ("64", "at least 1M"),  # 64 bytes: a typo for 64G
        (True, "expected a size"),
        (2.5, "a number is bytes"),
        ("-1G", "negative"),
    ],
)
def test_a_limit_that_cannot_be_read_is_refused_naming_the_flag(
    written: object, words: str
) -> None:
    with pytest.raises(ValueError, match=words):
        quota.read_limit(written)
    if isinstance(written, str):
        with pytest.raises(ConfigError, match=f"--job-folder-max: .*{words}"):
            load_settings({"job_folder_max": written})


def test_the_default_is_half_the_disk_and_a_share_follows_the_disk() -> None:
    assert load_settings({}).job_folder_max == 0.5
    assert quota.folder_limit(0.5, 100 << 30) == 50 << 30
    assert quota.folder_limit(10 * MIB, 100 << 30) == 10 * MIB
    assert quota.folder_limit(None, 100 << 30) is None


def test_the_reason_says_what_the_folder_holds_and_the_limit() -> None:
    assert quota.over_limit(10 * MIB, 10 * MIB, 10 * MIB) is None  # at the limit: fine
    assert (
        quota.over_limit(int(12.3 * (1 << 30)), 10 << 30, 10 << 30)
        == "its folder holds 12.3G, over the 10G per-job limit"
    )
    assert quota.over_limit(60 << 30, 50 << 30, 0.5) == (
        "its folder holds 60G, over the 50G (50% of the disk its folder is on) per-job limit"
    )


def test_a_job_stopped_over_its_limit_fails_and_is_not_retried() -> None:
    killed = ExitRecord(exit_code=None, signal=15, started_at=0.0, ended_at=5.0)
    facts = JobFacts(
        attempt=1,
        max_retries=3,
        port_retries=0,
        stop=StopRequest.QUOTA,
        stop_reason="its folder holds 3M, over the 1M per-job limit",
    )
    d = after_exit(killed, facts, grace_s=10.0, max_port_retries=3, now=5.0)
    assert d.job_state is JobState.FAILED and d.finished
    assert d.job_reason == (
        "its folder holds 3M, over the 1M per-job limit (SIGTERM, SIGKILL after 10s); "
        "killed by signal 15"
    )


# ---- the disk watch on real folders, the worker with the fake executor ---------------------


def one_big_file(folder: Path) -> None:
    (folder / "model.pt").write_bytes(b"w" * (3 * MIB))


def many_small_files_in_folders(folder: Path) -> None:
    for i in range(40):
        sub = folder / f"shard{i}" / "inner"
        sub.mkdir(parents=True)
        for j in range(25):
            (sub / f"{j}.bin").write_bytes(b"s" * 4096)  # 40 * 25 * 4K = 4M


def deeper_than_retention_used_to_look(folder: Path) -> None:
    cur = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(200):
        os.mkdir("d", dir_fd=cur)
        deeper = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=cur)
        os.close(cur)
        cur = deeper
    fd = os.open("hidden.pt", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=cur)
    os.write(fd, b"h" * (3 * MIB))
    os.close(fd)
    os.close(cur)


def records_and_links(folder: Path) -> None:
    """Its own records count too; a link counts as itself, never what it points to."""
    (folder / "output.log").write_bytes(b"l" * (3 * MIB))
    (folder / "etc").symlink_to("/etc")


FILLS = [one_big_file, many_small_files_in_folders, deeper_than_retention_used_to_look]


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    r = make_rig(tmp_path / "home", job_folder_max=MIB, state_reserve_bytes=0)
    yield r
    r.close()


def running_with_folder(rig: Rig) -> tuple[int, Path]:
    job = rig.submit(max_retries=3)
    rig.step()
    view = rig.job(job)
    assert view.state is JobState.RUNNING and view.job_dir is not None
    folder = Path(view.job_dir)
    folder.mkdir(parents=True, exist_ok=True)  # the fake executor makes no folder
    return job, folder


@pytest.mark.parametrize("fill", [*FILLS, records_and_links])
def test_a_running_job_over_its_folder_limit_is_stopped_and_fails_saying_so(
    rig: Rig, fill: Callable[[Path], None]
) -> None:
    job, folder = running_with_folder(rig)
    fill(folder)
    asked = DiskWatch(rig.settings, clock=rig.clock).step()
    assert list(asked) == [job]
    assert asked[job].startswith("its folder holds ") and "over the 1M per-job limit" in asked[job]
    rig.step(2)  # the stop sent (the fake job ends at once), then its end recorded
    view = rig.job(job)
    assert view.state is JobState.FAILED and view.stop_request == StopRequest.QUOTA.value
    assert view.reason.startswith(asked[job] + " (SIGTERM, SIGKILL after 1s)")
    assert view.attempt == 1 and len(view.attempts) == 1  # no retry: it would be over again
    assert any(f"{asked[job]}; stopping it" == why for _, _, why in view.events)


def test_a_job_within_its_limit_or_without_one_runs_on(tmp_path: Path) -> None:
    for limit in (8 * MIB, None):
        r = make_rig(tmp_path / str(limit), job_folder_max=limit or "unlimited")
        try:
            job, folder = running_with_folder(r)
            one_big_file(folder)
            assert DiskWatch(r.settings, clock=r.clock).step() == {}
            r.step()
            assert r.job(job).state is JobState.RUNNING
        finally:
            r.close()


def test_a_job_being_cancelled_is_not_asked_again(rig: Rig) -> None:
    job, folder = running_with_folder(rig)
    one_big_file(folder)
    rig.cancel(job)
    assert DiskWatch(rig.settings, clock=rig.clock).step() == {}
    rig.step(2)
    assert rig.job(job).state is JobState.CANCELLED


# ---- a live daemon ---------------------------------------------------------------------------


def test_a_job_writing_past_a_tiny_limit_is_stopped_by_the_daemon(
    make_daemon: Callable[..., Daemon],
) -> None:
    d = make_daemon("--fake-gpus", "1", "--grace", "1s", "--job-folder-max", "1M")
    c = d.client()
    write = 'head -c 3M /dev/zero > "$DDPQ_JOB_DIR/ckpt.pt"; sleep 300'
    job = c.submit(JobSubmit(command=["sh", "-c", write], retries=2))
    done = wait_done(c, job.id, 60)
    assert done.state == "failed", done.reason
    assert done.reason.startswith("its folder holds 3M, over the 1M per-job limit"), done.reason
    assert len(done.attempts) == 1
    small = c.submit(JobSubmit(command=["sh", "-c", "echo fits"]))
    assert wait_done(c, small.id).state == "succeeded"
