"""Queue bounds at the door and ``GET /v1/queue``, in process (TestClient, a real file).

The cap on one user's queued and held jobs (``max_queued_per_user``): a job or a whole
sweep that would pass it is refused with 429 naming the cap, the rest of the queue is not
counted, and the cap frees as jobs leave the queue. The queue's screen: sweeps folded with
their counts, the rows bounded by ``limit``, the caller's own rows first when the listing is
long, and every job not shown counted by owner and state.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from fastapi.testclient import TestClient

from ddpq import entry
from ddpq.client.listing import hidden_text
from tests.inprocess import client_with_gpus
from tests.stub_api import Answer, Request, StubApi, json_answer

ACTIVE = "state=queued&state=held&state=starting&state=running"


@pytest.fixture
def api(tmp_path: Path) -> Iterator[TestClient]:
    yield from client_with_gpus(tmp_path / "home", gpus=2, max_queued_per_user=5)


def job(c: TestClient, owner: str, hold: bool = True) -> httpx2.Response:
    body = {"command": ["true"], "gpus": 0, "hold": hold, "owner": owner}
    r: httpx2.Response = c.post("/v1/jobs", json=body)
    return r


def sweep(c: TestClient, owner: str, n: int) -> httpx2.Response:
    body = {
        "template": {"command": ["true"], "gpus": 0, "hold": True, "owner": owner},
        "array": f"0-{n - 1}",
    }
    r: httpx2.Response = c.post("/v1/sweeps", json=body)
    return r


def view(c: TestClient, query: str = "", user: str = "root") -> Any:
    states = "" if "state=" in query else f"{ACTIVE}&"
    r = c.get(f"/v1/queue?{states}{query}", headers={"X-Ddpq-User": user})
    assert r.status_code == 200, r.text
    return r.json()


# ---- the cap on waiting jobs ---------------------------------------------------------


def test_a_job_past_the_cap_is_refused_naming_it(api: TestClient) -> None:
    for _ in range(5):
        assert job(api, "alice").status_code == 201
    r = job(api, "alice")
    assert r.status_code == 429, r.text
    assert r.json()["code"] == "queue_cap"
    assert r.json()["detail"] == (
        "alice has 5 jobs queued or held; the cap is 5 per user (max_queued_per_user), "
        "so this job would pass it"
    )
    assert job(api, "bob").status_code == 201  # another user's place is their own


def test_a_sweep_that_crosses_the_cap_is_refused_whole(api: TestClient) -> None:
    assert job(api, "alice").status_code == 201
    assert job(api, "alice").status_code == 201
    r = sweep(api, "alice", 4)
    assert r.status_code == 429, r.text
    assert "alice has 2 jobs queued or held" in r.json()["detail"]
    assert "these 4 jobs would pass it" in r.json()["detail"]
    assert api.get("/v1/jobs?limit=1").json()["total"] == 2  # none of its members queued
    assert sweep(api, "alice", 3).status_code == 201  # exactly up to the cap
    assert job(api, "alice").status_code == 429


def test_a_sweep_larger_than_the_cap_is_refused_on_an_empty_queue(api: TestClient) -> None:
    r = sweep(api, "carol", 6)
    assert r.status_code == 429 and "carol has 0 jobs" in r.json()["detail"]


def test_jobs_that_leave_the_queue_free_their_place(api: TestClient) -> None:
    ids = [job(api, "alice").json()["id"] for _ in range(5)]
    assert job(api, "alice").status_code == 429
    assert api.post(f"/v1/jobs/{ids[0]}/cancel").status_code == 200
    assert job(api, "alice").status_code == 201


def test_queued_jobs_count_as_held_ones_do(api: TestClient) -> None:
    for i in range(5):
        assert job(api, "alice", hold=i % 2 == 0).status_code == 201
    assert job(api, "alice", hold=False).status_code == 429


def test_a_user_past_a_lowered_cap_is_told_so_counted_no_further(tmp_path: Path) -> None:
    home = tmp_path / "home"
    for c in client_with_gpus(home, gpus=1, max_queued_per_user=0):
        assert sweep(c, "alice", 40).status_code == 201
    for c in client_with_gpus(home, gpus=1, max_queued_per_user=3):
        r = job(c, "alice")
        assert r.status_code == 429
        assert r.json()["detail"].startswith("alice has more than 3 jobs queued or held;")


def test_no_cap_when_it_is_zero(tmp_path: Path) -> None:
    for c in client_with_gpus(tmp_path / "home", gpus=1, max_queued_per_user=0):
        assert sweep(c, "alice", 20).status_code == 201
        assert job(c, "alice").status_code == 201


def test_the_cli_prints_the_refusal_as_one_line(tmp_path: Path) -> None:
    from ddpq.client.errors import api_error

    body = b'{"detail": "alice has 5 jobs queued or held; the cap is 5 per user", "code": "q"}'
    err = api_error(429, "Too Many Requests", body)
    assert err.exit_code == 1 and str(err).startswith("alice has 5 jobs queued or held")
    assert "\n" not in str(err)


# ---- the queue's screen --------------------------------------------------------------


def test_a_short_queue_is_listed_whole_with_sweeps_folded(api: TestClient) -> None:
    plain = [job(api, "alice").json()["id"] for _ in range(2)]
    s = sweep(api, "bob", 4).json()["id"]
    mine = job(api, "root").json()["id"]
    v = view(api)
    assert [j["id"] for j in v["jobs"]] == [*plain, mine]
    assert [(sw["id"], sw["counts"]) for sw in v["sweeps"]] == [(s, {"held": 4})]
    assert v["total"] == 7 and v["hidden"] == [] and v["only_owner"] is None
    expanded = view(api, "expand=true")
    assert len(expanded["jobs"]) == 7 and expanded["sweeps"] == []
    assert [j["id"] for j in expanded["jobs"]] == sorted(j["id"] for j in expanded["jobs"])


def test_a_long_queue_lists_the_callers_rows_and_counts_the_rest(api: TestClient) -> None:
    for owner in ("alice", "alice", "alice", "bob"):
        job(api, owner)
    s = sweep(api, "carol", 5).json()["id"]
    mine = [job(api, "root").json()["id"] for _ in range(2)]
    v = view(api, "limit=3")
    assert v["only_owner"] == "root"
    assert [j["id"] for j in v["jobs"]] == mine and v["sweeps"] == []
    assert v["hidden"] == [
        {"owner": "alice", "counts": {"held": 3}},
        {"owner": "bob", "counts": {"held": 1}},
        {"owner": "carol", "counts": {"held": 5}},
    ]
    assert v["total"] == 11
    # Someone else asking sees their own (none) and the same counts, root's among them.
    other = view(api, "limit=3", user="dave")
    assert other["jobs"] == [] and other["only_owner"] == "dave"
    assert {h["owner"] for h in other["hidden"]} == {"alice", "bob", "carol", "root"}
    # Asking for one owner lists theirs, oldest first, up to the limit.
    carol = view(api, "limit=3&user=carol")
    assert carol["only_owner"] is None and [sw["id"] for sw in carol["sweeps"]] == [s]
    assert carol["hidden"] == []
    pages = view(api, "limit=2&user=carol&expand=true")
    assert [j["sweep_id"] for j in pages["jobs"]] == [s, s]
    assert pages["hidden"] == [{"owner": "carol", "counts": {"held": 3}}]


def test_mine_is_the_callers_own(api: TestClient) -> None:
    job(api, "alice")
    own = job(api, "erin").json()["id"]
    v = view(api, "mine=true", user="erin")
    assert [j["id"] for j in v["jobs"]] == [own] and v["hidden"] == []


def test_the_limit_picks_the_oldest_across_states_and_sweeps(api: TestClient) -> None:
    held = job(api, "alice").json()["id"]
    queued = job(api, "alice", hold=False).json()["id"]
    s = sweep(api, "alice", 2).json()["id"]
    later = job(api, "alice").json()["id"]
    v = view(api, "limit=2&user=alice&expand=true")
    assert [j["id"] for j in v["jobs"]] == [held, queued]
    folded = view(api, "limit=2&user=alice")
    assert [j["id"] for j in folded["jobs"]] == [held, queued]
    assert [sw["id"] for sw in folded["sweeps"]] == [s]
    assert folded["hidden"] == [{"owner": "alice", "counts": {"held": 1}}]
    only_held = view(api, "state=held&limit=5&user=alice&expand=true")
    assert queued not in [j["id"] for j in only_held["jobs"]]
    assert later in [j["id"] for j in only_held["jobs"]]


@pytest.mark.parametrize("query", ["limit=0", "limit=1001", "user=" + "x" * 65, "state=nope"])
def test_a_bad_query_is_refused(api: TestClient, query: str) -> None:
    assert api.get(f"/v1/queue?{query}").status_code == 422


def test_asked_for_finished_jobs_too_the_limit_picks_the_newest(api: TestClient) -> None:
    """`ls --all` on a busy server: the newest rows, not the first jobs it ever ran (found
    by a new user's walk through the README)."""
    old = [job(api, "alice", hold=False).json()["id"] for _ in range(3)]
    for j in old:
        assert api.post(f"/v1/jobs/{j}/cancel").status_code == 200
    held = job(api, "alice").json()["id"]
    sweeps = [sweep(api, "alice", 1).json()["id"] for _ in range(3)]
    everything = view(api, "state=cancelled&state=held&limit=2&user=alice")
    assert [j["id"] for j in everything["jobs"]] == [old[2], held]  # printed oldest first
    assert [sw["id"] for sw in everything["sweeps"]] == sweeps[1:]
    assert everything["hidden"] == [{"owner": "alice", "counts": {"cancelled": 2, "held": 1}}]
    waiting = view(api, "state=held&limit=2&user=alice&expand=true")  # the queue's head
    assert waiting["jobs"][0]["id"] == held and len(waiting["jobs"]) == 2
    assert waiting["hidden"] == [{"owner": "alice", "counts": {"held": 2}}]  # newer members


def test_the_footer_says_whose_rows_are_listed_and_how_many_at_most() -> None:
    view_ = {"hidden": [{"owner": "bob", "counts": {"held": 3}}], "only_owner": "ann", "limit": 2}
    assert hidden_text(view_) == (
        "not listed (only ann's are listed, 2 at most; --user NAME or --limit 0 for more): "
        "bob 3 held"
    )
    assert hidden_text({**view_, "hidden": []}) == ""


@pytest.mark.parametrize(
    ("words", "ids"),
    [
        (["--limit", "3"], [1, 2, 3]),  # the queue's head
        (["--all", "--limit", "3"], [8, 9, 10]),  # with finished jobs: the newest
        (["--state", "failed", "--limit", "3"], [8, 9, 10]),
    ],
)
def test_ls_json_with_a_limit_picks_the_rows_the_table_would(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    words: list[str],
    ids: list[int],
) -> None:
    """`ls --all --json --limit N` gave the N oldest while the table showed the newest."""
    jobs = [{"id": i, "state": "queued"} for i in range(1, 11)]

    def answer(request: Request) -> Answer:
        offset, limit = (int(request.query[k][0]) for k in ("offset", "limit"))
        page = {"items": jobs[offset : offset + limit], "total": len(jobs)}
        return json_answer(200, {**page, "offset": offset, "limit": limit})

    with StubApi(answer) as stub:
        monkeypatch.setenv("DDPQ_URL", stub.url)
        monkeypatch.setattr(sys, "argv", ["ddpq", "ls", "--json", *words])
        entry.main()
    assert [j["id"] for j in json.loads(capsys.readouterr().out)] == ids
