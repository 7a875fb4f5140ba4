"""The API in-process: ``create_app`` on a migrated database file, behind a TestClient.

``create_app`` does not migrate (the daemon does, once, before it serves), so whatever
runs the app without a daemon migrates here first, as ``ddpq.daemon.run`` would (a copy of
the session's migrated template: ``tests/template_db.py``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from ddpq.config import Settings
from ddpq.core.gpus import Gpu
from ddpq.server.app import create_app
from ddpq.store import devices as device_store
from ddpq.store.db import Database
from tests.template_db import migrated

BASE = "http://127.0.0.1:8765"


def make_client(home: Path, **settings: Any) -> TestClient:
    config = Settings(home=home, **settings)
    migrated(config.db_path)
    # 500s as answers, not exceptions: several tests assert that there is none.
    return TestClient(create_app(config), base_url=BASE, raise_server_exceptions=False)


def client_with_gpus(
    home: Path, gpus: int = 8, memory_mb: int = 16384, **settings: Any
) -> Iterator[TestClient]:
    """An in-process API whose store shows ``gpus`` fake GPUs, as a worker would have
    published them (submissions are checked against what exists)."""
    with make_client(home, **settings) as c:
        with Database(home / "ddpq.db").write() as s:
            rows = [Gpu(i, f"GPU-{i}", "fake", memory_mb, 0, (), True) for i in range(gpus)]
            device_store.replace_all(s, rows, time.time())
        yield c
