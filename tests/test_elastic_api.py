"""Elastic submissions through the API in-process (docs: README "Elastic jobs"): the range
as ``gpus`` and ``gpus_max``, implied preemptible, and every bad range a 422 with its
reason; changes that would leave the range upside down are refused too."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from ddpq.core.spec import JobSpec
from ddpq.executors.capabilities import capabilities
from tests.inprocess import client_with_gpus


@pytest.fixture
def c(tmp_path: Path) -> Iterator[TestClient]:
    yield from client_with_gpus(tmp_path / "home", gpus=4)


def post(c: TestClient, **fields: Any) -> Any:
    return c.post("/v1/jobs", json={"command": ["true"], **fields})


def test_a_range_is_kept_and_makes_the_job_preemptible(c: TestClient) -> None:
    r = post(c, gpus=2, gpus_max=4)
    assert r.status_code == 201, r.text
    assert (r.json()["gpus"], r.json()["gpus_max"], r.json()["preemptible"]) == (2, 4, True)
    assert post(c, gpus=2, gpus_max=2).json()["gpus_max"] is None  # one size: fixed


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"gpus": 4, "gpus_max": 2}, "gpus_max: the range 4-2 ends below its start"),
        ({"gpus": 0, "gpus_max": 2}, "gpus_max: the range 0-2 starts at 0"),
        ({"gpus": 2, "gpus_max": 8}, "gpus: asked for 8 GPUs but this server has 4"),
        ({"gpus": 2, "gpus_max": "4"}, "gpus_max"),
        ({"gpus": 2, "gpus_max": 0}, "gpus_max"),
        ({"gpus": 2, "gpus_max": 4, "preemptible": False}, "resized through the preemption"),
        ({"gpus": 1, "gpus_max": 2, "gpu_mem": "1G"}, "sharing GPUs by memory"),
        ({"gpus": 2, "gpus_max": 4, "nodes": 2, "gpus_per_node": 1}, "on several nodes"),
    ],
)
def test_a_bad_range_is_a_422_with_its_reason(
    c: TestClient, fields: dict[str, Any], says: str
) -> None:
    r = post(c, **fields)
    assert r.status_code == 422 and says in r.json()["detail"], r.text


def test_a_session_cannot_be_elastic(c: TestClient) -> None:
    r = c.post(
        "/v1/jobs", json={"command": ["bash"], "interactive": True, "gpus": 1, "gpus_max": 2}
    )
    assert r.status_code == 422 and "a session cannot be resized" in r.json()["detail"], r.text


def test_an_update_keeps_the_least_within_the_range(c: TestClient) -> None:
    job = post(c, gpus=2, gpus_max=3, hold=True).json()
    r = c.patch(f"/v1/jobs/{job['id']}", json={"gpus": 4})
    assert r.status_code == 422 and "an elastic job's least, 1 to 3" in r.json()["detail"]
    assert c.patch(f"/v1/jobs/{job['id']}", json={"gpus": 3}).status_code == 200


def test_a_slurm_daemon_refuses_an_elastic_job() -> None:
    spec = JobSpec(name="j", owner="a", command=["t"], cwd="/", gpus=2, gpus_max=4)
    assert capabilities("slurm").refuses(spec) == (
        "gpus_max: this daemon runs jobs on Slurm, where a job's size is fixed"
    )
    assert capabilities("local").refuses(spec) is None
