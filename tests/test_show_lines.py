"""`ddpq show`'s lines for a job (``client.draw.job_lines``), from the API's own detail."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ddpq.client.draw import job_lines
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
