"""Interactive sessions through the API: what a submission may ask for, the idle limit the
daemon gives it, and how idle GPUs show (``GET /v1/devices``, ``/metrics``)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from ddpq.core.interactive import GpuUse
from tests import launches
from tests.inprocess import make_client
from tests.worker.rig import make_rig

SESSION: dict[str, Any] = {"command": ["bash"], "interactive": True}


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        ({"workload": "resnet18", "command": []}, "workload: a session runs a command"),
        ({"torchrun": True}, "torchrun: a session is not run under torchrun"),
        ({"preemptible": True}, "preemptible: a session cannot be preempted"),
        ({"retries": 2}, "retries: a session is not retried"),
        ({"command": ["jupyter", "--port", "{port}"]}, "{port} needs a leased port"),
        ({"idle_s": 0}, "idle_s"),
        ({"idle_s": -5}, "idle_s"),
        ({"idle_s": "30m"}, "idle_s"),
        ({"idle_s": 5 * 3600}, "idle_s: at most 4h00m"),
        ({"interactive": False, "idle_s": 60}, "idle_s: only an interactive session"),
        ({"interactive": "yes"}, "interactive"),
    ],
)
def test_what_a_session_cannot_ask_for(tmp_path: Path, extra: dict[str, Any], says: str) -> None:
    with make_client(tmp_path / "home") as c:
        r = c.post("/v1/jobs", json={**SESSION, **extra})
    assert r.status_code == 422, r.text
    assert says in r.json()["detail"]


def test_a_sweep_of_sessions_is_refused(tmp_path: Path) -> None:
    with make_client(tmp_path / "home") as c:
        r = c.post("/v1/sweeps", json={"template": SESSION, "array": "0-1"})
    assert r.status_code == 422 and "not sessions" in r.json()["detail"], r.text


@pytest.mark.parametrize(
    ("settings", "asked", "limit"),
    [
        ({}, None, 1800.0),
        ({}, 600.0, 600.0),
        ({"idle_default_s": None, "idle_max_s": None}, None, None),
        ({"idle_default_s": None, "idle_max_s": None}, 86400.0, 86400.0),
        ({"idle_default_s": 60.0, "idle_max_s": 120.0}, 120.0, 120.0),
    ],
)
def test_a_session_gets_the_limit_it_asked_for_or_the_daemons_default(
    tmp_path: Path, settings: dict[str, Any], asked: float | None, limit: float | None
) -> None:
    body = {**SESSION, **({"idle_s": asked} if asked is not None else {})}
    with make_client(tmp_path / "home", **settings) as c:
        r = c.post("/v1/jobs", json=body)
        assert r.status_code == 201, r.text
        job = r.json()
        assert (job["interactive"], job["idle_s"], job["attach"]) == (True, limit, None)
        batch = c.post("/v1/jobs", json={"command": ["true"]}).json()
        assert (batch["interactive"], batch["idle_s"]) == (False, None)


def test_idle_gpus_show_in_devices_and_metrics(tmp_path: Path) -> None:
    """A worker in process (its sampler the test's: all GPUs idle) beside the API."""
    home = tmp_path / "home"
    rig = make_rig(
        home,
        gpu_use=lambda gpus: {g: GpuUse(0, 0) for g in gpus},
        idle_default_s=600.0,
        idle_grace_s=60.0,
    )
    rig.clock.at = time.time() - 3600  # the API judges "long" by its own clock
    try:
        session = rig.submit(interactive=True, idle_s=None, command=["bash"])
        batch = rig.submit(command=["python", "train.py"])
        rig.step()
        rig.clock.advance(5)
        rig.step()
        with make_client(home, idle_default_s=600.0) as c:
            devices = {d["job_id"]: d for d in c.get("/v1/devices").json()["items"]}
            assert devices[session]["idle_since"] and devices[session]["idle_long"]
            assert devices[batch]["idle_since"] and devices[batch]["idle_long"]
            shown = c.get(f"/v1/jobs/{session}").json()
            assert shown["idle_since"] == devices[session]["idle_since"]
            metrics = c.get("/metrics").text
        assert 'ddpq_jobs_gpus_idle{interactive="true"} 1.0' in metrics
        assert 'ddpq_jobs_gpus_idle_long{interactive="false"} 1.0' in metrics
        assert "ddpq_gpus_idle_long 2.0" in metrics
        assert "ddpq_sessions_reclaimed_idle_total 0.0" in metrics
        with make_client(home, idle_default_s=7200.0) as c:  # not long by this measure
            devices = {d["job_id"]: d for d in c.get("/v1/devices").json()["items"]}
            assert devices[session]["idle_since"] and not devices[session]["idle_long"]
    finally:
        rig.close()


@pytest.mark.parametrize(
    ("interactive", "submitted", "term"),
    [
        (True, {"TERM": "screen-256color"}, "screen-256color"),  # the type `ddpq shell` sent
        (True, {}, "xterm-256color"),  # none sent: a common one
        (False, {"TERM": "vt100"}, None),  # a terminal's variable: left out of a batch job
        (False, {}, None),  # a batch job runs on no terminal: it is given none
    ],
)
def test_a_session_runs_with_a_terminal_type(
    tmp_path: Path, interactive: bool, submitted: dict[str, str], term: str | None
) -> None:
    from ddpq.core import jobenv
    from ddpq.executors.contract import job_env

    launch = launches.a_launch(
        job_id=1,
        attempt=1,
        job_dir=tmp_path,
        command=["bash"],
        launcher="plain",
        gpus=(0,),
        port=29500,
        cwd=str(tmp_path),
        env=jobenv.pack({"HOME": str(tmp_path)}, submitted),  # as `ddpq shell` sends
        owner="someone",
        unix_account=None,
        interactive=interactive,
    )
    env = job_env(launch, {"TERM": "daemon-terminal", "PATH": "/bin"}, 1)
    assert env.get("TERM") == term


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"command": ["jupyter", "lab", "--port", "{port}"], "gpus": 1},
        {"idle_s": 600},
        {"gpus": 0},
    ],
)
def test_a_slurm_daemon_refuses_a_session_with_the_reason(
    tmp_path: Path, fields: dict[str, Any]
) -> None:
    """On Slurm a session's shim (and its terminal's socket) is on a node that nothing relays
    yet: refused at the door, not queued for a terminal no one can reach."""
    with make_client(tmp_path / "home", executor="slurm") as c:
        r = c.post("/v1/jobs", json={**SESSION, "hold": True, **fields})
        assert r.status_code == 422, r.text
        assert r.json()["detail"].startswith("interactive: this daemon runs jobs on Slurm")
        assert c.get("/v1/jobs").json()["total"] == 0
        batch = c.post("/v1/jobs", json={"command": ["true"], "hold": True, "gpus": 0})
        assert batch.status_code == 201, batch.text  # a batch job is still taken
