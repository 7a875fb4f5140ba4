"""What the zygote builds once for every test daemon (``tests/prepared_daemon.py``): handed
out where the daemon would build the same, and nowhere else."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import fastapi.routing
import pytest

from ddpq import entry
from ddpq.config import Settings
from ddpq.server import app as app_module
from tests import prepared_daemon
from tests.inprocess import InProcessClient
from tests.template_db import migrated


@pytest.fixture
def prepared(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``prepare`` as the zygote calls it, undone afterwards (it replaces two functions)."""
    monkeypatch.setattr(entry, "command_line", entry.command_line)
    monkeypatch.setattr(app_module, "create_app", app_module.create_app)
    prepared_daemon.prepare()
    yield
    prepared_daemon._prepared.clear()


def test_the_first_app_is_the_prepared_one_on_the_daemons_settings_and_no_other(
    prepared: None, tmp_path: Path
) -> None:
    ((ready, _names),) = prepared_daemon._prepared
    settings = Settings(home=tmp_path, fake_gpus=2)
    first = app_module.create_app(settings)
    assert first is ready and first.state.settings is settings
    second = app_module.create_app(settings)
    assert second is not ready  # one app, one daemon: a second is built anew


def test_an_app_that_would_let_in_other_host_names_is_built_anew(
    prepared: None, tmp_path: Path
) -> None:
    ((ready, _names),) = prepared_daemon._prepared
    elsewhere = Settings(home=tmp_path, host="0.0.0.0")
    assert app_module.guard_names(elsewhere) != _names
    assert app_module.create_app(elsewhere) is not ready
    assert prepared_daemon._prepared  # still there for a daemon it fits


def test_the_prepared_apps_routes_are_ready_before_its_first_request(
    prepared: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[str] = []
    populate = fastapi.routing._populate_api_route_state

    def counted(route: object, path: str, *args: object, **kwargs: object) -> None:
        made.append(path)
        populate(route, path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(fastapi.routing, "_populate_api_route_state", counted)
    settings = Settings(home=tmp_path, fake_gpus=2)
    migrated(settings.db_path)
    with InProcessClient(app_module.create_app(settings)) as client:
        assert client.get("/v1/jobs").status_code == 200
        assert client.post("/v1/jobs", json={"command": ["true"]}).status_code == 201
        assert client.get("/v1/devices").status_code == 200
    assert made == []  # a new app makes each route it is asked for (below)
    with InProcessClient(app_module.create_app(settings)) as client:
        assert client.get("/v1/jobs").status_code == 200
    assert made


def test_a_daemons_command_line_is_built_once_and_a_clients_as_before(prepared: None) -> None:
    serve = entry.command_line(["serve", "--fake-gpus", "2"])
    assert entry.command_line(["--url", "http://x", "worker"]) is serve
    assert "serve" in serve.commands
    client = entry.command_line(["ls"])
    assert client is not serve and "serve" not in client.commands
