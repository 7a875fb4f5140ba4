"""The API in-process: ``create_app`` on a migrated database file, behind a TestClient.

``create_app`` does not migrate (the daemon does, once, before it serves), so whatever
runs the app without a daemon migrates here first, as ``ddpq.daemon.run`` would.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from ddpq.config import Settings
from ddpq.server.app import create_app
from ddpq.store.db import migrate

BASE = "http://127.0.0.1:8765"


def make_client(home: Path, **settings: Any) -> TestClient:
    config = Settings(home=home, **settings)
    migrate(config.db_path)
    # 500s as answers, not exceptions: several tests assert that there is none.
    return TestClient(create_app(config), base_url=BASE, raise_server_exceptions=False)
