"""The suite's own scheduling (tests/conftest.py): tests that share a port block or the test
Slurm run on one worker; every other test is a unit of its own."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import GROUPS, LONG_FIRST, GroupScheduling

ROOT = Path(__file__).resolve().parents[1]


def test_every_grouped_path_is_a_test_file_here() -> None:
    # A file renamed or moved would silently leave its group and run beside the others.
    for paths in GROUPS.values():
        for path in paths:
            assert (ROOT / path).is_file(), path
    for path in LONG_FIRST:
        assert (ROOT / path).exists(), path


def test_the_scheduler_keeps_a_group_on_one_unit_and_splits_the_rest() -> None:
    def split(nodeid: str) -> str:
        scheduler = GroupScheduling.__new__(GroupScheduling)  # its scope rule needs no set-up
        return str(scheduler._split_scope(nodeid))

    leases = split("tests/test_leases.py::test_a[1]")
    assert (
        leases == split("tests/worker/test_busy_ports.py::test_b") == split("tests/test_soak.py::t")
    )
    assert split("tests/slurm/test_through_ddpq.py::x") == split("tests/slurm/test_script.py::y")
    assert split("tests/slurm/test_through_ddpq.py::x") != leases
    assert split("tests/test_api_states.py::a") != split("tests/test_api_states.py::b")
