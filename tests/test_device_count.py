"""``store.devices.count``: how many GPUs the worker reported, which bounds a submission."""

from __future__ import annotations

import time
from pathlib import Path

from ddpq.core.gpus import Gpu
from ddpq.store import devices as device_store
from ddpq.store.db import Database
from tests.inprocess import make_client
from tests.template_db import migrated


def rows(n: int) -> list[Gpu]:
    return [Gpu(i, f"GPU-{i}", "fake", 1000, 0, (), True) for i in range(n)]


def test_count_follows_the_reported_devices(tmp_path: Path) -> None:
    migrated(tmp_path / "ddpq.db")
    db = Database(tmp_path / "ddpq.db")
    try:
        with db.read() as s:
            assert device_store.count(s) == 0
        for n in (3, 1, 0):
            with db.write() as s:
                device_store.replace_all(s, rows(n), time.time())
            with db.read() as s:
                assert device_store.count(s) == n == len(device_store.all_devices(s))
    finally:
        db.dispose()


def test_a_job_may_ask_for_at_most_every_gpu(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with make_client(home) as c:
        db = Database(home / "ddpq.db")
        with db.write() as s:
            device_store.replace_all(s, rows(2), time.time())
        db.dispose()
        r = c.post("/v1/jobs", json={"command": ["true"], "gpus": 3, "hold": True})
        assert r.status_code == 422, r.text
        assert r.json()["detail"] == "gpus: asked for 3 GPUs but this server has 2"
        assert c.post("/v1/jobs", json={"command": ["true"], "gpus": 2, "hold": True}).is_success
