"""The README's commands, run as written: each `ddpq …` line of its shell blocks, through bash,
with the installed `ddpq` script, against a live daemon (4 fake GPUs).

A reader copies these lines; one that fails as written (as `--export NONE -- python
train.py` did: no `python` on the minimal PATH) is a bug in the README or in ddpq. Every
line is either run here or named in NOT_RUN with the reason, so a new README command cannot
go untried unnoticed. The scripts the examples name (train.py, seed.py, ...) are made as
small programs that print and succeed; job 7 and 8 and sweep s1 stand for the first jobs and
sweep the lines themselves submit. Jobs whose lines promise they run to the end here are
waited on; the rest (hours of training, holds, sweeps) are cancelled as soon as
their line was accepted.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ddpq.schemas import JobDetail, JobSubmit
from tests.helpers import TERMINAL, Daemon, wait_for

README = Path(__file__).resolve().parents[1] / "README.md"

# Lines not run, each with why: they need a terminal, another daemon or host, or root.
NOT_RUN = {
    "make demo": "minutes of ResNet18 training (scripts/demo.sh), tried by hand each release",
    "make check": "this suite is what it runs",
    "ddpq serve": "starts a daemon on the default port: this test's daemon stands for it",
    "ddpq serve --fake-gpus 4": "as above",
    "ddpq serve --notify-url https://chat.example.org/hooks/lab": "a daemon posting off-box",
    "ddpq watch": "a live view that runs until Ctrl-C",
    "ddpq shell --gpus 1": "an interactive terminal (tests/test_sessions_e2e.py)",
    "ddpq shell --gpus 2 --time-limit 4h --idle 1h": "as above",
    "ddpq shell -- jupyter lab --no-browser --port {port}": "as above, and no jupyter here",
    "ddpq attach 7": "as above",
    "ddpq --url http://server:8765 login": "a hidden prompt, and a host named server",
    "ddpq --url http://server:8765 login < ci.token": "a host named server",
    "ddpq token create --expires 90d --note laptop": "tokens need an --auth daemon",
    "ddpq token ls": "as above",
    "ddpq token revoke 3": "as above",
    "ddpq whoami": "its output is the README's example account, alice",
    "sudo ddpq admin user add ci --unix-user labci": "needs the accounts labci and robert",
    "sudo ddpq admin user add bob --admin --unix-user robert": "as above",
    "sudo ddpq admin user map ci labci": "as above",
    'sudo ddpq admin reserve --gpus 4 --user alice --start "2026-12-03 09:00" --end +8h': (
        "a fixed date that passes (tests/test_sharing_e2e.py reserves from +1h)"
    ),
    "sudo ddpq admin unreserve 3": "reservation 3 is the README's example",
    "ddpq submit --notify https://hooks.slack.com/services/T0/B0/XXXX -- python train.py": (
        "would post to a public host"
    ),
    "ddpq submit --array 0-99 --notify https://hooks.slack.com/services/T0/B0/XXXX -- "
    "python seed.py": "as above",
    "ddpq submit --gpus 2 --gpu-link nvlink --torchrun -- ddp.py": (
        "an NVLink pair, which 4 fake GPUs without a topology never have: refused at "
        "submission (tests/test_topology_e2e.py runs it on a fake topology)"
    ),
    "ddpq submit --gpus 4 --gpu-type h100 --torchrun -- ddp.py": "H100s: as above",
    "ddpq submit --gpu-type 1g.10gb -- python small.py": "a MIG instance: as above",
    "ddpq submit resnet18 --gpus 4 --stem cifar --batch-size 256 --amp": (
        "CIFAR-10 in the job's account's ~/.cache/ddpq/cifar10, checked at submission "
        "(tests/test_workload_data.py); the --data-dir line above runs"
    ),
    "ddpq submit --preemptible resnet18 --gpus 4 --epochs 90": "as above",
    "ddpq submit --gpu-mem 5G -- python small.py": "the fake GPUs here have no memory to share",
    "ddpq submit --gpu-mem 10G --gpus 2 --torchrun -- ddp.py": "as above",
    "ddpq submit --gpu-mem 5G --gpu-share 2 -- python a.py": "as above",
    "ddpq submit --name sweep-a --gpu-mem auto -- python a.py": "as above",
    "ddpq update 7 --priority 5 --gpus 2 --time-limit 1h": (
        "job 7 here has run already (tests/test_update_restart_e2e.py updates a held job)"
    ),
}

# Submissions whose jobs must run to success here, as their comment promises.
MUST_SUCCEED = (
    "ddpq submit --gpus 2 -- python train.py --lr 0.1",
    "ddpq submit --gpus 2 --torchrun -- train.py",
    "ddpq submit -- python train.py",
    "ddpq submit --export NONE -- python3 train.py",
    "ddpq submit --export WANDB_API_KEY,HF_HOME -- python3 train.py",
    "ddpq submit --export NONE --env OMP_NUM_THREADS=8 -- ./run.sh",
    "ddpq submit --gpus 1 -- job.sh --lr 0.1",
    "ddpq submit --retries 3 -- python flaky.py",
    "ddpq submit --after 7 -- python evaluate.py",
)

SCRIPT = 'import os, sys\nprint("ran", sys.argv[1:], os.environ.get("DDPQ_JOB_ID"))\n'


def readme_commands() -> list[str]:
    """The README's shell lines that run something, without their comments; a line whose
    comment continues on the next lines (starting with #) is one command."""
    commands = []
    for block in re.findall(r"```sh\n(.*?)```", README.read_text(), re.S):
        for line in block.splitlines():
            command = re.sub(r"\s+#.*$", "", line).strip()
            if command and not command.startswith("#"):
                commands.append(command)
    return commands


@pytest.fixture
def workdir(tmp_path: Path) -> Iterator[Path]:
    """The reader's folder: the scripts the examples run, and a CIFAR-10 at ~/data/cifar10
    (the job's folder is the reader's: --data-dir ~/... is read as the reader's home)."""
    from ddpq.workloads import cifar

    cwd = tmp_path / "work"
    cwd.mkdir()
    for name in ("train.py", "flaky.py", "evaluate.py", "later.py", "big.py", "seed.py", "prep.py"):
        (cwd / name).write_text(SCRIPT)
    (cwd / "report.py").write_text(SCRIPT)
    # The README's batch script, as it shows it, with a stand-in for its torchrun line.
    script = re.search(r"```bash\n(#!/bin/bash\n#SBATCH.*?)```", README.read_text(), re.S)
    assert script is not None, "the README's batch script"
    (cwd / "job.sh").write_text(re.sub(r"^torchrun.*$", 'echo "$@"', script[1], flags=re.M))
    run = cwd / "run.sh"
    run.write_text('#!/bin/sh\necho "threads $OMP_NUM_THREADS"\n')
    run.chmod(0o755)
    cifar.write_cifar10(tmp_path / "home" / "data" / "cifar10", train_n=20, test_n=10)
    yield cwd


def run_line(
    line: str, cwd: Path, d: Daemon, ids: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    def replaced(m: re.Match[str]) -> str:  # 7, 8, s1 where a command names a job
        return " ".join(ids.get(word, word) for word in m[0].split(" "))

    line = re.sub(
        r"(?<!\S)(?:show|cancel|attach|preempt|release|hold|restart|--after|-f)(?: (?:\d+|s\d+))+",
        replaced,
        line,
    )
    line = re.sub(r"(after(?:ok|any|notok)):(\d+)", lambda m: f"{m[1]}:{ids.get(m[2], m[2])}", line)
    admin = line.startswith("sudo ")
    if admin:  # the test runs as the daemon's own account: straight to its state folder
        line = line.removeprefix("sudo ")
    bin_dir = Path(sys.executable).parent
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "DDPQ_URL": d.url,
        "DDPQ_HOME": str(d.home),
        "HOME": str(cwd.parent / "home"),
        "COLUMNS": "120",
    }
    return subprocess.run(
        ["bash", "-c", line], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


def test_every_readme_command_is_run_or_says_why_not() -> None:
    commands = readme_commands()
    assert len(commands) > 30, commands  # the blocks were found
    stale = set(NOT_RUN) - set(commands)
    assert not stale, f"NOT_RUN names lines the README no longer has: {stale}"
    missing = set(MUST_SUCCEED) - set(commands)
    assert not missing, f"MUST_SUCCEED names lines the README no longer has: {missing}"


def test_the_readme_commands_work_as_written(
    make_daemon: Callable[..., Daemon], workdir: Path
) -> None:
    d = make_daemon("--fake-gpus", "4", "--grace", "1s")
    c = d.client()
    ids: dict[str, str] = {}
    submitted: dict[str, int] = {}

    def ended(line: str) -> JobDetail:
        job_id = submitted[line]

        def shown_if_ended() -> JobDetail | None:
            job = c.show(job_id)
            return job if job.state in TERMINAL else None

        return wait_for(shown_if_ended, 120, line)

    for line in readme_commands():
        if line in NOT_RUN:
            continue
        if " cancel " in f" {line} ":  # as a reader would: the runs they wanted first
            for earlier in submitted.keys() & set(MUST_SUCCEED):
                ended(earlier)
        if line == "ddpq preempt 7":  # 7 there is a preemptible job: one of the test's own
            victim = c.submit(JobSubmit(command=["sleep", "60"], gpus=1, preemptible=True)).id

            def running(j: int = victim) -> bool:
                return c.show(j).state == "running"

            wait_for(running, 120, "it to run")
            line = f"ddpq preempt {victim}"
        r = run_line(line, workdir, d, ids)
        assert r.returncode == 0, f"{line!r} -> exit {r.returncode}: {r.stderr or r.stdout}"
        out = r.stdout.strip()
        if line.startswith("ddpq preempt "):  # shown: its 90 epochs need not hold 4 GPUs on
            c.cancel(int(line.split()[-1]))
        if " submit " in f" {line} " and "--sweep" not in line and "--array" not in line:
            assert out.isdigit(), f"{line!r} printed {out!r}, not a job id"
            submitted[line] = int(out)
            if line not in MUST_SUCCEED:
                c.cancel(int(out))  # accepted is what this line shows: its hours end here
            for placeholder in ("7", "8"):  # the README's example ids: the first two jobs
                ids.setdefault(placeholder, out)
                if ids[placeholder] == out:
                    break
        elif "--sweep" in line or "--array" in line:
            assert re.fullmatch(r"s\d+", out.split()[0]), f"{line!r} printed {out!r}"
            ids.setdefault("s1", out.split()[0])
            d.cli("cancel", out.split()[0])  # `show s1` and `--after s1` need no running
    for line in MUST_SUCCEED:
        detail = ended(line)
        assert detail.state == "succeeded", f"{line!r}: {detail.state} ({detail.reason})"
    # The rest (held, hours of training) have shown they were accepted: ended now.
    d.cli("cancel", "--mine")
