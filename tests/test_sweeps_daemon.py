"""Sweeps through a real daemon: real shims, real processes, the API over HTTP."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import httpx

from tests.helpers import Daemon, wait_for


def test_members_see_their_sweep_in_their_environment_and_the_cap_holds(
    daemon: Daemon, tmp_path: Path
) -> None:
    http = httpx.Client(base_url=daemon.url, timeout=30)
    # Each member prints its sweep variables, then runs until the test lets it go.
    gate = shlex.quote(str(tmp_path / "go-"))
    script = (
        'echo "sweep=$DDPQ_SWEEP_ID index=$DDPQ_SWEEP_INDEX params=$DDPQ_SWEEP_PARAMS"; '
        f"while [ ! -e {gate}{{i}} ]; do sleep 0.05; done"
    )
    body = {
        "template": {"command": ["sh", "-c", script], "gpus": 1, "name": "env"},
        "params": {"i": ["a", "b", "c", "d", "e"]},
        "max_running": 2,
    }
    r = http.post("/v1/sweeps", json=body)
    assert r.status_code == 201, r.text
    sweep_id = r.json()["id"]

    def detail() -> dict[str, Any]:
        out: dict[str, Any] = http.get(f"/v1/sweeps/{sweep_id}").json()
        return out

    def live(d: dict[str, Any]) -> list[dict[str, Any]]:
        return [m for m in d["members"] if m["state"] in ("starting", "running")]

    # 4 GPUs, but the cap lets only 2 members hold them; the others say why they wait.
    first = wait_for(lambda: d if len(live(d := detail())) == 2 else None, what="2 members")
    waiting = [m for m in first["members"] if m["state"] == "queued"]
    assert len(waiting) == 3
    wait_for(
        lambda: all(
            m["reason"] == f"sweep {sweep_id} runs 2 members at once, its cap"
            for m in detail()["members"]
            if m["state"] == "queued"
        ),
        what="the cap's reason",
    )
    released: set[str] = set()

    def next_to_release() -> dict[str, Any] | None:
        running = live(detail())
        assert len(running) <= 2, running  # at every look, never more than the cap
        return next((m for m in running if m["params"]["i"] not in released), None)

    for _ in range(5):
        member = wait_for(next_to_release, what="the next member to run")
        (tmp_path / f"go-{member['params']['i']}").touch()
        released.add(member["params"]["i"])
    final = wait_for(lambda: d if (d := detail())["done"] else None, what="the sweep to end")
    assert final["counts"] == {"succeeded": 5}
    for m in final["members"]:
        log = http.get(f"/v1/jobs/{m['id']}/log").text
        params = json.dumps({"i": m["params"]["i"]}, separators=(",", ":"))
        assert f"sweep={sweep_id} index={m['index']} params={params}" in log, log
