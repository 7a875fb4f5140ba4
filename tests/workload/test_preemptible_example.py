"""The example of docs/preemption.md, run as ddpq would run it (no daemon needed): its own
process group, the job's environment, the preemption signal sent to that group."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.workload.runs import finish, kill_group, wait_for

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "tests" / "jobs" / "preemptible_example.py"
DOC = ROOT / "docs" / "preemption.md"


def test_the_doc_shows_the_tested_example_word_for_word() -> None:
    doc = DOC.read_text()
    assert f"```python\n{EXAMPLE.read_text()}```\n" in doc


def start(job: Path, log: Path, attempt: int, name: str) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DDPQ_")}
    env |= {"DDPQ_JOB_DIR": str(job), "DDPQ_ATTEMPT": str(attempt), "DDPQ_REQUEUE_EXIT": "75"}
    env |= {"DDPQ_PREEMPT_SIGNAL": name, "DDPQ_PREEMPT_GRACE": "30"}
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, str(EXAMPLE)],
            cwd=job,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


@pytest.mark.parametrize("name", ["USR1", "HUP"])
def test_the_example_saves_when_signalled_and_resumes(tmp_path: Path, name: str) -> None:
    job = tmp_path / "job"
    job.mkdir()
    first_log, second_log = tmp_path / "first.log", tmp_path / "second.log"
    proc = start(job, first_log, 1, name)
    try:
        wait_for(lambda: "step 3\n" in first_log.read_text(), 60, proc, first_log)
        kill_group(proc, signal.Signals[f"SIG{name}"])
        assert finish(proc, timeout=30) == 75, first_log.read_text()
    finally:
        kill_group(proc, signal.SIGKILL)
    step, total = json.loads((job / "state.json").read_text())
    assert 3 <= step < 100 and total == sum(range(step))
    first = first_log.read_text().splitlines()
    assert first[0] == "attempt 1: starting at step 0" and first[-1] == f"step {step}"

    proc = start(job, second_log, 2, name)
    assert finish(proc, timeout=60) == 0, second_log.read_text()
    second = second_log.read_text().splitlines()
    assert second[0] == f"attempt 2: starting at step {step}"
    # Every step exactly once over both attempts, and the result of an uninterrupted run.
    done = [line for line in first + second if line.startswith("step ")]
    assert done == [f"step {n}" for n in range(1, 101)]
    assert second[-1] == f"done: total {sum(range(100))}"
