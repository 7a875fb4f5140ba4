"""Preemption of the built-in workload (docs/preemption.md): checkpoint at a step all ranks
agree on, exit 75, resume at that step, end exactly where an uninterrupted run ends.

As ddpq runs it: torchrun started with the preemption signal ignored, the signal sent to the
ranks (torchrun starts each in a session of its own, so its group's signal misses them). The
whole-run tests wait on metrics.jsonl records and /proc, never on a fixed sleep.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytestmark = pytest.mark.torch

import torch  # noqa: E402

from ddpq.workloads import preemption, resize  # noqa: E402
from ddpq.workloads import resnet18 as workload  # noqa: E402
from tests.workload.runs import (  # noqa: E402
    NARROW,
    PREEMPTIBLE,
    RUN_TIMEOUT_S,
    finish,
    kill_job,
    positions,
    records,
    run,
    run_ranks,
    signal_mask,
    signal_ranks,
    start,
    wait_for,
)

# The narrow network's steps are ~0.03 s on a CPU: 40 of them leave the preemption, sent
# after the second, over a second to land inside the first epoch.
STEPS = 40


def load(path: Path) -> dict[str, Any]:
    state: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=True)
    return state


def results(recs: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    keys = ("epoch", "train_loss", "train_acc", "test_loss", "test_acc")
    return [tuple(r[k] for k in keys) for r in recs if r["phase"] == "epoch"]


# Two trainings and a resume, each with its own deadline: more than the session's 300 s
# on a loaded 2-core box.
@pytest.mark.timeout(900)
def test_preempted_mid_epoch_resumes_at_that_step_with_the_same_result(tmp_path: Path) -> None:
    args = ["--synthetic", str(16 * STEPS), "--batch-size", "8"]
    args += ["--max-steps-per-epoch", str(STEPS), "--epochs", "2", "--seed", "5"]
    args += ["--deterministic", *NARROW]

    # The reference: the same seed, never interrupted, not even preemptible.
    ref = tmp_path / "ref"
    code, out = run_ranks(args, ref, nproc=2)
    assert code == 0, out

    job = tmp_path / "job"
    log = tmp_path / "job.log"
    proc = start(args, job, 2, log, {**PREEMPTIBLE, "DDPQ_ATTEMPT": "1"}, signal.SIGUSR1)
    try:
        # Some steps of epoch 1 are logged: set-up is over, the ranks' handlers are in place.
        wait_for(lambda: (1, 2) in positions(records(job)), RUN_TIMEOUT_S, proc)
        assert len(signal_ranks(proc, signal.SIGUSR1)) == 2
        code = finish(proc, timeout=60)
    finally:
        kill_job(proc, signal.SIGKILL)
    first = log.read_text(errors="replace")
    assert code != 0, first  # torchrun reports its ranks' non-zero exits as its own failure
    # Both ranks exited 75 (torchrun's summary lists each failed rank's status).
    assert first.count("exitcode  : 75 ") == 2, first
    state = load(job / "checkpoint.pt")
    k = state["step"]
    assert (state["epoch"], state["reason"], state["attempt"]) == (0, "preempted", 1)
    assert 2 <= k < STEPS, "the preemption should land inside epoch 1"
    assert f"preempted (SIGUSR1): saved epoch 1/2 step {k}/{STEPS} to " in first, first
    # One step, agreed: both ranks' own states are of that step.
    assert [(r["rank"], r["step"]) for r in state["ranks"]] == [(0, k), (1, k)]
    before = records(job)
    assert before[-1]["preempted"] is True and (before[-1]["epoch"], before[-1]["step"]) == (1, k)
    assert positions(before) == [(1, s) for s in range(1, k + 1)]

    code, second = run(args, job, nproc=2, env={**PREEMPTIBLE, "DDPQ_ATTEMPT": "2"})
    assert code == 0, second
    assert f"continuing at epoch 1/2 step {k + 1}/{STEPS}" in second, second
    after = records(job)[len(before) :]
    assert {r["attempt"] for r in before} == {1} and {r["attempt"] for r in after} == {2}
    # The step count goes on from the saved step: none repeated, none skipped.
    every_step = [(e, s) for e in (1, 2) for s in range(1, STEPS + 1)]
    assert positions(before + after) == every_step
    # ...cumulative over the whole epoch, then bit-identical to the uninterrupted run.
    assert results(after) == results(records(ref))
    final, reference = load(job / "checkpoint.pt"), load(ref / "checkpoint.pt")
    assert (final["epoch"], final["step"]) == (reference["epoch"], reference["step"]) == (2, 0)
    for name, tensor in reference["model"].items():
        assert torch.equal(final["model"][name], tensor), name


def test_a_signal_during_set_up_requeues_without_saving(tmp_path: Path) -> None:
    """Sent as soon as the process catches it: while it still imports torch (the module
    catches it before that import) or builds the model; never lost, never a crash."""
    job = tmp_path / "job"
    log = tmp_path / "job.log"
    args = ["--synthetic", "40", "--batch-size", "8", "--epochs", "1", *NARROW]
    proc = start(args, job, None, log, {**PREEMPTIBLE, "DDPQ_REQUEUE_EXIT": "76"})
    try:
        usr1 = 1 << (signal.SIGUSR1 - 1)
        wait_for(lambda: bool(signal_mask(proc.pid, "SigCgt") & usr1), RUN_TIMEOUT_S, proc)
        proc.send_signal(signal.SIGUSR1)
        code = finish(proc, timeout=60)
    finally:
        kill_job(proc, signal.SIGKILL)
    out = log.read_text(errors="replace")
    assert code == 76, out  # $DDPQ_REQUEUE_EXIT, when ddpq sets one
    assert "preempted (SIGUSR1) during set-up, before any step: nothing to save" in out, out
    assert not (job / "checkpoint.pt").exists()
    assert positions(records(job)) == []


@pytest.fixture
def in_process(alone: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """main() run in this process (the `alone` fixture), in a preemptible job's environment;
    the job's folder."""
    monkeypatch.setenv("DDPQ_JOB_DIR", str(tmp_path / "job"))
    for name, value in PREEMPTIBLE.items():
        monkeypatch.setenv(name, value)
    return tmp_path / "job"


def signal_during_evaluation(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Raise SIGUSR1 at the start of every evaluation; returns one entry per evaluation."""
    original = workload.Trainer.evaluate
    came: list[int] = []

    def evaluate(self: workload.Trainer) -> dict[str, Any]:
        came.append(len(came) + 1)
        signal.raise_signal(signal.SIGUSR1)
        return original(self)

    monkeypatch.setattr(workload.Trainer, "evaluate", evaluate)
    return came


def test_a_signal_during_evaluation_saves_that_epoch_end(
    in_process: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    job = in_process
    args = ["--synthetic", "40", "--batch-size", "8", "--max-steps-per-epoch", "2", *NARROW]
    args += ["--checkpoint-every", "5"]  # no epoch checkpoint is due: the preemption saves
    came = signal_during_evaluation(monkeypatch)
    assert workload.main([*args, "--epochs", "3"]) == workload.EXIT_REQUEUE == 75
    assert came == [1]
    state = load(job / "checkpoint.pt")
    assert (state["epoch"], state["step"], state["reason"]) == (1, 0, "preempted")
    assert state["ranks"] is None  # at an epoch's end every rank holds the same state
    assert "preempted (SIGUSR1): saved the end of epoch 1/3 to" in capsys.readouterr().out
    assert positions(records(job)) == [(1, 1), (1, 2)]
    # The epoch's record, once, says it was saved: under torchrun (exit status 1, not 75) it
    # is what tells ddpq the job checkpointed.
    epoch_end = [r for r in records(job) if r["phase"] == "epoch"]
    assert len(epoch_end) == 1 and epoch_end[0]["preempted"] is True

    # Resumed, and signalled again in the evaluation of the last epoch: it finishes instead.
    monkeypatch.setenv("DDPQ_ATTEMPT", "2")
    assert workload.main([*args, "--epochs", "2"]) == workload.EXIT_OK
    out = capsys.readouterr().out
    assert "continuing at epoch 2/2" in out and "after the last epoch's training" in out
    assert came == [1, 2]
    assert positions(records(job)) == [(1, 1), (1, 2), (2, 1), (2, 2)]
    assert load(job / "checkpoint.pt")["epoch"] == 2


def test_format_1_checkpoints_still_load(tmp_path: Path) -> None:
    """Written before mid-epoch checkpoints: epoch boundaries only, torch's RNG state only."""
    path = tmp_path / "checkpoint.pt"
    old = {"format": 1, "epoch": 3, "model": {}, "optimizer": {}, "stem": "imagenet"}
    old["rng"] = {"torch": torch.get_rng_state(), "cuda": None}
    torch.save(old, path)
    state = workload.load_checkpoint(path)
    assert (state["format"], state["epoch"], state["step"], state["ranks"]) == (2, 3, 0, None)
    workload.restore_rng(state["rng"], torch.device("cpu"))  # python/numpy absent: left alone
    torch.save({**old, "format": 3}, path)
    with pytest.raises(workload.WorkloadError, match=r"format 1 or 2"):
        workload.load_checkpoint(path)


def test_a_mid_epoch_checkpoint_of_another_recipe_restarts_that_epoch() -> None:
    """Another seed, data set or batch cannot skip the same images; another number of ranks
    can (tests/workload/test_resize.py)."""
    data = {"seed": 1, "world_size": 2, "batch": 8, "steps": 6, "train_size": 100, "step": 4}

    def recipe_for(batch: int) -> Callable[[int], resize.Recipe]:
        return lambda world: resize.Recipe.fresh(100, world, batch, 10)

    same = resize.resume_plan(data, 4, recipe_for(8), 1, 100, 2)
    assert same.span == resize.EpochSpan(first=4, steps=6, origin=0) and same.note == ""
    assert same.resized_from is None
    other = resize.resume_plan(data, 4, recipe_for(16), 1, 100, 2)
    assert other.span is None and other.split == resize.Split(2, 16, 3)
    assert "global batch 16 (now 32)" in other.note and "restarts at its first step" in other.note
    reseeded = resize.resume_plan(data, 4, recipe_for(8), 2, 100, 2)
    assert reseeded.span is None and "seed 1 (now 2)" in reseeded.note


def test_the_environment_is_read_strictly() -> None:
    read = preemption.from_environ
    assert read({}) == preemption.PreemptConfig(None, None, 75, None)
    cfg = read({"DDPQ_PREEMPT_SIGNAL": "usr2", "DDPQ_PREEMPT_GRACE": "30", "DDPQ_ATTEMPT": "3"})
    assert cfg == preemption.PreemptConfig(signal.SIGUSR2, 30.0, 75, 3)
    assert read({"DDPQ_PREEMPT_SIGNAL": "SIGHUP"}).signal == signal.SIGHUP
    assert read({"DDPQ_PREEMPT_SIGNAL": "TERM", "DDPQ_REQUEUE_EXIT": "99"}).requeue_exit == 99
    for bad in (
        {"DDPQ_PREEMPT_SIGNAL": "KILL"},  # cannot be caught
        {"DDPQ_PREEMPT_SIGNAL": "10"},
        {"DDPQ_PREEMPT_GRACE": "30s"},
        {"DDPQ_PREEMPT_GRACE": "-1"},
        {"DDPQ_PREEMPT_GRACE": "nan"},
        {"DDPQ_REQUEUE_EXIT": "0"},
        {"DDPQ_REQUEUE_EXIT": "256"},
    ):
        with pytest.raises(preemption.PreemptEnvError, match=next(iter(bad))):
            read(bad)


def test_a_bad_preemption_signal_is_one_line_and_exit_2(tmp_path: Path) -> None:
    code, out = run(["--synthetic", "40"], tmp_path / "job", env={"DDPQ_PREEMPT_SIGNAL": "STOP"})
    assert code == workload.EXIT_USAGE, out
    assert out.strip().splitlines() == [
        "resnet18: error: DDPQ_PREEMPT_SIGNAL='STOP': not one of USR1, USR2, INT, HUP, TERM"
    ]


def test_a_signal_before_the_handler_is_remembered(monkeypatch: pytest.MonkeyPatch) -> None:
    """What runs before `import torch` when the module is the program."""
    previous = signal.getsignal(signal.SIGUSR2)
    monkeypatch.setattr(preemption, "_early", [])
    try:
        preemption.catch_early({"DDPQ_PREEMPT_SIGNAL": "USR2"})
        assert not preemption.came_early()
        signal.raise_signal(signal.SIGUSR2)
        assert preemption.came_early()
        stop = workload.StopRequest()
        stop.catch_preemption(signal.SIGUSR2)
        assert stop.preempt  # carried over to the workload's own handler
        stop.uninstall()
        assert signal.getsignal(signal.SIGUSR2) == preemption._note_early
    finally:
        signal.signal(signal.SIGUSR2, previous)
    preemption.catch_early({"DDPQ_PREEMPT_SIGNAL": "bogus"})  # left for main() to report
    assert signal.getsignal(signal.SIGUSR2) == previous
