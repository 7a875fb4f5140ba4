"""``PATCH /v1/jobs/{id}`` (``ddpq update``) and ``POST /v1/jobs/{id}/restart``
(``ddpq restart``) in-process: what changes when, the event each change leaves, and the
refusals (409 for a job past changing, 403 for another's or a priority only admins set,
422 for what the daemon could not run). Jobs are moved through the store (``start``,
``end``): how they run is not what this file checks."""

from __future__ import annotations

import itertools
import os
import pwd
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from ddpq.core import edits
from ddpq.core.states import JobState
from ddpq.store import transitions
from ddpq.store import users as user_store
from ddpq.store.db import Database
from tests.inprocess import client_with_gpus

Q, H, R, S = JobState.QUEUED, JobState.HELD, JobState.RUNNING, JobState.SUCCEEDED


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


@pytest.fixture
def c(home: Path) -> Iterator[TestClient]:
    yield from client_with_gpus(home, gpus=4)


def submit(c: TestClient, **fields: Any) -> dict[str, Any]:
    r = c.post("/v1/jobs", json={"command": ["true"], **fields})
    assert r.status_code == 201, r.text
    body: dict[str, Any] = r.json()
    return body


def patch(c: TestClient, job_id: int, **fields: Any) -> Any:
    return c.patch(f"/v1/jobs/{job_id}", json=fields)


def move(home: Path, job_id: int, *path: JobState) -> None:
    with Database(home / "ddpq.db").write() as s:
        for old, new in itertools.pairwise(path):
            assert transitions.move(s, job_id, old, new, "test", time.time())


def events(c: TestClient, job_id: int) -> list[str]:
    return [e["reason"] for e in c.get(f"/v1/jobs/{job_id}").json()["events"]]


def test_a_queued_job_takes_each_field_in_one_write_with_its_event(c: TestClient) -> None:
    job = submit(c, name="first", priority=1, time_limit_s=3600)
    r = patch(c, job["id"], priority=7, time_limit_s=600, gpus=2, name="second")
    assert r.status_code == 200, r.text
    out = r.json()
    assert (out["priority"], out["time_limit_s"], out["gpus"], out["name"]) == (
        7,
        600,
        2,
        "second",
    )
    assert out["state"] == "queued"
    assert events(c, job["id"])[-1] == (
        "updated by "
        + out["owner"]
        + ": priority 1 -> 7, time limit 1h00m -> 10m00s, GPUs 0 -> 2, name first -> second"
    )
    held = patch(c, job["id"], hold=True).json()
    assert (held["state"], held["reason"]) == ("held", "held by user")
    released = patch(c, job["id"], hold=False, no_time_limit=True).json()
    assert (released["state"], released["time_limit_s"]) == ("queued", None)


def test_a_running_job_changes_only_its_time_limit(c: TestClient, home: Path) -> None:
    job = submit(c, time_limit_s=3600)
    move(home, job["id"], Q, JobState.STARTING, R)
    r = patch(c, job["id"], gpus=2, priority=3)
    assert r.status_code == 409
    assert "once started only its time limit can change, not its priority, GPUs" in r.text
    assert patch(c, job["id"], hold=True).status_code == 409
    r = patch(c, job["id"], time_limit_s=1800)
    assert r.status_code == 200 and r.json()["time_limit_s"] == 1800
    move(home, job["id"], R, S)
    r = patch(c, job["id"], priority=3)
    assert r.status_code == 409 and "ddpq restart" in r.json()["detail"]


def test_the_rules_with_plain_data() -> None:
    no_hold: dict[str, Any] = {"hold": None}
    user = dict(admin=False, time_limit_s=600.0, **no_hold)
    assert edits.update_refusal(H, {"gpus": 2}, **user) is None
    assert edits.update_refusal(R, {"time_limit_s": 300.0}, **user) is None
    raised = edits.update_refusal(R, {"time_limit_s": 900.0}, **user)
    assert raised is not None and "may only lower its time limit (now 10m00s)" in raised
    assert edits.update_refusal(R, {"time_limit_s": None}, **user) is not None
    admin = dict(admin=True, time_limit_s=600.0, **no_hold)
    assert edits.update_refusal(R, {"time_limit_s": None}, **admin) is None
    unlimited = dict(admin=False, time_limit_s=None, **no_hold)
    assert edits.update_refusal(R, {"time_limit_s": 60.0}, **unlimited) is None
    assert edits.restart_refusal(Q) is not None and edits.restart_refusal(S) is None
    assert edits.restart_refusal(R) is None


@pytest.mark.parametrize(
    ("fields", "status", "says"),
    [
        ({}, 422, "nothing to change"),
        ({"gpus": "2"}, 422, "gpus"),
        ({"gpus": 99}, 422, "this server has 4"),
        ({"priority": 5000}, 422, "priority"),
        ({"time_limit_s": -1}, 422, "time_limit_s"),
        ({"time_limit_s": 60, "no_time_limit": True}, 422, "not both"),
        ({"name": "bad name!"}, 422, "name"),
        ({"state": "running"}, 422, "state"),
    ],
)
def test_bad_changes_are_refused_with_the_reason(
    c: TestClient, fields: dict[str, Any], status: int, says: str
) -> None:
    job = submit(c)
    r = patch(c, job["id"], **fields)
    assert r.status_code == status, r.text
    assert says in r.json()["detail"]


def test_an_unknown_job_is_404(c: TestClient) -> None:
    assert patch(c, 999, priority=1).status_code == 404
    assert c.post("/v1/jobs/999/restart").status_code == 404
    assert patch(c, 0, priority=1).status_code == 422


def test_sharing_or_typed_jobs_keep_a_gpu(c: TestClient) -> None:
    job = submit(c, gpu_mem="1G")
    r = patch(c, job["id"], gpus=0)
    assert r.status_code == 422 and "shares GPUs by memory" in r.json()["detail"]


def test_a_change_is_held_to_the_rules_a_submission_is(c: TestClient) -> None:
    linked = submit(c, gpus=2, gpu_link="sys")  # any set: the fake GPUs have no NVLink
    r = patch(c, linked["id"], gpus=1)
    assert r.status_code == 422 and "2 or more GPUs" in r.json()["detail"]
    session = submit(c, gpus=1, interactive=True, command=["serve", "--port", "{port}"])
    r = patch(c, session["id"], gpus=0)
    assert r.status_code == 422 and "{port} needs a leased port" in r.json()["detail"]
    assert patch(c, linked["id"], gpus=3).status_code == 200


def test_restart_queues_a_new_job_with_the_same_spec(c: TestClient, home: Path) -> None:
    first = submit(c, command=["echo", "hi"], name="train", gpus=1, time_limit_s=60)
    waiting = c.post(f"/v1/jobs/{first['id']}/restart")
    assert waiting.status_code == 409 and "has not run yet" in waiting.json()["detail"]
    dep = submit(c)
    move(home, dep["id"], Q, JobState.STARTING, R, S)
    on_dep = submit(c, command=["echo", "x"], after=[dep["id"]])
    move(home, first["id"], Q, JobState.STARTING, R, JobState.FAILED)
    r = c.post(f"/v1/jobs/{first['id']}/restart", json={"gpus": 2, "priority": 4})
    assert r.status_code == 201, r.text
    again = r.json()
    assert again["id"] > first["id"] and again["state"] == "queued"
    assert (again["command"], again["name"], again["time_limit_s"]) == (["echo", "hi"], "train", 60)
    assert (again["gpus"], again["priority"]) == (2, 4)
    assert events(c, again["id"])[-1].startswith(f"restart of job {first['id']} by ")
    # What the first run waited for is not waited for again.
    move(home, on_dep["id"], Q, JobState.STARTING, R)
    plain = c.post(f"/v1/jobs/{on_dep['id']}/restart").json()
    assert (plain["after"], plain["dependency"], plain["state"]) == ([], "", "queued")
    held = c.post(f"/v1/jobs/{on_dep['id']}/restart", json={"hold": True}).json()
    assert held["state"] == "held"


def test_with_auth_only_the_owner_changes_or_restarts_and_priority_stays_capped(
    home: Path,
) -> None:
    with client_with_gpus_auth(home) as (c, alice, bob, boss):
        job = submit_as(c, alice, time_limit_s=600)
        assert patch_as(c, bob, job, priority=1).status_code == 403
        assert patch_as(c, alice, job, priority=101).status_code == 403
        assert patch_as(c, boss, job, priority=500).status_code == 200
        move(home, job, Q, JobState.STARTING, R)
        assert patch_as(c, alice, job, time_limit_s=6000).status_code == 409
        assert patch_as(c, boss, job, time_limit_s=6000).status_code == 200
        auth = {"Authorization": f"Bearer {bob}"}
        assert c.post(f"/v1/jobs/{job}/restart", headers=auth).status_code == 403
        auth = {"Authorization": f"Bearer {boss}"}
        r = c.post(f"/v1/jobs/{job}/restart", headers=auth)
        assert r.status_code == 403 and "only its owner" in r.json()["detail"]
        auth = {"Authorization": f"Bearer {alice}"}
        r = c.post(f"/v1/jobs/{job}/restart", headers=auth, json={"priority": 500})
        assert r.status_code == 403  # as a submission: only admins set that
        r = c.post(f"/v1/jobs/{job}/restart", headers=auth)
        assert r.status_code == 403  # nor keeps the 500 the admin gave the first run
        assert "priority: at most 100 for users" in r.json()["detail"]
        r = c.post(f"/v1/jobs/{job}/restart", headers=auth, json={"priority": 5})
        assert r.status_code == 201 and r.json()["owner"] == "alice"
        assert r.json()["priority"] == 5


@contextmanager
def client_with_gpus_auth(home: Path) -> Iterator[tuple[TestClient, str, str, str]]:
    """An in-process API with --auth and users alice, bob and an admin, boss."""
    for c in client_with_gpus(home, gpus=4, auth=True):
        me = pwd.getpwuid(os.geteuid()).pw_name
        tokens = []
        with Database(home / "ddpq.db").write() as s:
            for name, admin in (("alice", False), ("bob", False), ("boss", True)):
                _, token = user_store.add_user(s, name, admin=admin, unix_user=me, now=time.time())
                tokens.append(token)
        yield c, tokens[0], tokens[1], tokens[2]


def submit_as(c: TestClient, token: str, **fields: Any) -> int:
    auth = {"Authorization": f"Bearer {token}"}
    r = c.post("/v1/jobs", json={"command": ["true"], **fields}, headers=auth)
    assert r.status_code == 201, r.text
    job_id: int = r.json()["id"]
    return job_id


def patch_as(c: TestClient, token: str, job_id: int, **fields: Any) -> Any:
    return c.patch(f"/v1/jobs/{job_id}", json=fields, headers={"Authorization": f"Bearer {token}"})


def test_a_running_jobs_time_limit_changes_though_its_kind_of_gpu_has_gone(
    c: TestClient, home: Path
) -> None:
    """Its hardware is judged anew only with a new count of GPUs (found by review: a GPU
    off the bus made `update --time-limit` of a running job of its type a 422)."""
    job = submit(c, gpus=1, gpu_type="fake")
    move(home, job["id"], Q, JobState.STARTING, R)
    with Database(home / "ddpq.db").write() as s:
        s.execute(text("UPDATE devices SET name = 'other'"))  # the worker sees other GPUs now
    assert patch(c, job["id"], time_limit_s=600).status_code == 200
    waiting = submit(c, gpus=1, gpu_type="oth")
    with Database(home / "ddpq.db").write() as s:
        s.execute(text("UPDATE devices SET name = 'fake'"))
    refused = patch(c, waiting["id"], gpus=2)
    assert refused.status_code == 422 and "of type 'oth'" in refused.json()["detail"]
