"""What a `ddpq serve` start costs, held down (bench/daemon_start.py measures it; here, the
work left out is checked, never timed): no collector passes over the start-up heap until
it is frozen, and nothing imported that the start does not use."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ddpq import entry
from ddpq.daemon.heap import collections_held, freeze_startup_objects
from tests.template_db import migrated

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def passes() -> Iterator[list[int]]:
    """The generation of each collection that starts while the test runs."""
    started: list[int] = []

    def note(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started.append(info["generation"])

    gc.callbacks.append(note)
    try:
        yield started
    finally:
        gc.callbacks.remove(note)
        gc.unfreeze()  # this test process collects as before
        gc.enable()


def allocate() -> list[list[list[int]]]:
    # Enough containers to set off young collections (one per 700 net allocations).
    return [[[i] for i in range(10)] for _ in range(20_000)]


def test_a_start_sets_off_no_collection_until_its_heap_is_frozen(passes: list[int]) -> None:
    with collections_held():
        made = allocate()
        assert passes == [] and not gc.isenabled()
        freeze_startup_objects()
        assert passes == [2]  # the freeze's one full collection: start-up garbage is freed
        assert gc.isenabled()  # and what the daemon makes from then on is collected
        del made
        allocate()
        assert len(passes) > 1
    assert gc.isenabled()


def test_a_start_that_fails_before_its_freeze_collects_again(passes: list[int]) -> None:
    with pytest.raises(RuntimeError), collections_held():
        raise RuntimeError("a refused setting")
    assert gc.isenabled()
    allocate()
    assert passes


@pytest.mark.parametrize(
    ("argv", "starts"),
    [
        (["serve", "--fake-gpus", "2"], True),
        (["--url", "http://x", "--debug", "server"], True),
        (["worker", "--help"], True),
        (["ls"], False),
        (["show", "1"], False),
        (["admin", "user", "add", "x"], False),
        (["--help"], False),
        ([], False),
        (["serv"], False),
    ],
)
def test_only_the_daemons_long_running_commands_hold_the_collector(
    argv: list[str], starts: bool
) -> None:
    cli = entry.command_line(argv)
    assert entry.starts_a_daemon(cli, argv) is starts


def test_the_start_imports_neither_slurm_nor_prometheus_nor_alembic(tmp_path: Path) -> None:
    """Everything `serve` imports before its fork and its app's creation: the Slurm
    executor's modules only with ``--executor slurm``, prometheus_client only at the first
    scrape of /metrics, Alembic only for a database below the newest schema."""
    left_out = ("ddpq.executors.slurm", "prometheus_client", "alembic", "ddpq.server.metrics")
    probe = (
        "import sys\n"
        "from pathlib import Path\n"
        "from ddpq.config import Settings\n"
        "from ddpq.daemon.run import _import_both_halves\n"
        "from ddpq.server.app import create_app\n"
        "from ddpq.store.db import migrate\n"
        f"home = Path({str(tmp_path)!r})\n"
        "migrate(home / 'ddpq.db')\n"
        "_import_both_halves()\n"
        "create_app(Settings(home=home, fake_gpus=2))\n"
        f"print(sorted(m for m in sys.modules if m.startswith({left_out!r})))\n"
    )
    # The database at the newest schema first, as every daemon but the first finds it.
    migrated(tmp_path / "ddpq.db")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True
    ).stdout
    assert out.strip() == "[]", out
