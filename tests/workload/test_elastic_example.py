"""The example of docs/elastic.md, run as ddpq runs an elastic job: under torchrun (started
with the preemption signal ignored) on 2 ranks, the signal sent to each rank, then again on
4 ranks with the same job folder."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import free_port
from tests.workload.runs import finish, job_env, kill_job, signal_ranks, wait_for

pytest.importorskip("torch")
pytestmark = pytest.mark.torch

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "tests" / "jobs" / "elastic_example.py"
DOC = ROOT / "docs" / "elastic.md"
PREEMPTIBLE = {"DDPQ_PREEMPT_SIGNAL": "USR1", "DDPQ_PREEMPT_GRACE": "30"}
STEPS = 256 // 32  # of an epoch: the example's samples over its global batch


def test_the_doc_shows_the_tested_example_word_for_word() -> None:
    assert f"```python\n{EXAMPLE.read_text()}```\n" in DOC.read_text()


def start(job: Path, log: Path, nproc: int, attempt: int) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1"]
    cmd += ["--nproc-per-node", str(nproc), "--master-addr", "127.0.0.1"]
    cmd += ["--master-port", str(free_port()), str(EXAMPLE)]
    env = job_env(job, {**PREEMPTIBLE, "DDPQ_ATTEMPT": str(attempt)})

    def ignoring() -> None:  # as ddpq starts torchrun: the signal is for the ranks alone
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)

    with log.open("wb") as out:
        return subprocess.Popen(
            cmd,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=ignoring,
        )


def spans(text: str) -> list[tuple[int, int, int]]:
    found = re.findall(r"^epoch (\d+): samples (\d+)\.\.(\d+)$", text, re.MULTILINE)
    return [(int(e), int(a), int(b)) for e, a, b in found]


@pytest.mark.timeout(300)
def test_preempted_on_two_ranks_it_goes_on_on_four(tmp_path: Path) -> None:
    job = tmp_path / "job"
    job.mkdir()
    first_log, second_log = tmp_path / "first.log", tmp_path / "second.log"
    proc = start(job, first_log, 2, 1)
    try:
        wait_for(lambda: len(spans(first_log.read_text())) >= 3, 120, proc, first_log)
        assert len(signal_ranks(proc, signal.SIGUSR1)) == 2
        finish(proc, timeout=60)
    finally:
        kill_job(proc, signal.SIGKILL)
    first = first_log.read_text()
    # Saved, "requeue me": torchrun reports the first rank to exit 75 and stops the other
    # with SIGTERM if it has not exited 75 yet (which of the two wins is a race).
    codes = re.findall(r"exitcode\s*: (-?\d+) ", first)
    assert "75" in codes and set(codes) <= {"75", "-15"}, first
    assert (job / "metrics.jsonl").read_text() == '{"preempted": true}\n'
    done = spans(first)
    assert 3 <= len(done) < 3 * STEPS, first

    proc = start(job, second_log, 4, 2)
    try:
        assert finish(proc, timeout=120) == 0, second_log.read_text()
    finally:
        kill_job(proc, signal.SIGKILL)
    second = second_log.read_text()
    epoch, _, at = done[-1]
    assert f"4 ranks, 8 samples each a step, from epoch {epoch} at {at}" in second, second
    # Every epoch's samples once: the steps of both attempts tile 0..256, in order.
    steps = done + spans(second)
    assert steps == [(e, 32 * s, 32 * s + 32) for e in range(3) for s in range(STEPS)]
    assert "done: loss" in second
