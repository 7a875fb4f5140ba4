"""The built-in ResNet18 workload through ddpq: progress shown, a retry resumes."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ddpq.executors.local import procs
from ddpq.schemas import JobSubmit
from tests.helpers import Daemon, wait_done, wait_for, wait_state
from tests.workload.runs import NARROW, signal_mask

pytestmark = pytest.mark.torch
pytest.importorskip("torch")

# The ImageNet stem: on 32x32 images a step costs a sixteenth of the CIFAR stem's, and these
# tests are about ddpq (progress, retries, preemption), not the model.
TINY = ["--synthetic", "192", "--batch-size", "16", "--stem", "imagenet"]
TINY += ["--max-steps-per-epoch", "3"]
# The progress test runs the published network; the others the narrow one
# (tests/workload/runs.NARROW). Where a preemption must land while the job trains, the test
# holds the ranks still (SIGSTOP) until the daemon's signal waits at each of them: the run
# need not last long enough for the signal on any machine, and costs what it trains.


def ranks_of(job_dir: Path) -> list[int]:
    """The job's training ranks (not torchrun's agent), found by its environment."""
    marker = f"DDPQ_JOB_DIR={job_dir}".encode()
    cmdlines = {p: Path(f"/proc/{p}/cmdline").read_bytes() for p in procs.marked_with(marker, 0)}
    return [
        p
        for p, cmd in cmdlines.items()
        if b"ddpq.workloads.resnet18" in cmd and b"torch.distributed.run" not in cmd
    ]


def waiting_signal(pid: int, number: signal.Signals) -> bool:
    """Whether ``number`` was sent to ``pid`` and waits there (a stopped process takes it
    once it continues)."""
    return bool(signal_mask(pid, "SigPnd", "ShdPnd") & 1 << (number - 1))


@contextlib.contextmanager
def held_still(pids: list[int]) -> Iterator[list[int]]:
    """``pids`` stopped for the block, continued after it whatever happens in it."""
    assert pids, "no training rank found"
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield pids
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


def preempted_while_held(job_dir: Path, preempt: Callable[[], object]) -> None:
    """``preempt()`` (what makes the daemon preempt the job) with the ranks held still until
    its signal waits at each: they take it at their next meeting, within the epoch."""
    with held_still(ranks_of(job_dir)) as ranks:
        preempt()
        wait_for(
            lambda: all(waiting_signal(p, signal.SIGUSR1) for p in ranks),
            timeout=120,
            what="the preemption signal at each rank",
        )


def step_after(saved: dict[str, int]) -> tuple[int, int]:
    """The step after the saved one (the next epoch's first when it saved at an epoch's end)."""
    if saved["step"] == saved["steps"]:
        return saved["epoch"] + 1, 1
    return saved["epoch"], saved["step"] + 1


def test_resnet18_under_ddpq_reports_progress(daemon: Daemon) -> None:
    c = daemon.client()
    job = c.submit(JobSubmit(workload="resnet18", args=[*TINY, "--epochs", "2"], gpus=2))
    assert job.launcher == "torchrun"
    done = wait_done(c, job.id, timeout=240)
    assert done.state == "succeeded", c.log_tail(job.id).decode()
    assert done.progress is not None
    assert done.progress["epoch"] == 2 and done.progress["epochs"] == 2
    assert 0.0 <= done.progress["test_acc"] <= 1.0
    shown = daemon.cli("ls", "--all").stdout
    assert "epoch 2/2" in shown and "acc" in shown
    # The daemon's validation of workload arguments (through the workload's parser): a
    # usage error, said as the workload's own option.
    bad = daemon.cli("submit", "resnet18", "--gpus", "2", "--epochs", "zero", check=False)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert bad.stderr.startswith("ddpq: resnet18: argument --epochs"), bad.stderr


# Two attempts in a row, each waited on with its own deadline: the session-wide
# pytest-timeout (300 s) would cut them short on a loaded 2-core box.
@pytest.mark.timeout(900)
def test_killed_job_is_retried_and_resumes_from_its_checkpoint(
    make_daemon: Callable[..., Daemon],
) -> None:
    d = make_daemon("--fake-gpus", "2", "--grace", "2s")
    c = d.client()
    # Six epochs of 12 steps on the narrow network: the kill lands after the first epoch's
    # checkpoint with five epochs (seconds) still to go.
    args = [*TINY, *NARROW, "--synthetic", "384", "--max-steps-per-epoch", "12", "--epochs", "6"]
    job = c.submit(JobSubmit(workload="resnet18", args=args, gpus=2, retries=1))
    running = wait_state(c, job.id, "running", timeout=60)
    assert running.job_dir is not None
    job_dir = Path(running.job_dir)
    checkpoint = job_dir / "checkpoint.pt"
    wait_for(checkpoint.exists, timeout=240, what="the first checkpoint")
    # Kill one rank: torchrun fails the job, and ddpq retries it.
    ranks = ranks_of(job_dir)
    assert ranks, "no training rank found"
    os.kill(ranks[0], signal.SIGKILL)
    done = wait_done(c, job.id, timeout=400)
    assert done.state == "succeeded", c.log_tail(job.id).decode()
    assert [a.state for a in done.attempts] == ["failed", "succeeded"]
    log = c.log_tail(job.id, 256 * 1024).decode()
    assert "resuming from checkpoint" in log
    records = [json.loads(x) for x in (job_dir / "metrics.jsonl").read_text().splitlines()]
    epochs = [r["epoch"] for r in records if r.get("phase") == "epoch"]
    # The second attempt continued after the checkpointed epoch instead of starting over.
    assert epochs.count(1) == 1 and epochs[-1] == 6


# Two trainings in a row, each waited on with its own deadline: the session-wide
# pytest-timeout (300 s) would cut them short on a loaded 2-core box.
@pytest.mark.timeout(900)
def test_a_preempted_resnet18_resumes_at_its_step_and_finishes(
    make_daemon: Callable[..., Daemon],
) -> None:
    """Through ddpq, as a lab would: a higher-priority job submitted with the CLI preempts
    it mid-epoch (the LAS policy, guards lowered for the test); it is requeued without a
    retry, resumes at the step it saved, and ends. That it ends with the loss of an
    uninterrupted run is checked without the daemon, on the same save and resume
    (tests/workload/test_preemption.py): here a third training would only repeat it."""
    d = make_daemon("--fake-gpus", "2", "--preempt-grace", "30s", "--preempt-min-run", "0s")
    c = d.client()
    # Three epochs of twelve steps (384 images, 16 a rank): the urgent job, submitted at the
    # first epoch's first record (after its first step) with the ranks held still, lands
    # mid-epoch or at the first epoch's end (both are checked below): the ranks meet at the
    # latest at an epoch's end, and hear the preemption there.
    args = [*TINY, *NARROW, "--synthetic", "384", "--max-steps-per-epoch", "12", "--epochs", "3"]
    job = c.submit(JobSubmit(workload="resnet18", args=args, gpus=2, preemptible=True))
    running = wait_state(c, job.id, "running", timeout=60)
    metrics = Path(str(running.job_dir)) / "metrics.jsonl"

    def first_epoch_begun() -> bool:
        lines = metrics.read_text().splitlines() if metrics.exists() else []
        steps = [json.loads(x) for x in lines if '"phase": "train"' in x]
        return any(r.get("epoch") == 1 for r in steps)

    wait_for(first_epoch_begun, timeout=240, what="the first epoch's first record")
    urgent = 0

    def submit_urgent() -> None:
        nonlocal urgent
        urgent = int(d.cli("submit", "--priority", "5", "--gpus", "2", "--", "true").stdout)

    preempted_while_held(Path(str(running.job_dir)), submit_urgent)
    assert wait_done(c, urgent, timeout=120).state == "succeeded"
    done = wait_done(c, job.id, timeout=400)
    assert done.preemptions == 1 and done.attempts[0].reason.startswith(
        f"preempted for job {urgent}"
    ), done.attempts[0].reason
    assert done.state == "succeeded", c.log_tail(job.id).decode()
    assert [a.state for a in done.attempts] == ["preempted", "succeeded"]
    assert done.attempts[0].reason.endswith("checkpointed")  # torchrun exits 1: the record says
    records = [json.loads(x) for x in metrics.read_text().splitlines()]
    saved = next(r for r in records if r.get("preempted"))
    resumed = next(r for r in records if r.get("attempt") == 2)  # its first step's record
    assert (resumed["epoch"], resumed["step"]) == step_after(saved)
    assert done.progress is not None and done.progress["epoch"] == 3


# One training in two attempts, on 1 rank then 2.
@pytest.mark.timeout(900)
def test_an_elastic_resnet18_grows_from_1_to_2_gpus_and_resumes_at_the_next_step(
    make_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    """Through ddpq, as docs/elastic.md says of `--gpus 2-4`, on the smallest range (the
    count is not the point, and every rank is a torch process of ~3 s of CPU to start):
    `--gpus 1-2` starts on the GPU a blocker leaves, grows to 2 at a checkpoint when the
    blocker ends, and resumes at the step after the one it saved with the per-rank batch
    halved. That a resumed run trains as one that had the larger world all along is checked
    without the daemon, on the same resume path (tests/workload/test_resize_runs.py)."""
    d = make_daemon("--fake-gpus", "2", "--preempt-min-run", "0s", "--preempt-grace", "60s")
    c = d.client()
    flag = tmp_path / "blocker-may-end"
    wait_file = f"while [ ! -e {flag} ]; do sleep 0.1; done"
    blocker = c.submit(JobSubmit(command=["sh", "-c", wait_file], gpus=1))
    wait_state(c, blocker.id, "running", timeout=60)
    # The grow lands mid-run: the rank is held still until the daemon's signal waits at it.
    recipe = ["--synthetic", "400", "--stem", "imagenet", "--max-steps-per-epoch", "12"]
    args = [*recipe, *NARROW, "--epochs", "3", "--batch-size", "8"]
    job = c.submit(JobSubmit(workload="resnet18", args=args, gpus=1, gpus_max=2))
    running = wait_state(c, job.id, "running", timeout=60)
    assert len(running.attempts[0].gpus) == 1
    metrics = Path(str(running.job_dir)) / "metrics.jsonl"

    def stepped() -> bool:
        return metrics.exists() and '"phase": "train"' in metrics.read_text()

    wait_for(stepped, timeout=240, what="the first steps on 1 GPU")
    # The blocker ends: a GPU free, nobody waits for it.
    preempted_while_held(Path(str(running.job_dir)), flag.touch)
    done = wait_done(c, job.id, timeout=600)
    assert done.state == "succeeded", c.log_tail(job.id).decode()
    assert [len(a.gpus) for a in done.attempts] == [1, 2]
    assert done.attempts[0].reason == "growing to 2 GPUs: checkpointed"
    log = c.log_tail(job.id, 256 * 1024).decode()
    assert "resumed on 2 ranks from a checkpoint of 1: per-rank batch 8 → 4, lr unchanged" in log
    records = [json.loads(x) for x in metrics.read_text().splitlines()]
    saved = next(r for r in records if r.get("preempted"))
    resumed = next(r for r in records if r.get("attempt") == 2)  # its first step's record
    assert (resumed["epoch"], resumed["step"]) == step_after(saved)  # none twice, none lost
    assert done.progress is not None and done.progress["epoch"] == 3
