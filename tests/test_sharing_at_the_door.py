"""Sharing GPUs by memory at the API's door, beside the cluster fields: a daemon on Slurm
refuses a sharing job (Slurm gives whole GPUs), single or in a sweep, and nodes never share;
a local daemon takes the same submission."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.inprocess import client_with_gpus
from tests.test_api_cluster_jobs import submit


@pytest.fixture
def slurm_api(tmp_path: Path) -> Iterator[TestClient]:
    yield from client_with_gpus(tmp_path / "home", executor="slurm")


@pytest.fixture
def local_api(tmp_path: Path) -> Iterator[TestClient]:
    yield from client_with_gpus(tmp_path / "home")


SHARING = [{"gpu_mem": "4G"}, {"gpu_mem": "auto"}, {"gpu_mem": 1 << 30, "gpu_share": 2}]


@pytest.mark.parametrize("fields", SHARING)
def test_a_slurm_daemon_refuses_a_sharing_job_with_the_reason(
    slurm_api: TestClient, fields: dict[str, Any]
) -> None:
    r = submit(slurm_api, **fields)
    assert r.status_code == 422, r.text
    assert "gpu_mem" in r.json()["detail"] and "whole GPUs" in r.json()["detail"]
    sweep = slurm_api.post(
        "/v1/sweeps",
        json={"template": {"command": ["echo", "{x}"], **fields}, "params": {"x": ["1", "2"]}},
    )
    assert sweep.status_code == 422 and "whole GPUs" in sweep.json()["detail"], sweep.text
    assert slurm_api.get("/v1/jobs").json()["total"] == 0
    # Without the memory fields the same job is welcome there.
    assert submit(slurm_api, gpus=1).status_code == 201


@pytest.mark.parametrize("fields", SHARING)
def test_a_local_daemon_takes_it(local_api: TestClient, fields: dict[str, Any]) -> None:
    r = submit(local_api, **fields)
    assert r.status_code == 201, r.text


@pytest.mark.parametrize(
    "cluster", [{"nodes": 2, "gpus_per_node": 1}, {"gpus_per_node": 1}, {"nodes": 1, "gpus": 2}]
)
def test_a_job_on_nodes_does_not_share(slurm_api: TestClient, cluster: dict[str, Any]) -> None:
    r = submit(slurm_api, gpu_mem="4G", **cluster)
    assert r.status_code == 422 and "gpu_mem" in r.json()["detail"], r.text
