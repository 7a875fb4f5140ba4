"""`ddpq show`'s lines for a job (``client.draw.job_lines``), from the API's own detail."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ddpq.client.draw import job_lines
from ddpq.client.host import cores_named
from tests.inprocess import client_with_gpus


@pytest.fixture
def detail(tmp_path: Path) -> Iterator[dict[str, Any]]:
    for api in client_with_gpus(tmp_path / "home", gpus=1):
        job = api.post("/v1/jobs", json={"command": ["true"], "hold": True}).json()
        yield api.get(f"/v1/jobs/{job['id']}").json()


@pytest.mark.parametrize(
    ("code", "signal", "shown"),
    [(0, None, "code 0"), (None, 15, "signal 15"), (1, 9, "code 1, signal 9"), (None, None, None)],
)
def test_the_exit_line_says_what_is_known_and_no_none(
    detail: dict[str, Any], code: int | None, signal: int | None, shown: str | None
) -> None:
    lines = job_lines({**detail, "exit_code": code, "exit_signal": signal})
    exits = [line.split(None, 1)[1] for line in lines if line.startswith("  exit ")]
    assert exits == ([shown] if shown else [])
    assert not any("None" in line for line in lines)


@pytest.mark.parametrize(
    ("cores", "named"), [([0], "core 0"), ([0, 1], "cores 0-1"), ([3, 0, 1, 8], "cores 0-1,3,8")]
)
def test_cores_are_named_as_which_not_how_many(cores: list[int], named: str) -> None:
    """ "(cpus 0)" read as "no cores" to a new user; it was core 0."""
    assert cores_named(cores) == named
