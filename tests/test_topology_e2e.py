"""Fake hardware end to end (issue 24): `--fake-topology` at start, `ddpq gpus --topology`,
`--gpu-link` and `--gpu-type` placing jobs, and a MIG instance named by its UUID."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from ddpq.client.errors import DdpqError
from ddpq.schemas import JobSubmit
from tests.helpers import Daemon, free_port, root_flags, wait_done, wait_for

TOPOLOGY = {
    "gpus": [
        {"index": 0, "name": "NVIDIA A100-SXM4-80GB", "memory": "80G", "numa": 0,
         "mig": ["3g.40gb", "1g.10gb"]},
        {"index": 1, "name": "NVIDIA H100 80GB HBM3", "memory": "80G", "numa": 0},
        {"index": 2, "name": "NVIDIA H100 80GB HBM3", "memory": "80G", "numa": 1},
        {"index": 3, "name": "NVIDIA H100 80GB HBM3", "memory": "80G", "numa": 1},
    ],
    "links": {"1-3": "NV18", "1-2": "NODE"},
    "default_link": "SYS",
    "numa_cpus": {"0": "0", "1": "0"},
}  # fmt: skip


def daemon_with(make_daemon: Callable[..., Daemon], tmp_path: Path) -> Daemon:
    path = tmp_path / "topo.json"
    path.write_text(json.dumps(TOPOLOGY))
    return make_daemon("--fake-gpus", "4", "--fake-topology", str(path), "--grace", "1s")


def visible(d: Daemon, tmp_path: Path, **ask: object) -> str:
    """What CUDA_VISIBLE_DEVICES a job asking ``ask`` is given."""
    c = d.client()
    job = c.submit(JobSubmit(command=["sh", "-c", "echo CVD=$CUDA_VISIBLE_DEVICES"], **ask))  # type: ignore[arg-type]
    done = wait_done(c, job.id)
    assert done.state == "succeeded", done.reason
    assert done.job_dir is not None
    return (Path(done.job_dir) / "output.log").read_text().split("CVD=")[1].split()[0]


def test_fake_hardware_places_jobs_and_names_mig_instances(
    make_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    d = daemon_with(make_daemon, tmp_path)
    shown = d.cli("gpus", "--topology").stdout
    assert "GPU1  X     NODE  NV18" in shown, shown
    assert "GPU5  on GPU0  1g.10gb  MIG-FAKE-0-1" in shown
    table = d.cli("gpus").stdout
    assert "MIG 3g.40gb (on GPU 0)" in table
    # An NVLink pair, not the first free (1, 2).
    assert visible(d, tmp_path, gpus=2, gpu_link="nvlink") == "1,3"
    assert visible(d, tmp_path, gpus=2) == "1,3"
    assert visible(d, tmp_path, gpu_type="1g.10gb") == "MIG-FAKE-0-1"
    assert visible(d, tmp_path, gpus=3, gpu_type="h100") == "1,2,3"
    c = d.client()
    # What no set of this host's GPUs could ever give is refused at submission, in the
    # words the scheduler's gate has for a job queued before (gates.unavailable_hardware).
    for ask, option in (
        ({"gpu_link": "nvlink"}, "--gpu-link"),
        ({"gpu_type": "a100"}, "--gpu-type"),
    ):
        never = d.cli(
            "submit", "--gpus", "3", option, next(iter(ask.values())), "--", "true", check=False
        )
        assert never.returncode == 2 and never.stderr.startswith(f"ddpq: {option}: needs 3 GPUs")
        with pytest.raises(DdpqError) as refused:
            c.submit(JobSubmit(command=["true"], gpus=3, **ask))  # type: ignore[arg-type]
        assert refused.value.status == 422
    held = c.submit(JobSubmit(command=["true"], gpus=2, gpu_link="nvlink", hold=True))
    assert c.show(held.id).gpu_link == "NV"
    assert "hardware   link NV or better" in d.cli("show", str(held.id)).stdout
    out = d.cli("submit", "--gpus", "2", "--gpu-link", "fast", "--", "true", check=False)
    assert out.returncode == 2 and "no link class: 'fast'" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_a_bad_topology_file_stops_the_start_with_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"gpus": [{"index": 0}], "links": {"0-1": "NV4"}}')
    argv = [sys.executable, "-m", "ddpq", "serve", "--home", str(tmp_path / "home")]
    argv += ["--port", str(free_port()), "--fake-gpus", "1", "--fake-topology", str(bad)]
    argv += root_flags(argv)
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    assert "--fake-topology" in last and "two different GPUs below 1" in last, out.stderr
    assert "Traceback" not in out.stderr


def test_a_gpu_jobs_cores_are_its_gpus_numa_nodes(
    make_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    """GPU 0 sits on the NUMA node of CPU 1, GPU 1 on CPU 0's (fake nodes over this box's
    real cores): each job leases the core near its GPU, not the first free one."""
    host = sorted(os.sched_getaffinity(0))
    if len(host) < 2:
        pytest.skip("one core: nothing to choose between")
    crossed = {
        "gpus": [{"index": 0, "numa": 1}, {"index": 1, "numa": 0}],
        "numa_cpus": {"0": str(host[0]), "1": str(host[1])},
    }
    path = tmp_path / "numa.json"
    path.write_text(json.dumps(crossed))
    d = make_daemon(
        "--fake-gpus", "2", "--fake-topology", str(path), "--cpu-capacity", "2",
        "--cpus-per-gpu", "1", "--grace", "1s",
    )  # fmt: skip
    c = d.client()
    first = c.submit(JobSubmit(command=["sleep", "60"], gpus=1)).id
    second = c.submit(JobSubmit(command=["sleep", "60"], gpus=1)).id
    wait_for(lambda: {c.show(first).state, c.show(second).state} == {"running"}, 60, "both")
    placed = {tuple(c.show(j).leases.gpus): c.show(j).leases.cores for j in (first, second)}
    assert placed == {(0,): [host[1]], (1,): [host[0]]}, placed
    c.cancel(first)
    c.cancel(second)
