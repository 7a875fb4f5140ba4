"""POST/GET /v1/sweeps and the jobs' side of sweeps, in process (TestClient, a real file).

What a sweep queues (the product, an array, placeholders, a workload's options), what is
refused at the door and why, the views (counts, members sorted by a metric), the writes
on a whole sweep (and who may make them), ``after_sweeps``, and a job's metrics history.
"""

from __future__ import annotations

import json
import os
import pwd
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from fastapi.testclient import TestClient

from ddpq.store import jobs as job_store
from ddpq.store import users as user_store
from ddpq.store.db import Database
from ddpq.store.models import Sweep
from tests.inprocess import lent_client, publish_fake_gpus


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


@pytest.fixture
def api(home: Path) -> Iterator[TestClient]:
    with lent_client(home, fake_gpus=2) as c:
        publish_fake_gpus(home / "ddpq.db", 2, memory_mb=1000)
        yield c


def post(c: TestClient, path: str, body: Any = None, token: str | None = None) -> httpx2.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    response: httpx2.Response = c.post(path, json=body, headers=headers)
    return response


def get(c: TestClient, path: str, token: str | None = None) -> Any:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    response: httpx2.Response = c.get(path, headers=headers)
    assert response.status_code == 200, response.text
    return response.json()


def refused(r: httpx2.Response, status: int, *words: str) -> None:
    assert r.status_code == status, r.text
    detail = r.json()["detail"]
    for word in words:
        assert word in detail, detail


def job_count(c: TestClient) -> int:
    total: int = get(c, "/v1/jobs?limit=1")["total"]
    return total


def stored(home: Path, job_id: int) -> tuple[list[str], dict[str, str]]:
    with Database(home / "ddpq.db").read() as s:
        job = job_store.get_job(s, job_id)
        return list(job.command), dict(job.env)


# ---- what a sweep queues ------------------------------------------------------------


def test_one_call_queues_the_product_of_a_workloads_parameters(api: TestClient, home: Path) -> None:
    body = {
        "template": {
            "workload": "resnet18",
            "args": ["--epochs", "2", "--synthetic", "64"],  # no CIFAR-10 here
            "gpus": 1,
            "name": "rn",
        },
        "params": {"lr": ["0.05", "0.1"], "batch-size": ["64", "128"]},
    }
    r = post(api, "/v1/sweeps", body)
    assert r.status_code == 201, r.text
    sweep = r.json()
    assert (sweep["size"], sweep["counts"], sweep["done"]) == (4, {"queued": 4}, False)
    detail = get(api, f"/v1/sweeps/{sweep['id']}")
    got = [(m["index"], m["params"], m["name"]) for m in detail["members"]]
    assert got == [
        (0, {"lr": "0.05", "batch-size": "64"}, "rn-0-lr0.05-batch-size64"),
        (1, {"lr": "0.05", "batch-size": "128"}, "rn-1-lr0.05-batch-size128"),
        (2, {"lr": "0.1", "batch-size": "64"}, "rn-2-lr0.1-batch-size64"),
        (3, {"lr": "0.1", "batch-size": "128"}, "rn-3-lr0.1-batch-size128"),
    ]
    command, env = stored(home, detail["members"][3]["id"])
    assert command == [
        "-m",
        "ddpq.workloads.resnet18",
        "--epochs",
        "2",
        "--synthetic",
        "64",
        "--lr",
        "0.1",
        "--batch-size",
        "128",
    ]
    assert env["DDPQ_SWEEP_ID"] == str(sweep["id"]) and env["DDPQ_SWEEP_INDEX"] == "3"
    assert json.loads(env["DDPQ_SWEEP_PARAMS"]) == {"lr": "0.1", "batch-size": "128"}
    # The jobs' listing carries each member's sweep, so a client can fold it into a line.
    items = get(api, "/v1/jobs")["items"]
    assert [(j["sweep_id"], j["sweep_index"]) for j in items] == [
        (sweep["id"], i) for i in range(4)
    ]
    assert all(j["launcher"] == "torchrun" for j in items)


def test_a_commands_placeholders_are_filled_and_an_arrays_index_given(
    api: TestClient, home: Path
) -> None:
    r = post(
        api,
        "/v1/sweeps",
        {
            "template": {"command": ["sh", "-c", "echo {a}-{b} ${HOME} {{a}}"], "env": {"X": "1"}},
            "params": {"a": ["1", "2"], "b": ["x", "y", "z"]},
        },
    )
    assert r.status_code == 201, r.text
    members = get(api, f"/v1/sweeps/{r.json()['id']}")["members"]
    assert [stored(home, m["id"])[0][2] for m in members] == [
        f"echo {a}-{b} ${{HOME}} {{a}}" for a in "12" for b in "xyz"
    ]
    assert stored(home, members[0]["id"])[1]["X"] == "1"  # the template's env too

    r = post(api, "/v1/sweeps", {"template": {"command": ["run", "{index}"]}, "array": "0-8:4%2"})
    assert r.status_code == 201, r.text
    assert (r.json()["size"], r.json()["max_running"], r.json()["array"]) == (3, 2, "0-8:4%2")
    members = get(api, f"/v1/sweeps/{r.json()['id']}")["members"]
    assert [(m["index"], stored(home, m["id"])[0]) for m in members] == [
        (0, ["run", "0"]),
        (4, ["run", "4"]),
        (8, ["run", "8"]),
    ]
    assert [stored(home, m["id"])[1]["DDPQ_SWEEP_INDEX"] for m in members] == ["0", "4", "8"]


def test_a_sweeps_url_is_the_sweeps_alone_and_never_served(api: TestClient, home: Path) -> None:
    # An address, not a name: a name must resolve at submission, and tests run offline.
    url = "https://198.51.100.7/services/T0/B0/SECRET"
    body = {"template": {"command": ["true"], "notify": url}, "array": "0-2"}
    r = post(api, "/v1/sweeps", body)
    assert r.status_code == 201, r.text
    shown = get(api, f"/v1/sweeps/{r.json()['id']}")
    assert shown["notify"] is True and shown["notifications"] == []
    members = [get(api, f"/v1/jobs/{m['id']}") for m in shown["members"]]
    assert [m["notify"] for m in members] == [False] * 3  # a member sends nothing of its own
    assert "SECRET" not in json.dumps([shown, members])
    with Database(home / "ddpq.db").read() as s:  # one copy of the secret: the sweep's
        sweep = s.get(Sweep, r.json()["id"])
        assert sweep is not None and sweep.notify_url == url and "notify" not in sweep.template
    plain = post(api, "/v1/sweeps", {"template": {"command": ["true"]}, "array": "0-1"})
    assert get(api, f"/v1/sweeps/{plain.json()['id']}")["notify"] is False


def test_a_thousand_member_array_is_one_call(api: TestClient) -> None:
    before = job_count(api)
    r = post(api, "/v1/sweeps", {"template": {"command": ["true"]}, "array": "0-999%10"})
    assert r.status_code == 201, r.text
    assert r.json()["counts"] == {"queued": 1000}
    assert job_count(api) == before + 1000
    assert get(api, "/v1/sweeps")["items"][-1]["size"] == 1000


def test_members_wait_and_are_held_like_any_job(api: TestClient) -> None:
    first = post(api, "/v1/jobs", {"command": ["true"]}).json()["id"]
    r = post(
        api, "/v1/sweeps", {"template": {"command": ["true"], "after": [first]}, "array": "1-3"}
    )
    assert r.json()["counts"] == {"held": 3}
    members = get(api, f"/v1/sweeps/{r.json()['id']}")["members"]
    assert {m["reason"] for m in members} == {f"waiting for job {first} to succeed"}
    r = post(api, "/v1/sweeps", {"template": {"command": ["true"], "hold": True}, "array": "1-2"})
    assert r.json()["counts"] == {"held": 2}


# ---- refused at the door ------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (
            {"template": {"command": ["echo", "{lr}"]}, "params": {"lr": ["1"], "bs": ["2"]}},
            ["params.bs", "used nowhere"],
        ),
        (
            {"template": {"command": ["echo", "{bs}"]}, "params": {"lr": ["1"]}},
            ["{bs}", "names no parameter"],
        ),
        ({"template": {"command": ["echo", "{lr}"]}, "array": "0-3"}, ["{lr}", "no parameter"]),
        (
            {"template": {"command": ["echo"]}, "array": "0-999999999"},
            ["1000000000 indices", "at most 10000"],
        ),
        (
            {
                "template": {"command": ["echo", "{a}{b}{c}"]},
                "params": {k: [str(i) for i in range(1000)] for k in "abc"},
            },
            ["1000000000 combinations", "at most 10000"],
        ),
        ({"template": {"command": ["echo"]}, "array": "9-3"}, ["ends before it starts"]),
        ({"template": {"command": ["echo"]}, "array": "0-9%0"}, ["%0"]),
        ({"template": {"command": ["echo"]}, "array": "0-9%2", "max_running": 3}, ["cap once"]),
        (
            {"template": {"command": ["echo", "{index}"]}, "array": "0-3", "params": {"a": ["1"]}},
            ["params or an array, not both"],
        ),
        ({"template": {"command": ["echo"]}}, ["give params", "or an array"]),
        ({"template": {"command": ["echo", "{index}"]}, "params": {"index": ["1"]}}, ["'index'"]),
        (
            {"template": {"command": ["echo", "{a}"]}, "params": {"a": ["1", "1"]}},
            ["params.a", "listed twice"],
        ),
        ({"template": {"command": ["echo", "{a}"]}, "params": {"a": []}}, ["at least one value"]),
        ({"template": {"command": ["echo", "{a}"]}, "params": {"a": [1]}}, ["params.a"]),
        (
            {"template": {"workload": "resnet18"}, "params": {"lr": ["fast"]}},
            ["params.lr", "must be a number, got 'fast'"],
        ),
        (
            {"template": {"workload": "resnet18"}, "params": {"bogus": ["1"]}},
            ["params.bogus", "unrecognized arguments"],
        ),
        (
            {"template": {"workload": "resnet18", "args": ["--lr", "1"]}, "params": {"lr": ["2"]}},
            ["--lr is in the template's args too"],
        ),
        (
            {
                "template": {"workload": "resnet18", "args": ["--lr", "{lr}"]},
                "params": {"lr": ["2"]},
            },
            ["{lr}", "become its options"],
        ),
        (
            {"template": {"workload": "resnet18", "args": ["--epochs", "{index}"]}, "array": "0-2"},
            ["member 0", "--epochs"],
        ),
        (
            {"template": {"command": ["echo", "{index}"], "gpus": 3}, "array": "0-1"},
            ["gpus", "this server has 2"],
        ),
        (
            {
                "template": {"command": ["x" * 4096] * 16, "env": {"A": "y" * 30000}},
                "array": "0-9999",
            },
            ["MiB", "at most 64 MiB"],
        ),
        (
            {
                "template": {"command": ["echo", "{index}"], "env": {"DDPQ_SWEEP_ID": "7"}},
                "array": "0-1",
            },
            ["DDPQ_SWEEP_ID", "set by ddpq"],
        ),
        # One value used in many places multiplies: each filled command is bounded as a
        # job's is (the review's request: 1 MB that would have built 21 GB of commands).
        (
            {
                "template": {"command": ["echo", *["{a}" * 1365] * 15]},
                "params": {"a": [f"{i:04d}" + "v" * 1020 for i in range(1000)]},
            },
            ["template.command", "filled with the longest values", "at most 65536"],
        ),
        (
            {"template": {"command": ["echo", "{a}" * 1365]}, "params": {"a": ["v" * 60]}},
            ["template.command", "characters; at most 65536"],
        ),
        (
            {
                "template": {"command": ["echo", "{a}" * 20, "{index}"]},
                "params": {"a": [f"{i:04d}" + "w" * 1000 for i in range(3000)]},
            },
            ["MiB", "at most 64 MiB"],
        ),
        ({"template": {"command": ["echo"]}, "array": "0-1", "extra": 1}, ["extra"]),
        (
            {
                "template": {"command": ["echo", *(f"{{p{i}}}" for i in range(33))]},
                "params": {f"p{i}": ["1"] for i in range(33)},
            },
            ["params", "at most 32"],
        ),
    ],
)
def test_bad_sweeps_are_refused_naming_what_is_wrong(
    api: TestClient, body: dict[str, Any], words: list[str]
) -> None:
    before = job_count(api)
    refused(post(api, "/v1/sweeps", body), 422, *words)
    assert job_count(api) == before
    assert get(api, "/v1/sweeps")["total"] == 0


def test_unknown_dependencies_leave_nothing_behind(api: TestClient) -> None:
    for template, word in (({"after": [99]}, "no job 99"), ({"after_sweeps": [7]}, "no sweep 7")):
        body = {"template": {"command": ["true"], **template}, "array": "0-9"}
        refused(post(api, "/v1/sweeps", body), 404, word)
    refused(post(api, "/v1/jobs", {"command": ["true"], "after_sweeps": [7]}), 404, "no sweep 7")
    assert job_count(api) == 0 and get(api, "/v1/sweeps")["total"] == 0
    refused(api.get("/v1/sweeps/7"), 404, "no sweep 7")
    refused(post(api, "/v1/sweeps/7/cancel"), 404, "no sweep 7")
    refused(api.get("/v1/sweeps/0"), 422)


# ---- the views ----------------------------------------------------------------------


def set_progress(home: Path, job_id: int, progress: dict[str, Any] | None) -> None:
    with Database(home / "ddpq.db").write() as s:
        job_store.set_progress(s, job_store.get_job(s, job_id), progress)  # type: ignore[arg-type]


def test_a_sweeps_members_sorted_by_a_metric_either_way(api: TestClient, home: Path) -> None:
    body = {"template": {"command": ["echo", "{lr}"]}, "params": {"lr": ["a", "b", "c", "d"]}}
    sweep_id = post(api, "/v1/sweeps", body).json()["id"]
    ids = [m["id"] for m in get(api, f"/v1/sweeps/{sweep_id}")["members"]]
    for job_id, acc in zip(ids, (0.5, 0.9, None, 0.7), strict=True):
        set_progress(home, job_id, {"test_acc": acc, "epoch": 3} if acc is not None else None)

    def order(sort: str) -> list[str]:
        detail = get(api, f"/v1/sweeps/{sweep_id}?sort={sort}")
        assert detail["sort"] == sort
        return [m["params"]["lr"] for m in detail["members"]]

    assert order("-test_acc") == ["b", "d", "a", "c"]  # highest first, none last
    assert order("test_acc") == ["a", "d", "b", "c"]
    assert order("nothing") == ["a", "b", "c", "d"]
    assert order("-index") == ["d", "c", "b", "a"]
    detail = get(api, f"/v1/sweeps/{sweep_id}")
    assert detail["members"][1]["metrics"] == {"test_acc": 0.9, "epoch": 3}
    assert detail["command"] == ["echo", "{lr}"]
    refused(api.get(f"/v1/sweeps/{sweep_id}?sort=a%20b"), 422, "sort")


def test_the_list_counts_members_by_state_and_cancel_hold_release_act_on_all(
    api: TestClient,
) -> None:
    first = post(api, "/v1/sweeps", {"template": {"command": ["true"]}, "array": "0-4"}).json()
    second = post(api, "/v1/sweeps", {"template": {"command": ["true"]}, "array": "0-1"}).json()
    r = post(api, f"/v1/sweeps/{first['id']}/hold")
    assert r.status_code == 200 and r.json()["changed"] == 5 and r.json()["counts"] == {"held": 5}
    assert "held 5 waiting members" in r.json()["detail"]
    r = post(api, f"/v1/sweeps/{first['id']}/release")
    assert r.json()["counts"] == {"queued": 5}
    r = post(api, f"/v1/sweeps/{first['id']}/cancel")
    assert (r.json()["changed"], r.json()["counts"]) == (5, {"cancelled": 5})
    listed = get(api, "/v1/sweeps")
    assert [(s["id"], s["counts"], s["done"]) for s in listed["items"]] == [
        (first["id"], {"cancelled": 5}, True),
        (second["id"], {"queued": 2}, False),
    ]
    assert listed["total"] == 2


def test_after_a_sweep_is_a_jobs_dependency(api: TestClient) -> None:
    sweep_id = post(api, "/v1/sweeps", {"template": {"command": ["true"]}, "array": "0-2"}).json()[
        "id"
    ]
    r = post(api, "/v1/jobs", {"command": ["true"], "after_sweeps": [sweep_id]})
    assert r.status_code == 201, r.text
    job = r.json()
    assert (job["state"], job["after_sweeps"]) == ("held", [sweep_id])
    assert job["reason"] == f"waiting for every job of sweep {sweep_id} to succeed"
    post(api, f"/v1/sweeps/{sweep_id}/cancel")
    job = get(api, f"/v1/jobs/{job['id']}")
    assert job["state"] == "cancelled" and f"dependency sweep {sweep_id}" in job["reason"]
    assert job["after_sweeps"] == [sweep_id]


def test_only_the_owner_or_an_admin_may_act_on_a_sweep(home: Path) -> None:
    with lent_client(home, auth=True) as c:
        me = pwd.getpwuid(os.geteuid()).pw_name
        with Database(home / "ddpq.db").write() as s:
            _, alice = user_store.add_user(s, "alice", admin=False, unix_user=me, now=time.time())
            _, bob = user_store.add_user(s, "bob", admin=False, unix_user=me, now=time.time())
            _, boss = user_store.add_user(s, "boss", admin=True, unix_user=me, now=time.time())
        body = {"template": {"command": ["true"], "owner": "bob"}, "array": "0-1"}
        r = post(c, "/v1/sweeps", body, alice)
        assert r.status_code == 201 and r.json()["owner"] == "alice"  # the token says who
        sweep_id = r.json()["id"]
        for action in ("cancel", "hold", "release"):
            refused(post(c, f"/v1/sweeps/{sweep_id}/{action}", token=bob), 403, "belongs to alice")
        assert get(c, f"/v1/sweeps/{sweep_id}", bob)["counts"] == {"queued": 2}  # may look
        assert post(c, f"/v1/sweeps/{sweep_id}/hold", token=alice).status_code == 200
        assert post(c, f"/v1/sweeps/{sweep_id}/cancel", token=boss).status_code == 200
        refused(post(c, "/v1/sweeps", {**body, "array": "0-1"}), 401)


# ---- a job's metrics history --------------------------------------------------------


def test_metrics_are_read_from_an_offset_numbers_only_and_never_through_a_link(
    api: TestClient, home: Path, tmp_path: Path
) -> None:
    job_id = post(api, "/v1/jobs", {"command": ["true"]}).json()["id"]
    assert get(api, f"/v1/jobs/{job_id}/metrics")["records"] == []  # no folder yet
    folder = tmp_path / "jobdir"
    folder.mkdir()
    with Database(home / "ddpq.db").write() as s:
        job_store.get_job(s, job_id).job_dir = str(folder)
    lines = [{"epoch": e, "test_acc": e / 10, "phase": "eval"} for e in range(1, 4)]
    text = "".join(json.dumps(x) + "\n" for x in lines) + '{"epoch": 4, "test_ac'
    (folder / "metrics.jsonl").write_text("garbage\n" + text)
    got = get(api, f"/v1/jobs/{job_id}/metrics")
    assert got["records"] == [{"epoch": e, "test_acc": e / 10} for e in range(1, 4)]
    assert got["next_offset"] == len("garbage\n" + text) - len('{"epoch": 4, "test_ac')
    assert got["size"] == len("garbage\n" + text)
    later = get(api, f"/v1/jobs/{job_id}/metrics?offset={got['next_offset']}")
    assert later["records"] == [] and later["next_offset"] == got["next_offset"]
    some = get(api, f"/v1/jobs/{job_id}/metrics?records=1&fields=test_acc")
    assert some["records"] == [{"test_acc": 0.1}]
    refused(api.get(f"/v1/jobs/{job_id}/metrics?limit=10"), 422, "limit")
    refused(api.get(f"/v1/jobs/{job_id}/metrics?fields=" + ",".join("f" * 17)), 422, "fields")
    # The job owns its folder: a link in place of its metrics serves nothing.
    secret = tmp_path / "secret.jsonl"
    secret.write_text('{"stolen": 1}\n')
    (folder / "metrics.jsonl").unlink()
    (folder / "metrics.jsonl").symlink_to(secret)
    assert get(api, f"/v1/jobs/{job_id}/metrics")["records"] == []
    refused(api.get("/v1/jobs/999/metrics"), 404, "no job 999")
