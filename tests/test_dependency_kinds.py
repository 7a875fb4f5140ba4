"""Slurm's dependency kinds at the API (``dependency``: afterok, afterany, afternotok,
singleton) and in the store: a held job's reason, its release, and the end of one whose
dependency can never be met. Jobs end here through the store (``end``): how they ran is
not what this file checks; ``tests/test_update_restart_e2e.py`` runs real ones."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from ddpq.core.states import JobState
from ddpq.store import settling, transitions
from ddpq.store.db import Database
from tests.inprocess import client_with_gpus


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


@pytest.fixture
def c(home: Path) -> Iterator[TestClient]:
    yield from client_with_gpus(home, gpus=2)


def submit(c: TestClient, **fields: Any) -> dict[str, Any]:
    r = c.post("/v1/jobs", json={"command": ["true"], **fields})
    assert r.status_code == 201, r.text
    body: dict[str, Any] = r.json()
    return body


def show(c: TestClient, job_id: int) -> dict[str, Any]:
    body: dict[str, Any] = c.get(f"/v1/jobs/{job_id}").json()
    return body


def end(home: Path, job_id: int, state: JobState) -> None:
    """The job ran and ended in ``state``, and those waiting on it were told, as the
    worker's record of an end does (``store.endings``)."""
    now = time.time()
    with Database(home / "ddpq.db").write() as s:
        path = [JobState.QUEUED, JobState.STARTING, JobState.RUNNING, state]
        for old, new in itertools.pairwise(path):
            assert transitions.move(s, job_id, old, new, "test", now)
        settling.settle_dependents(s, job_id, now)


def test_afterany_waits_for_an_end_of_any_kind(c: TestClient, home: Path) -> None:
    first = submit(c)["id"]
    waiting = submit(c, dependency=f"afterany:{first}")
    assert (waiting["state"], waiting["reason"]) == ("held", f"waiting for job {first} to end")
    assert waiting["dependency"] == f"afterany:{first}" and waiting["after"] == []
    end(home, first, JobState.FAILED)
    assert show(c, waiting["id"])["state"] == "queued"


def test_afternotok_runs_after_a_failure_and_is_cancelled_by_a_success(
    c: TestClient, home: Path
) -> None:
    ok, bad = submit(c)["id"], submit(c)["id"]
    on_ok = submit(c, dependency=f"afternotok:{ok}")["id"]
    on_bad = submit(c, dependency=f"afternotok:{bad}")["id"]
    assert show(c, on_ok)["reason"] == f"waiting for job {ok} to end without success"
    end(home, ok, JobState.SUCCEEDED)
    end(home, bad, JobState.FAILED)
    cancelled = show(c, on_ok)
    assert (cancelled["state"], cancelled["reason"]) == (
        "cancelled",
        f"dependency {ok} succeeded; afternotok can never be met",
    )
    assert show(c, on_bad)["state"] == "queued"
    # On a job that has ended already, the verdict is at once.
    assert submit(c, dependency=f"afternotok:{ok}")["state"] == "cancelled"
    assert submit(c, dependency=f"afterany:{ok},afternotok:{bad}")["state"] == "queued"


def test_kinds_mix_with_after_and_sweeps(c: TestClient, home: Path) -> None:
    a, b = submit(c)["id"], submit(c)["id"]
    r = c.post(
        "/v1/sweeps",
        json={"template": {"command": ["echo", "{x}"]}, "params": {"x": ["1", "2"]}},
    )
    assert r.status_code == 201, r.text
    sweep = r.json()
    members = [m["id"] for m in c.get(f"/v1/sweeps/{sweep['id']}").json()["members"]]
    job = submit(c, after=[a], dependency=f"afterany:{b}:s{sweep['id']}")
    assert job["dependency"] == f"afterok:{a},afterany:{b}:s{sweep['id']}"
    assert job["reason"] == (
        f"waiting for job {a} to succeed; waiting for job {b} to end; "
        f"waiting for every job of sweep {sweep['id']} to end"
    )
    end(home, a, JobState.SUCCEEDED)
    end(home, b, JobState.CANCELLED)
    end(home, members[0], JobState.FAILED)
    assert show(c, job["id"])["state"] == "held"
    end(home, members[1], JobState.SUCCEEDED)
    assert show(c, job["id"])["state"] == "queued"


def test_a_sweep_may_wait_with_a_kind_too(c: TestClient, home: Path) -> None:
    first = submit(c)["id"]
    r = c.post(
        "/v1/sweeps",
        json={
            "template": {"command": ["echo", "{x}"], "dependency": f"afternotok:{first}"},
            "params": {"x": ["1", "2"]},
        },
    )
    assert r.status_code == 201, r.text
    members = c.get(f"/v1/sweeps/{r.json()['id']}").json()["members"]
    assert {m["state"] for m in members} == {"held"}
    end(home, first, JobState.SUCCEEDED)
    after = c.get(f"/v1/sweeps/{r.json()['id']}").json()["members"]
    assert {m["state"] for m in after} == {"cancelled"}


def test_singleton_runs_one_job_of_a_name_and_user_at_a_time(c: TestClient, home: Path) -> None:
    first = submit(c, name="train")["id"]
    other_name = submit(c, name="eval", dependency="singleton")
    other_user = submit(c, name="train", owner="bob", dependency="singleton")
    assert other_name["state"] == other_user["state"] == "queued"
    second = submit(c, name="train", dependency="singleton")
    third = submit(c, name="train", dependency="singleton")
    assert second["state"] == "held"
    assert second["reason"] == (
        f"singleton: waiting for job {first} of the same name and user to end"
    )
    assert third["reason"].endswith(f"job {first}, {second['id']} of the same name and user to end")
    assert show(c, second["id"])["dependency"] == "singleton"
    end(home, first, JobState.FAILED)
    assert show(c, second["id"])["state"] == "queued"
    assert show(c, third["id"])["state"] == "held"
    r = c.post(f"/v1/jobs/{second['id']}/cancel")
    assert r.status_code == 200, r.text
    assert show(c, third["id"])["state"] == "queued"


@pytest.mark.parametrize(
    ("dependency", "status", "says"),
    [
        ("afterevery:1", 422, "not a dependency kind ddpq knows"),
        ("afterok:one", 422, "is not a job id or a sweep"),
        ("afterok:1,afterany:1", 422, "named as both"),
        ("afterok:1|afterany:2", 422, "is not a job id"),
        ("x" * 3000, 422, "dependency"),
        ("afterok:999", 404, "no job 999"),
        ("afterany:2", 404, "no job 2"),  # its own id to be: not there when it is named
        ("afterany:s999", 404, "no sweep 999"),
    ],
)
def test_a_bad_dependency_is_refused_with_its_reason(
    c: TestClient, dependency: str, status: int, says: str
) -> None:
    submit(c)  # job 1
    r = c.post("/v1/jobs", json={"command": ["true"], "dependency": dependency})
    assert r.status_code == status, r.text
    assert says in r.json()["detail"]


def test_after_and_another_kind_on_one_job_is_refused(c: TestClient) -> None:
    first = submit(c)["id"]
    r = c.post(
        "/v1/jobs", json={"command": ["true"], "after": [first], "dependency": f"afterany:{first}"}
    )
    assert r.status_code == 422
    assert f"{first} is named as both afterok and afterany" in r.json()["detail"]
    r = c.post("/v1/jobs", json={"command": ["true"], "dependency": 5})
    assert r.status_code == 422  # strict: a string only


def test_a_renamed_job_leaves_its_old_names_singletons_and_joins_its_new_ones(
    c: TestClient,
) -> None:
    first = submit(c, name="a")["id"]
    other = submit(c, name="b")["id"]
    waiting = submit(c, name="a", dependency="singleton")["id"]
    assert show(c, waiting)["state"] == "held"
    r = c.patch(f"/v1/jobs/{first}", json={"name": "c"})
    assert r.status_code == 200, r.text
    assert show(c, waiting)["state"] == "queued"  # nothing earlier is named a now
    r = c.patch(f"/v1/jobs/{waiting}", json={"name": "b"})
    assert r.status_code == 200, r.text
    moved = show(c, waiting)
    assert (moved["state"], moved["reason"]) == (
        "held",
        f"singleton: waiting for job {other} of the same name and user to end",
    )


def test_a_job_renamed_to_a_later_queued_singletons_name_holds_it_back(c: TestClient) -> None:
    """The later singleton was queued (nothing of its name before it); the earlier job now
    named like it must end first, so it is held again, with the reason."""
    earlier = submit(c, name="x")["id"]
    later = submit(c, name="train", dependency="singleton")["id"]
    assert show(c, later)["state"] == "queued"
    r = c.patch(f"/v1/jobs/{earlier}", json={"name": "train"})
    assert r.status_code == 200, r.text
    held = show(c, later)
    assert (held["state"], held["reason"]) == (
        "held",
        f"singleton: waiting for job {earlier} of the same name and user to end",
    )
