"""The Slurm executor's decisions, against a Slurm double: what it asks Slurm, when an
attempt has ended and how, what it does when Slurm is slow, forgets a job, or refuses one."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ddpq.config import Settings
from ddpq.executors.accounts import Account
from ddpq.executors.base import KILL_SLACK_S, Launch, LaunchFailed
from ddpq.executors.slurm import executor as slurm_executor
from ddpq.executors.slurm import states, submit
from ddpq.executors.slurm.commands import SlurmError
from ddpq.executors.slurm.executor import SlurmExecutor
from ddpq.executors.slurm.states import SlurmJob
from ddpq.jobdir import JobDir
from tests import launches


@dataclass
class FakeSlurm:
    """Slurm as the executor sees it: jobs by id, and every call made."""

    jobs: dict[str, SlurmJob] = field(default_factory=dict)
    scripts: dict[str, str] = field(default_factory=dict)
    envs: dict[str, Mapping[str, str]] = field(default_factory=dict)
    calls: list[tuple[str, ...]] = field(default_factory=list)
    purged: set[str] = field(default_factory=set)  # ended long ago: squeue forgot them
    accounts: dict[str, SlurmJob] | None = None  # sacct's; None: no accounting
    down: str | None = None  # squeue fails with this
    refuse: str | None = None  # sbatch fails with this
    answer: str | None = None  # sbatch (its environment's library) names this job instead
    next_id: int = 100

    def submit_held(self, script: str, env: Mapping[str, str], account: Account | None) -> str:
        self.calls.append(("sbatch",))
        if self.refuse:
            raise SlurmError(self.refuse)
        job_id = str(self.next_id)
        self.next_id += 1
        self.jobs[job_id] = SlurmJob(job_id, "PENDING", states.HELD)
        self.scripts[job_id], self.envs[job_id] = script, env
        return self.answer or job_id

    def release(self, job_ids: Sequence[str]) -> None:
        self.calls.append(("release", *job_ids))
        for i in job_ids:
            if self.jobs[i].reason == states.HELD:
                self.jobs[i] = dataclasses.replace(self.jobs[i], reason="")

    def cancel(self, job_ids: Sequence[str], *, signal: str | None = None) -> None:
        self.calls.append(("scancel", *([f"--signal={signal}"] if signal else []), *job_ids))
        for i in job_ids:
            if signal is None:
                self.set(i, "CANCELLED")
            elif self.jobs[i].state != "RUNNING":
                raise SlurmError("scancel: error: Job is pending execution")

    def queue(self, job_ids: Sequence[str]) -> dict[str, SlurmJob]:
        self.calls.append(("squeue",))
        if self.down:
            raise SlurmError(self.down)
        return {i: self.jobs[i] for i in job_ids if i in self.jobs and i not in self.purged}

    def accounting(self, job_ids: Sequence[str]) -> dict[str, SlurmJob] | None:
        self.calls.append(("sacct",))
        if self.accounts is None:
            return None
        return {i: self.accounts[i] for i in job_ids if i in self.accounts}

    def find(self, name: str, comment: str) -> list[str]:
        self.calls.append(("find", name))
        return [i for i, text in self.scripts.items() if f"--comment={comment}\n" in text]

    def set(self, job_id: str, state: str, reason: str = "", nodes: str = "") -> None:
        self.jobs[job_id] = SlurmJob(job_id, state, reason, 1.0, 2.0, nodes)

    def made(self, name: str) -> list[tuple[str, ...]]:
        return [c for c in self.calls if c[0] == name]


class Clock:
    """Moves on a second at each look: every ended() call may ask Slurm."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


@pytest.fixture
def slurm() -> FakeSlurm:
    return FakeSlurm()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def executor(tmp_path: Path, slurm: FakeSlurm, clock: Clock) -> SlurmExecutor:
    return SlurmExecutor(Settings(home=tmp_path, grace_s=3), slurm, gpus=8, clock=clock)


def a_launch(tmp_path: Path, job_id: int = 1, attempt: int = 1, **kw: object) -> Launch:
    fields: dict[str, object] = {
        "job_id": job_id,
        "attempt": attempt,
        "command": ["python", "train.py"],
        "launcher": "plain",
        "gpus": (0, 1),
        "port": 29600 + job_id,
        "cwd": str(tmp_path),
        "env": {"LR": "0.1"},
        "owner": "alice",
        "unix_account": None,
    }
    return launches.a_launch(tmp_path / "jobs" / str(job_id), **{**fields, **kw})


def write_record(launch: Launch, exit_code: int | None, signal: int | None = None) -> None:
    record: dict[str, object] = {"exit_code": exit_code, "signal": signal, "attempt": "1"}
    record.update(started_at=1.0, ended_at=2.0, attempt=str(launch.attempt))
    JobDir(launch.job_dir).exit_record.write_text(json.dumps(record))


def test_an_attempt_is_submitted_held_and_released_only_when_told(
    executor: SlurmExecutor, slurm: FakeSlurm, tmp_path: Path
) -> None:
    one, two = a_launch(tmp_path, 1), a_launch(tmp_path, 2)
    handles = [executor.start(one), executor.start(two)]
    assert handles == ["100", "101"] and not slurm.made("release")
    folder = JobDir(one.job_dir)
    assert folder.sbatch_script.read_text() == slurm.scripts["100"]
    assert folder.log.read_text().startswith("[ddpq] attempt started ")
    assert "port 29601" in folder.log.read_text().splitlines()[0]
    executor.proceed([1, 2])
    assert slurm.made("release") == [("release", "100", "101")]  # one call for both
    assert executor.ended() == []
    assert slurm.made("squeue") == [("squeue",)]


def test_the_jobs_environment(executor: SlurmExecutor, slurm: FakeSlurm, tmp_path: Path) -> None:
    gpu = a_launch(tmp_path, 1, env={"LR": "0.1", "SBATCH_PARTITION": "other", "SLURM_X": "1"})
    executor.start(gpu)
    env = slurm.envs["100"]
    assert env["LR"] == "0.1" and env["DDPQ_ATTEMPT"] == "1" and env["MASTER_PORT"] == "29601"
    assert env["DDPQ_JOB_DIR"] == str(gpu.job_dir)
    # Slurm sets the devices; the job may not steer Slurm's own commands.
    assert "CUDA_VISIBLE_DEVICES" not in env and "OMP_NUM_THREADS" not in env
    assert "SBATCH_PARTITION" not in env and "SLURM_X" not in env
    assert "SBATCH_PARTITION" in JobDir(gpu.job_dir).log.read_text()
    executor.start(a_launch(tmp_path, 2, gpus=(), env={"OMP_NUM_THREADS": "3"}))
    assert (
        slurm.envs["101"]["CUDA_VISIBLE_DEVICES"] == ""
        and slurm.envs["101"]["OMP_NUM_THREADS"] == "3"
    )


def test_an_end_is_the_shims_record(
    executor: SlurmExecutor, slurm: FakeSlurm, tmp_path: Path
) -> None:
    launch = a_launch(tmp_path)
    executor.start(launch)
    executor.proceed([1])
    slurm.set("100", "RUNNING", nodes="n1")
    assert executor.ended() == []
    slurm.set("100", "COMPLETING")  # Slurm still kills what is left: not over
    write_record(launch, 3)
    assert executor.ended() == []
    slurm.set("100", "COMPLETED")
    (ended,) = executor.ended()
    assert (ended.job_id, ended.attempt, ended.record.exit_code) == (1, 1, 3)
    assert executor.ended() == [] and not executor.stop(1)  # no longer watched


def test_without_a_record_slurm_says_how_it_ended(
    executor: SlurmExecutor, slurm: FakeSlurm, clock: Clock, tmp_path: Path
) -> None:
    executor.start(a_launch(tmp_path))
    executor.proceed([1])
    slurm.set("100", "NODE_FAIL")
    JobDir(a_launch(tmp_path).job_dir).slurm_output.write_text("slurmstepd: error: node n1 died\n")
    assert executor.ended() == []  # the shim may still be writing its record
    clock.now += slurm_executor.RECORD_GRACE_S
    (ended,) = executor.ended()
    assert ended.record.error is not None
    assert ended.record.error.startswith("lost: a node of Slurm job 100 failed")
    assert ended.record.error.endswith("Slurm's output ends: slurmstepd: error: node n1 died")


def test_a_completed_job_waits_a_while_for_its_record(
    executor: SlurmExecutor, slurm: FakeSlurm, clock: Clock, tmp_path: Path
) -> None:
    """On a shared filesystem the record may show here some seconds after Slurm's word."""
    launch = a_launch(tmp_path)
    executor.start(launch)
    executor.proceed([1])
    slurm.set("100", "COMPLETED")
    assert executor.ended() == []
    write_record(launch, 0)
    (ended,) = executor.ended()
    assert ended.record.exit_code == 0 and ended.record.error is None
    executor.start(a_launch(tmp_path, 2))
    executor.proceed([2])
    slurm.set("101", "COMPLETED")
    assert executor.ended() == []
    clock.now += slurm_executor.RECORD_WAIT_S
    (lost,) = executor.ended()
    assert lost.record.error is not None and "never appeared" in lost.record.error


def test_no_answer_from_slurm_ends_nothing(
    executor: SlurmExecutor, slurm: FakeSlurm, tmp_path: Path
) -> None:
    executor.start(a_launch(tmp_path))
    executor.proceed([1])
    slurm.purged.add("100")
    slurm.down = "squeue: error: Unable to contact slurm controller (connect failure)"
    assert executor.ended() == [] and executor.ended() == []
    slurm.down = None
    (ended,) = executor.ended()
    assert ended.record.error is not None and ended.record.error.startswith("lost: ")


def test_a_job_gone_from_squeue_is_asked_of_sacct(
    executor: SlurmExecutor, slurm: FakeSlurm, tmp_path: Path
) -> None:
    for i in (1, 2, 3):
        executor.start(a_launch(tmp_path, i))
    executor.proceed([1, 2, 3])
    slurm.purged.update({"100", "101", "102"})
    slurm.accounts = {
        "100": SlurmJob("100", "FAILED", "NonZeroExitCode", exit_code=2),
        "101": SlurmJob("101", "RUNNING", ""),  # sacct ahead of squeue: wait for it
    }
    ended = {e.job_id: e.record for e in executor.ended()}
    assert slurm.made("sacct") == [("sacct",)]  # one call for all three
    assert sorted(ended) == [1, 3]
    assert ended[1].exit_code == 2
    assert ended[3].error is not None and ended[3].error.startswith("lost: Slurm no longer knows")


def test_an_abandoned_attempt_is_cancelled_and_never_ran(
    executor: SlurmExecutor, slurm: FakeSlurm, tmp_path: Path
) -> None:
    executor.start(a_launch(tmp_path))
    executor.abandon([1])
    assert slurm.made("scancel") == [("scancel", "100")] and not slurm.made("release")
    (ended,) = executor.ended()
    assert not ended.record.launched


def test_stop_signals_the_batch_step_then_cancels_after_the_grace(
    executor: SlurmExecutor, slurm: FakeSlurm, clock: Clock, tmp_path: Path
) -> None:
    executor.start(a_launch(tmp_path))
    executor.proceed([1])
    slurm.set("100", "RUNNING", nodes="n1")
    executor.ended()
    assert executor.stop(1)
    assert slurm.made("scancel") == [("scancel", "--signal=TERM", "100")]
    executor.ended()
    assert len(slurm.made("scancel")) == 1  # the shim has its grace period
    clock.now += 3 + KILL_SLACK_S
    executor.ended()
    assert slurm.made("scancel")[-1] == ("scancel", "100")


def test_stop_cancels_a_job_slurm_has_not_started(
    executor: SlurmExecutor, slurm: FakeSlurm, clock: Clock, tmp_path: Path
) -> None:
    executor.start(a_launch(tmp_path))
    executor.proceed([1])
    slurm.set("100", "PENDING", "Resources")
    executor.ended()
    assert executor.stop(1)
    assert slurm.made("scancel") == [("scancel", "100")]  # no signal to what does not run
    assert executor.ended() == []
    clock.now += slurm_executor.RECORD_GRACE_S
    (ended,) = executor.ended()
    assert ended.record.error == "Slurm job 100 was cancelled"


def test_why_slurm_keeps_a_job_waiting_is_told(
    executor: SlurmExecutor, slurm: FakeSlurm, tmp_path: Path
) -> None:
    executor.start(a_launch(tmp_path))
    executor.proceed([1])
    executor.ended()
    assert executor.waiting() == {}  # its release is not Slurm's reason
    for reason in ("Priority", "Resources", "Resources"):
        slurm.set("100", "PENDING", reason)
        executor.ended()
    assert executor.waiting() == {1: "waiting in Slurm: Resources"}
    slurm.set("100", "PENDING", "")  # a look between two of Slurm's passes: no reason
    executor.ended()
    assert executor.waiting() == {1: "waiting in Slurm: Resources"}  # not a start
    slurm.set("100", "RUNNING", nodes="n[1-2]")
    executor.ended()
    executor.ended()
    assert executor.waiting() == {}
    told = [
        line
        for line in JobDir(a_launch(tmp_path).job_dir).log.read_text().splitlines()
        if line.startswith("[ddpq] Slurm job")
    ]
    assert told == [
        "[ddpq] Slurm job 100 is waiting: Priority",
        "[ddpq] Slurm job 100 is waiting: Resources",
        "[ddpq] Slurm job 100 is running on n[1-2]",
    ]


def test_adopting_after_a_restart(
    tmp_path: Path, slurm: FakeSlurm, clock: Clock, executor: SlurmExecutor
) -> None:
    executor.start(a_launch(tmp_path, 1))
    executor.start(a_launch(tmp_path, 2))  # neither released: the worker died
    again = SlurmExecutor(Settings(home=tmp_path, grace_s=3), slurm, gpus=8, clock=clock)
    # Job 1's id was stored: it is released now. Job 2's was not: it never ran.
    assert again.adopt(1, 1, a_launch(tmp_path, 1).job_dir, "100") == "100"
    assert again.adopt(2, 1, a_launch(tmp_path, 2).job_dir, None) is None
    assert slurm.made("scancel") == [("scancel", "101")]
    assert again.ended() == []
    assert slurm.made("release") == [("release", "100")]
    # Another daemon's job of the same number is never taken for ours.
    other = SlurmExecutor(Settings(home=tmp_path / "other"), slurm, gpus=8, clock=clock)
    assert other.adopt(1, 1, a_launch(tmp_path, 1).job_dir, None) is None
    assert slurm.made("scancel") == [("scancel", "101")]


def test_a_job_slurm_refuses_fails_with_slurms_words(
    executor: SlurmExecutor, slurm: FakeSlurm, tmp_path: Path
) -> None:
    slurm.refuse = (
        "sbatch: error: Batch job submission failed: Invalid account or account/partition "
        "combination specified"
    )
    with pytest.raises(LaunchFailed, match="Invalid account"):
        executor.start(a_launch(tmp_path))
    assert slurm.made("find")  # in case sbatch queued it before failing


@pytest.mark.parametrize("named", ["4242", "99"])
def test_an_sbatch_that_names_another_job_is_not_believed(
    executor: SlurmExecutor, slurm: FakeSlurm, tmp_path: Path, named: str
) -> None:
    """sbatch runs with the job's environment (an LD_PRELOAD of its own): it answers
    another user's job (4242), or one that is not this attempt's (99). Root releases and
    cancels nothing but the job it gave sbatch, found by its name and comment."""
    slurm.jobs[named] = SlurmJob(named, "PENDING", states.HELD)  # someone else's, held
    slurm.answer = named
    with pytest.raises(
        LaunchFailed, match=f"sbatch answered Slurm job {named}, which is not"
    ) as failed:
        executor.start(a_launch(tmp_path))
    assert not failed.value.interrupted  # for good: the account's own sbatch lied
    acted_on = [c for c in slurm.calls if c[0] in ("release", "scancel")]
    assert acted_on == [("scancel", "100")]  # the attempt's own, held: never run
    assert slurm.jobs[named].reason == states.HELD


def test_a_lookup_that_fails_after_sbatch_queues_the_job_again(
    executor: SlurmExecutor, slurm: FakeSlurm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """squeue cannot say whether the id sbatch answered is this attempt's (a controller
    too busy): nothing ran, so the launch is interrupted (queued again, no retry used),
    not a failure for good."""

    def busy(name: str, comment: str) -> list[str]:
        raise SlurmError("squeue: error: Socket timed out on send/recv operation")

    monkeypatch.setattr(slurm, "find", busy)
    with pytest.raises(LaunchFailed, match="Socket timed out") as failed:
        executor.start(a_launch(tmp_path))
    assert failed.value.interrupted
    assert not slurm.made("release")


def test_never_submitted_as_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(submit, "account_for", lambda owner, mapped: Account("root", 0, 0, "/root"))
    settings = Settings(home=tmp_path, auth=True)
    with pytest.raises(LaunchFailed, match="never submits Slurm jobs as root"):
        submit.prepare(a_launch(tmp_path, unix_account="root"), settings)
