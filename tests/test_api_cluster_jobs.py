"""A job's cluster fields at the door: nodes, GPUs per node, partition and #SBATCH options are
for a Slurm daemon only, and checked as a Slurm site would need them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.inprocess import client_with_gpus


@pytest.fixture
def slurm_api(tmp_path: Path) -> Iterator[TestClient]:
    yield from client_with_gpus(tmp_path / "home", executor="slurm")


@pytest.fixture
def local_api(tmp_path: Path) -> Iterator[TestClient]:
    yield from client_with_gpus(tmp_path / "home")


def submit(c: TestClient, **fields: Any) -> Any:
    return c.post("/v1/jobs", json={"command": ["true"], "hold": True, **fields})


def test_a_multi_node_job_is_stored_with_its_total_and_shown(slurm_api: TestClient) -> None:
    r = submit(slurm_api, nodes=2, gpus_per_node=4, partition="gpu", slurm_options=["--qos=high"])
    assert r.status_code == 201, r.text
    job = slurm_api.get(f"/v1/jobs/{r.json()['id']}").json()
    assert (job["gpus"], job["nodes"], job["gpus_per_node"]) == (8, 2, 4)
    assert (job["partition"], job["slurm_options"]) == ("gpu", ["--qos=high"])
    same = submit(slurm_api, nodes=2, gpus_per_node=4, gpus=8)  # consistent: fine
    assert same.status_code == 201, same.text


@pytest.mark.parametrize(
    ("fields", "shown"),
    [
        ({"nodes": 2}, "gpus_per_node: a job on several nodes"),
        ({"nodes": 2, "gpus_per_node": 4, "gpus": 3}, "gpus: 3, but 2 nodes of 4 GPUs are 8"),
        ({"nodes": 0, "gpus_per_node": 1}, "nodes"),
        ({"nodes": 65, "gpus_per_node": 1}, "nodes"),
        ({"nodes": 3, "gpus_per_node": 4}, "asked for 12 GPUs but this server has 8"),
        ({"partition": "gpu;rm -rf /"}, "partition: a Slurm name"),
        ({"partition": ""}, "partition"),
        ({"slurm_options": ["--output=/etc/passwd"]}, "is --output to sbatch, which ddpq sets"),
        ({"slurm_options": ["--time=100"]}, "is --time to sbatch, which ddpq sets itself"),
        ({"slurm_options": ["-A", "other"]}, "'-A': -A (--account) needs a value"),
        ({"slurm_options": ["--qos=high\n#SBATCH --uid=0"]}, "must be one line"),
        ({"slurm_options": ["qos=high"]}, "'qos=high' is not an option"),
        ({"slurm_options": ["--x=" + "y" * 2000]}, "at most 1024"),
        ({"slurm_options": ["--qos=a"] * 33}, "slurm_options"),
        ({"slurm_options": "--qos=high"}, "slurm_options"),
    ],
)
def test_bad_cluster_fields_are_422_with_the_field_named(
    slurm_api: TestClient, fields: dict[str, Any], shown: str
) -> None:
    r = submit(slurm_api, **fields)
    assert r.status_code == 422 and shown in r.json()["detail"], r.text
    assert slurm_api.get("/v1/jobs").json()["total"] == 0


@pytest.mark.parametrize(
    "fields",
    [
        {"nodes": 2, "gpus_per_node": 1},
        {"gpus_per_node": 1},
        {"partition": "gpu"},
        {"slurm_options": ["--qos=high"]},
    ],
)
def test_a_local_daemon_refuses_what_only_slurm_can_do(
    local_api: TestClient, fields: dict[str, Any]
) -> None:
    r = submit(local_api, **fields)
    assert r.status_code == 422 and "not on Slurm" in r.json()["detail"], r.text
    # The defaults, sent explicitly, are no request for a cluster.
    assert submit(local_api, nodes=1, slurm_options=[]).status_code == 201


@pytest.mark.parametrize(
    ("option", "name"),
    [
        ("--gres gpu:8", "--gres"),
        ("-G8", "--gpus"),
        ("-a0-999", "--array"),
        ("--arr=0-999", "--array"),
        ("--acco=other", "--account"),
        ("-N4", "--nodes"),
        ("--time 5", "--time"),
        ("-t 99999", "--time"),
        ("--part=other", "--partition"),
        ("--uid 0", "--uid"),
        ("-o/etc/passwd", "--output"),
        ("--exclusive", "--exclusive"),  # not ddpq's, but not for users by default
    ],
)
def test_an_option_is_refused_as_sbatch_reads_it(
    slurm_api: TestClient, option: str, name: str
) -> None:
    r = submit(slurm_api, slurm_options=["--qos=high", option])
    detail = r.json()["detail"]
    assert r.status_code == 422 and f"slurm_options: {option!r} is {name} to sbatch" in detail
    assert slurm_api.get("/v1/jobs").json()["total"] == 0


def test_a_jobs_options_are_kept_as_sbatch_will_read_them(slurm_api: TestClient) -> None:
    r = submit(slurm_api, slurm_options=["-C a100", "--mem-per-g 32G", "  -q high"])
    assert r.status_code == 201, r.text
    job = slurm_api.get(f"/v1/jobs/{r.json()['id']}").json()
    assert job["slurm_options"] == ["--constraint=a100", "--mem-per-gpu=32G", "--qos=high"]


def test_the_admin_extends_and_pins_what_users_may_set(tmp_path: Path) -> None:
    settings: dict[str, Any] = {
        "executor": "slurm",
        "slurm_user_options": ("exclusive", "constraint"),
        "slurm_options": ("--constraint=a100",),
    }
    for c in client_with_gpus(tmp_path / "home", **settings):
        assert submit(c, slurm_options=["--exclus"]).status_code == 201
        pinned = submit(c, slurm_options=["-C h100"])
        assert "which the daemon's --slurm-options sets" in pinned.json()["detail"]
        narrowed = submit(c, slurm_options=["--qos=high"])
        assert "they may: --constraint, --exclusive;" in narrowed.json()["detail"]
