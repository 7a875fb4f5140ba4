"""CPU cores and host memory as leased resources (issue 23): ``--cpus``/``--mem`` at the
API's door, and a daemon that holds a flood of CPU jobs to its cores while GPU jobs that
name no cores run as before."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from ddpq.core import jobenv
from ddpq.core.spec import JobSpec
from ddpq.executors.base import Launch
from ddpq.executors.contract import job_env
from ddpq.hostinfo import host_cpus
from ddpq.schemas import JobSubmit
from tests.helpers import Daemon, wait_done, wait_for, wait_state
from tests.inprocess import client_with_gpus
from tests.test_api_cluster_jobs import submit
from tests.test_sharing_e2e import sleeper

M = 1 << 20


@pytest.fixture
def api(tmp_path: Path) -> Iterator[TestClient]:
    yield from client_with_gpus(tmp_path / "home", cpu_capacity=2, job_ram="1G")


BAD = [
    ({"cpus": 0}, "cpus"),
    ({"cpus": -1}, "cpus"),
    ({"cpus": 5000}, "cpus"),
    ({"cpus": "2"}, "cpus"),
    ({"cpus": True}, "cpus"),
    ({"cpus": 1.5}, "cpus"),
    ({"cpus": 3}, "needs 3 CPU cores; only 2 can be handed out"),
    ({"mem": "12Q"}, "not a size"),
    ({"mem": "-1G"}, "must not be negative"),
    ({"mem": "1K"}, "must be between 4M"),
    ({"mem": 0}, "must be between 4M"),
    ({"mem": ""}, "not a size"),
    ({"mem": True}, "mem"),
    ({"mem": 10**20}, "must be between"),
    ({"mem": [1]}, "mem"),
    ({"mem": "2G"}, "asks 2G of memory; jobs here may hold 1G in all"),
]


@pytest.mark.parametrize(("fields", "says"), BAD, ids=[str(f) for f, _ in BAD])
def test_bad_cpus_or_mem_is_a_422_with_the_reason(
    api: TestClient, fields: dict[str, Any], says: str
) -> None:
    r = submit(api, **fields)
    assert r.status_code == 422, r.text
    assert says in r.text, r.text
    assert api.get("/v1/jobs").json()["total"] == 0


def test_good_ones_are_kept_and_shown(api: TestClient) -> None:
    r = submit(api, cpus=2, mem="512M", gpus=1)
    assert r.status_code == 201, r.text
    job = api.get(f"/v1/jobs/{r.json()['id']}").json()
    assert (job["cpus"], job["mem"]) == (2, 512 * M)
    plain = api.get(f"/v1/jobs/{submit(api).json()['id']}").json()
    assert (plain["cpus"], plain["mem"]) == (None, None)  # the daemon's defaults apply


def test_a_slurm_daemon_refuses_cores_and_memory(tmp_path: Path) -> None:
    for c in client_with_gpus(tmp_path / "home", executor="slurm"):
        for fields in ({"cpus": 2}, {"mem": "1G"}):
            r = submit(c, **fields)
            assert r.status_code == 422 and "cpus-per-task" in r.text, r.text


def test_a_flood_of_cpu_jobs_runs_two_at_a_time_on_two_cores(
    make_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    d = make_daemon("--fake-gpus", "4", "--grace", "1s", "--cpu-capacity", "2")
    c = d.client()
    flood = [c.submit(JobSubmit(command=sleeper(tmp_path, f"c{i}"))).id for i in range(4)]
    gpu = [c.submit(JobSubmit(command=sleeper(tmp_path, f"g{i}"), gpus=1)).id for i in range(4)]
    for job_id in flood[:2] + gpu:  # GPU jobs that name no cores share them: all 4 run
        wait_state(c, job_id, "running")
    waiting = "waiting for 1 free CPU core (2 of 2 held)"
    for job_id in flood[2:]:

        def says_why(j: int = job_id) -> bool:
            return c.show(j).reason == waiting

        assert wait_for(says_why, what="the reason")
    held = [c.show(j).leases.cores for j in flood[:2]]
    assert sorted(cpu for cores in held for cpu in cores) == sorted(set(held[0] + held[1]))
    assert all(len(cores) == 1 for cores in held)
    shown = d.cli("gpus").stdout
    assert "cpu cores  2 of 2 held" in shown, shown
    assert "1 asked" not in d.cli("show", str(flood[0])).stdout  # it asked for none
    (tmp_path / "c0.go").touch()
    wait_done(c, flood[0])
    wait_state(c, flood[2], "running")
    for name in ("c1", "c2", "c3", "g0", "g1", "g2", "g3"):
        (tmp_path / f"{name}.go").touch()
    for job_id in flood + gpu:
        assert wait_done(c, job_id).state == "succeeded"
    assert d.client().usage(since="1d").total.core_hours > 0


@pytest.mark.skipif(len(host_cpus()) < 2, reason="needs a host of 2 CPUs or more")
def test_a_job_s_threads_match_its_cores(
    make_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    d = make_daemon("--fake-gpus", "4", "--grace", "1s")
    c = d.client()
    out = tmp_path / "threads"
    script = f"echo $OMP_NUM_THREADS $MKL_NUM_THREADS > {out}"
    job = c.submit(JobSubmit(command=["sh", "-c", script], cpus=2, mem="64M"))
    done = wait_done(c, job.id)
    assert done.state == "succeeded" and out.read_text().split() == ["2", "2"]
    (attempt,) = done.attempts
    assert attempt.cores is not None and len(set(attempt.cores)) == 2 and attempt.mem == 64 * M


def launch(cores: tuple[int, ...], gpus: tuple[int, ...], launcher: str, **env: str) -> Launch:
    spec = JobSpec("j", "alice", ["true"], "/", len(gpus), launcher, env=jobenv.pack(None, env))
    return Launch(1, 1, Path("/tmp/j"), spec, gpus, 29600, None, cores=cores)


@pytest.mark.parametrize(
    ("cores", "gpus", "launcher", "threads"),
    [
        ((0, 1, 2, 3), (0, 1), "torchrun", "2"),  # split among torchrun's ranks
        ((0, 1, 2), (0, 1), "torchrun", "1"),
        ((0, 1), (0, 1, 2, 3), "torchrun", "1"),  # at least 1
        ((0, 1, 2, 3), (0, 1), "plain", "4"),  # one process: all of them
        ((), (0, 1), "plain", "7"),  # no cores leased: the host's share, as before
    ],
)
def test_thread_variables_follow_the_leased_cores(
    cores: tuple[int, ...], gpus: tuple[int, ...], launcher: str, threads: str
) -> None:
    env = job_env(launch(cores, gpus, launcher), {}, omp_threads=7)
    assert (env["OMP_NUM_THREADS"], env["MKL_NUM_THREADS"]) == (threads, threads)


def test_a_job_s_own_thread_count_is_kept() -> None:
    env = job_env(launch((0, 1), (), "plain", OMP_NUM_THREADS="16"), {}, omp_threads=1)
    assert (env["OMP_NUM_THREADS"], env["MKL_NUM_THREADS"]) == ("16", "2")
