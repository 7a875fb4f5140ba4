"""`ddpq admin`'s own slips (found by an admin's walk through docs/admin.md): a state folder
made anew is said, not silent; no sudo is one line; a store's "no such" keeps its quotes."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli_inprocess import run_in_process


def test_a_state_made_anew_is_said_once_and_a_missing_user_keeps_its_quotes(
    tmp_path: Path,
) -> None:
    home = tmp_path / "elsewhere"
    first = run_in_process("admin", "user", "remove", "nosuch", "--home", str(home))
    assert first.returncode == 1
    lines = first.stderr.strip().splitlines()
    assert lines[0].startswith(f"ddpq: note: no state at {home} yet: made a new one")
    assert lines[1] == "ddpq: no user 'nosuch'"
    again = run_in_process("admin", "user", "remove", "nosuch", "--home", str(home))
    assert again.stderr.strip() == "ddpq: no user 'nosuch'"  # said once: it exists now


def test_an_admin_without_the_rights_gets_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def denied(path: Path) -> None:
        raise PermissionError(13, "Permission denied", f"{path}.migrate-lock")

    monkeypatch.setattr("ddpq.store.db.migrate", denied)
    r = run_in_process("admin", "user", "list", "--home", str(tmp_path / "home"))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.strip().endswith(
        "cannot open ddpq's state at "
        + str(tmp_path / "home")
        + ": Permission denied (as root: sudo)"
    )
