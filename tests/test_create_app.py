"""What ``create_app`` leaves to the daemon: migrating the database, once, before it serves."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient

from ddpq.config import Settings
from ddpq.server.app import create_app
from tests.inprocess import BASE, make_client


def test_the_app_does_not_migrate(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with TestClient(create_app(Settings(home=home)), base_url=BASE):
        pass  # the lifespan ran: it opened and closed the database without touching it
    assert not (home / "ddpq.db").exists()


def test_a_migrated_file_is_all_it_needs(tmp_path: Path) -> None:
    with make_client(tmp_path / "home") as c:
        assert c.get("/healthz").json()["ok"] is True
