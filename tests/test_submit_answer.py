"""A submission's answer: the job as ``JobOut`` has it, serialized in the route's own thread.

FastAPI validates the model a plain ``def`` route returns once more, in its thread pool: a
second hop between threads on the API's busiest call. The route answers with the body
itself (``views.answer``); what a client reads and what the API's documentation says must
not change with it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio.to_thread
import pytest
from fastapi.testclient import TestClient

from ddpq.schemas import JobOut
from tests.inprocess import client_with_gpus

SUBMISSIONS: list[dict[str, Any]] = [
    {"command": ["true"], "gpus": 1},
    {"command": ["python", "train.py", "--lr", "0.1"], "gpus": 2, "name": "lr", "priority": 3},
    {"command": ["sleep", "1"], "gpus": 0, "hold": True, "time_limit_s": 60, "retries": 2},
    {"command": ["x"], "gpus": 1, "gpu_mem": "4GiB", "env": {"A": "1"}},
]


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    yield from client_with_gpus(tmp_path / "home")


@pytest.mark.parametrize("body", SUBMISSIONS)
def test_the_answer_is_the_job_as_jobout_serializes_it(
    client: TestClient, body: dict[str, Any]
) -> None:
    r = client.post("/v1/jobs", json=body)
    assert r.status_code == 201, r.text
    assert r.headers["content-type"] == "application/json"
    answer = r.json()
    assert set(answer) == {f.alias or name for name, f in JobOut.model_fields.items()}
    # What the job's own page says of it, field for field.
    shown = client.get(f"/v1/jobs/{answer['id']}").json()
    assert {k: shown[k] for k in answer} == answer
    assert JobOut.model_validate(answer).model_dump(mode="json", by_alias=True) == answer


def test_the_documentation_still_names_jobout(client: TestClient) -> None:
    doc = client.get("/openapi.json").json()
    created = doc["paths"]["/v1/jobs"]["post"]["responses"]["201"]
    schema = created["content"]["application/json"]["schema"]
    assert schema == {"$ref": "#/components/schemas/JobOut"}


def test_a_submission_takes_one_hop_to_the_thread_pool(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    client.post("/v1/jobs", json=SUBMISSIONS[0])  # the route's validators built, outside
    hops: list[str] = []
    original = anyio.to_thread.run_sync

    async def counted(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        hops.append(getattr(func, "__name__", repr(func)))
        return await original(func, *args, **kwargs)

    # Where every trip to a worker thread goes, whichever of Starlette's or FastAPI's
    # helpers takes it.
    monkeypatch.setattr(anyio.to_thread, "run_sync", counted)
    r = client.post("/v1/jobs", json=SUBMISSIONS[0])
    assert r.status_code == 201, r.text
    assert len(hops) == 1, hops  # the route itself; before, its answer was a second


@pytest.mark.parametrize("step", ["job_out", "answer"])
def test_a_submission_whose_answer_fails_queues_nothing(
    client: TestClient, monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    """Its answer is made, and serialized, in its transaction: a client that retries a
    failed submission must not end with the job queued twice."""

    def broken(*_: object) -> None:
        raise RuntimeError("no answer")

    monkeypatch.setattr(f"ddpq.server.views.{step}", broken)
    r = client.post("/v1/jobs", json=SUBMISSIONS[0])
    assert r.status_code == 500
    monkeypatch.undo()
    assert client.get("/v1/jobs").json()["items"] == []
