"""The batch script: what it asks Slurm for, what it runs, and that Slurm accepts it."""

from __future__ import annotations

import errno
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from ddpq.config import Settings
from ddpq.core.disposition import attempt_header, rendezvous_port_clash
from ddpq.executors.base import Launch, LaunchFailed
from ddpq.executors.slurm import port_check, script, submit
from tests import launches
from tests.slurm.cluster import GPUS_PER_NODE, NODES, SlurmCluster


def launch(tmp_path: Path, **kw: object) -> Launch:
    fields: dict[str, object] = {
        "job_id": 7,
        "attempt": 2,
        "command": ["train.py", "--lr", "0.1"],
        "launcher": "torchrun",
        "gpus": (0, 1, 2, 3, 4, 5, 6, 7),
        "port": 29601,
        "cwd": "/data/alice",
        "env": {},
        "owner": "alice",
        "unix_account": None,
        "nodes": 2,
        "gpus_per_node": 4,
    }
    return launches.a_launch(tmp_path / "jobs" / "7", **{**fields, **kw})


def options(text: str) -> list[str]:
    return [
        line.removeprefix("#SBATCH ") for line in text.splitlines() if line.startswith("#SBATCH")
    ]


def test_a_multi_node_script(tmp_path: Path) -> None:
    settings = Settings(
        home=tmp_path, grace_s=10, slurm_partition="gpu", slurm_account="lab",
        slurm_options=("--qos=high",),
    )  # fmt: skip
    job = launch(tmp_path, time_limit_s=3600, slurm_options=("--constraint=a100",))
    text = script.render(script.batch_job(job, settings))
    folder = tmp_path / "jobs" / "7"
    assert options(text) == [
        # The extras first: for sbatch a later option overrides an earlier one.
        "--qos=high",
        "--constraint=a100",
        "--job-name=ddpq-7",
        f"--comment=ddpq:{script.daemon_tag(tmp_path)}:7:2",
        f"--output={folder}/slurm.out",
        "--open-mode=append",
        f"--chdir={folder}",
        "--no-requeue",
        "--nodes=2",
        "--ntasks-per-node=1",
        "--signal=B:TERM@10",
        "--gres=gpu:4",
        "--time=62",  # 3600 s + twice the grace + a spare minute, in minutes
        "--partition=gpu",
        "--account=lab",
    ]
    command = text[text.index("setsid") :].replace("\\\n    ", "")
    assert "srun --nodes=2 --ntasks-per-node=1 --kill-on-bad-exit=1" in command
    assert "--nnodes 2 --nproc-per-node 4 --rdzv-backend c10d" in command
    assert '--rdzv-endpoint "$MASTER_ADDR":29601' in command
    assert "port_check.py 29601 srun" in command
    assert command.split("--max-restarts 0 ", 1)[1].startswith("train.py --lr 0.1 &")
    assert "scontrol show hostnames" in text and 'export MASTER_ADDR="${addr:-$head}"' in text


def test_a_one_node_job_asks_for_its_gpus_only(tmp_path: Path) -> None:
    plain = launch(tmp_path, launcher="plain", nodes=1, gpus_per_node=None, gpus=(0, 1), port=None)
    text = script.render(script.batch_job(plain, Settings(home=tmp_path)))
    assert "--nodes=1" in options(text) and "--gres=gpu:2" in options(text)
    assert not any(o.startswith(("--time", "--partition", "--account")) for o in options(text))
    assert "srun" not in text and "port_check" not in text and "MASTER_ADDR" not in text
    cpu = launch(tmp_path, launcher="plain", nodes=1, gpus_per_node=None, gpus=(), port=None)
    assert not any(
        o.startswith("--gres")
        for o in options(script.render(script.batch_job(cpu, Settings(home=tmp_path))))
    )


def test_odd_words_of_a_command_stay_one_word(tmp_path: Path) -> None:
    odd = launch(tmp_path, launcher="plain", nodes=1, gpus=(), port=None,
                 command=["sh", "-c", "echo 'a b' $HOME; exit 3"])  # fmt: skip
    text = script.render(script.batch_job(odd, Settings(home=tmp_path)))
    assert "-- sh -c 'echo '\"'\"'a b'\"'\"' $HOME; exit 3' &" in text.replace("\\\n    ", "")


@pytest.mark.parametrize(
    ("limit", "grace", "minutes", "lead"),
    [(None, 10, None, 10), (60, 10, 3, 10), (3600, 30, 62, 30), (1, 0, 2, 1), (90, 0.5, 3, 1)],
)
def test_slurms_limit_is_a_backstop_behind_ddpqs(
    limit: float | None, grace: float, minutes: int | None, lead: int
) -> None:
    assert script.slurm_limits(limit, grace) == (minutes, lead)
    if limit is not None and minutes is not None:
        # Slurm's SIGTERM (up to a minute early) comes after ddpq's SIGKILL at limit+grace.
        assert minutes * 60 - lead - 60 >= limit + grace


def test_the_port_check_names_a_taken_port_as_a_clash(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert port_check.port_taken(port) is not None
        done = subprocess.run(
            [sys.executable, "-S", str(script.PORT_CHECK), str(port), "echo", "ran"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    assert done.returncode == 1 and "ran" not in done.stdout
    log = attempt_header("now", [0], port) + done.stdout
    assert rendezvous_port_clash(log), log
    assert port_check.port_taken(port) is None
    free = subprocess.run(
        [sys.executable, "-S", str(script.PORT_CHECK), str(port), "echo", "ran"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert free.returncode == 0 and free.stdout == "ran\n"


# ---- Slurm's word on it ---------------------------------------------------------------


def test_slurm_accepts_a_multi_node_script(slurm: SlurmCluster, tmp_path: Path) -> None:
    job = launch(tmp_path, gpus_per_node=GPUS_PER_NODE, nodes=len(NODES), time_limit_s=600)
    text = script.render(script.batch_job(job, Settings(home=tmp_path)))
    done = slurm.run("sbatch", "--test-only", input=text)
    assert "to start at" in done.stderr and "n[1-2]" in done.stderr, done.stderr


def test_slurm_refuses_a_script_no_node_can_run(slurm: SlurmCluster, tmp_path: Path) -> None:
    job = launch(tmp_path, nodes=len(NODES) + 1, gpus_per_node=1)
    text = script.render(script.batch_job(job, Settings(home=tmp_path)))
    done = slurm.run("sbatch", "--test-only", input=text, check=False)
    assert done.returncode != 0 and "not available" in done.stderr, done.stderr


def test_a_stored_option_users_may_not_set_fails_the_launch(tmp_path: Path) -> None:
    # A job queued before the admin narrowed the list, or stored by an older ddpq.
    job = launch(tmp_path, slurm_options=("--qos=high", "--gres gpu:8"))
    with pytest.raises(LaunchFailed, match="--slurm-opt '--gres gpu:8' is --gres to sbatch"):
        script.batch_job(job, Settings(home=tmp_path))
    narrowed = Settings(home=tmp_path, slurm_user_options=("constraint",))
    with pytest.raises(LaunchFailed, match="'--qos=high' is --qos to sbatch, which users may"):
        script.batch_job(launch(tmp_path, slurm_options=("--qos=high",)), narrowed)


@pytest.mark.parametrize(("fault", "put_off"), [(errno.ENOSPC, True), (errno.EIO, False)])
def test_a_folder_with_no_room_puts_the_launch_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: int, put_off: bool
) -> None:
    """As the local executor's: a full disk puts the launch off, another fault fails it."""

    def no_room(*_: object) -> None:
        raise OSError(fault, os.strerror(fault))

    monkeypatch.setattr(submit, "make_folder", no_room)
    with pytest.raises(LaunchFailed, match="cannot prepare the job's folder") as failed:
        submit.prepare(launch(tmp_path), Settings(home=tmp_path))
    assert failed.value.put_off is put_off and not failed.value.interrupted
