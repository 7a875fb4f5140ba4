"""The start-up shortcut: a database already at the newest schema skips Alembic, and
every other file (missing, empty, older, unknown, a versions folder with two heads or a
script the reader cannot parse) still goes through it."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

from alembic import command
from alembic.script import ScriptDirectory

from ddpq.store.db import alembic_config, migrate, migrations_dir
from ddpq.store.schema_version import head_revision, is_current, stamped_revision

VERSIONS = migrations_dir() / "versions"


def test_the_text_reader_finds_the_head_alembic_finds(tmp_path: Path) -> None:
    script = ScriptDirectory.from_config(alembic_config(tmp_path / "unused.db"))
    assert head_revision(VERSIONS) == script.get_current_head()


def test_only_a_file_stamped_with_the_head_is_current(tmp_path: Path) -> None:
    head = head_revision(VERSIONS)
    missing = tmp_path / "missing.db"
    assert not is_current(missing, VERSIONS) and not missing.exists()  # never created
    empty = tmp_path / "empty.db"
    empty.touch()
    assert not is_current(empty, VERSIONS)
    older = tmp_path / "older.db"
    command.upgrade(alembic_config(older), "0009c")
    assert stamped_revision(older) == "0009c" and not is_current(older, VERSIONS)
    migrate(older)  # the shortcut does not stop a real upgrade
    assert stamped_revision(older) == head and is_current(older, VERSIONS)
    unknown = tmp_path / "unknown.db"
    with sqlite3.connect(unknown) as conn:
        conn.execute("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL)")
        conn.execute("INSERT INTO alembic_version VALUES ('9999z')")
    assert not is_current(unknown, VERSIONS)


def write_script(folder: Path, name: str, body: str) -> None:
    folder.mkdir(exist_ok=True)
    (folder / f"{name}.py").write_text(body)


def test_a_versions_folder_the_reader_is_unsure_of_has_no_head(tmp_path: Path) -> None:
    chain = tmp_path / "chain"
    write_script(chain, "a", 'revision = "a1"\ndown_revision = None\n')
    write_script(chain, "b", 'revision: str = "b1"\ndown_revision: str | None = "a1"\n')
    assert head_revision(chain) == "b1"  # annotated assignments are read too
    two_heads = tmp_path / "two"
    write_script(two_heads, "a", 'revision = "a1"\ndown_revision = None\n')
    write_script(two_heads, "b", 'revision = "b1"\ndown_revision = "a1"\n')
    write_script(two_heads, "c", 'revision = "c1"\ndown_revision = "a1"\n')
    assert head_revision(two_heads) is None
    merged = tmp_path / "merged"
    write_script(merged, "a", 'revision = "a1"\ndown_revision = None\n')
    write_script(merged, "b", 'revision = "b1"\ndown_revision = "a1"\n')
    write_script(merged, "c", 'revision = "c1"\ndown_revision = "a1"\n')
    write_script(merged, "m", 'revision = "m1"\ndown_revision = ("b1", "c1")\n')
    assert head_revision(merged) == "m1"
    odd = tmp_path / "odd"
    write_script(odd, "a", 'revision = "a1"\ndown_revision = None\n')
    write_script(odd, "b", "revision = make_revision()\ndown_revision = 'a1'\n")
    assert head_revision(odd) is None


def test_starting_on_a_current_database_does_not_load_alembic(tmp_path: Path) -> None:
    path = tmp_path / "ddpq.db"
    migrate(path)
    probe = (
        "import sys; from pathlib import Path; from ddpq.store.db import migrate; "
        f"migrate(Path({str(path)!r})); print(sorted(m for m in sys.modules if m == 'alembic'))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
