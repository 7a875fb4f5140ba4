"""The Slurm executor alone against the test Slurm: a multi-node torchrun job (two Slurm
nodes, both this machine) and a job Slurm has forgotten. The worker passes no node count
yet (the API has no --nodes), so these drive the executor as the worker would."""

from __future__ import annotations

import time
from pathlib import Path

from ddpq.config import Settings
from ddpq.executors.base import Ended
from ddpq.executors.slurm.commands import SlurmCommands
from ddpq.executors.slurm.executor import SlurmExecutor
from ddpq.jobdir import JobDir
from ddpq.worker.ports import port_is_free
from tests import launches
from tests.slurm.cluster import NODES, SlurmCluster

REPO = Path(__file__).resolve().parents[2]


def wait_ended(executor: SlurmExecutor, timeout: float) -> list[Ended]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ended = executor.ended()
        if ended:
            return ended
        time.sleep(0.1)
    raise AssertionError(f"nothing ended within {timeout}s")


def test_a_two_node_torchrun_job_rendezvouses_on_its_port(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    settings = Settings(home=tmp_path, grace_s=1)
    executor = SlurmExecutor(settings, SlurmCommands(), gpus=8)
    port = next(p for p in range(*settings.port_range) if port_is_free(p))
    launch = launches.a_launch(
        job_id=1,
        attempt=1,
        job_dir=tmp_path / "jobs" / "1",
        command=[str(REPO / "tests" / "jobs" / "ddp_tiny.py"), "3"],
        launcher="torchrun",
        gpus=(0, 1),
        port=port,
        cwd=str(REPO),
        env={},
        owner="alice",
        unix_account=None,
        nodes=len(NODES),
        gpus_per_node=1,
    )
    handle = executor.start(launch)
    executor.proceed([1])
    (ended,) = wait_ended(executor, 120)
    log = JobDir(launch.job_dir).log.read_text()
    assert (ended.job_id, ended.record.exit_code, ended.record.error) == (1, 0, None), log
    assert "rank 0/2" in log and "rank 1/2" in log
    nodes = slurm.run("squeue", "--noheader", "--states=all", f"--jobs={handle}", "--format=%N")
    assert nodes.stdout.strip() == "n[1-2]"  # one rank on each node


def test_a_job_slurm_has_forgotten_is_lost(slurm: SlurmCluster, tmp_path: Path) -> None:
    executor = SlurmExecutor(Settings(home=tmp_path), SlurmCommands(), gpus=8)
    folder = tmp_path / "jobs" / "3"
    folder.mkdir(parents=True)
    assert executor.adopt(3, 1, folder, "999999") == "999999"
    (ended,) = wait_ended(executor, 30)
    assert ended.record.error is not None
    assert ended.record.error.startswith("lost: Slurm no longer knows job 999999")
