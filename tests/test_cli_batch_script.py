"""`ddpq submit job.sh`: what a script with #SBATCH/#DDPQ lines sends, at a stand-in API."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.stub_api import Answer, Request, StubApi, json_answer

SCRIPT = """#!/bin/bash -l
#SBATCH --job-name=from-script
#SBATCH --gres=gpu:2 --time=1:00:00
#SBATCH --partition=gpu
#SBATCH --export=ALL,FOO=1
#DDPQ --priority 4
srun python train.py "$@"
#SBATCH --gpus=8
"""


@pytest.fixture
def stub() -> Iterator[StubApi]:
    def answer(request: Request) -> Answer:
        if request.method == "POST" and request.path == "/v1/jobs":
            return json_answer(201, {"id": 7})
        return Answer(404, b"no")

    with StubApi(answer) as api:
        yield api


def ddpq(stub: StubApi, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ddpq", "submit", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "DDPQ_URL": stub.url},
        cwd=cwd,
        timeout=60,
    )


def test_a_script_s_directives_are_options_under_the_command_line_s(
    stub: StubApi, tmp_path: Path
) -> None:
    (tmp_path / "job.sh").write_text(SCRIPT)  # not executable: run through its #! line
    r = ddpq(stub, tmp_path, "--gpus", "1", "--env", "BAR=2", "job.sh", "--lr", "0.1")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "7"
    warning = "ddpq: warning: job.sh: #SBATCH --partition=gpu: not used by ddpq, left out\n"
    assert r.stderr == warning
    (request,) = [q for q in stub.requests if q.method == "POST"]
    body = json.loads(request.body)
    assert body["command"] == ["/bin/bash", "-l", str(tmp_path / "job.sh"), "--lr", "0.1"]
    assert body["gpus"] == 1  # typed: over the script's 2 (and its 8 below a command is none)
    assert (body["name"], body["priority"], body["time_limit_s"]) == ("from-script", 4, 3600)
    assert body["env"] == {"FOO": "1", "BAR": "2"}  # a list option gets both


@pytest.mark.parametrize(
    ("directive", "says"),
    [
        ("#SBATCH --gres=gpu:two", "job.sh: #SBATCH --gres=gpu:two: 'gpu:two': the GPU count"),
        ("#DDPQ --prio 3", "job.sh: no such option: --prio (did you mean --priority?)\n"),
        ("#DDPQ train.py", "job.sh: #DDPQ lines hold options only, not 'train.py'"),
        ("#DDPQ --gpus lots", "job.sh: --gpus: 'lots' is not a number of GPUs nor a range"),
        # A value the option's converter refuses: named with the script too.
        ("#DDPQ --priority x", "job.sh: Invalid value for '--priority': 'x' is not a whole"),
    ],
)
def test_a_bad_directive_is_one_line_and_exit_2(
    stub: StubApi, tmp_path: Path, directive: str, says: str
) -> None:
    (tmp_path / "job.sh").write_text(f"#!/bin/sh\n{directive}\necho hi\n")
    r = ddpq(stub, tmp_path, "job.sh")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith(f"ddpq: {says}") and r.stderr.count("\n") == 1, r.stderr
    assert not [q for q in stub.requests if q.method == "POST"]


def test_a_script_without_directives_runs_as_it_is(stub: StubApi, tmp_path: Path) -> None:
    (tmp_path / "plain.sh").write_text("#!/bin/sh\necho hi\n")
    assert ddpq(stub, tmp_path, "./plain.sh").returncode == 0
    (request,) = [q for q in stub.requests if q.method == "POST"]
    assert json.loads(request.body)["command"] == ["./plain.sh"]
