"""docs/interactive.md and the README's section say only what ddpq does: the commands and
options they show exist, the settings they name are the daemon's, the metrics are served."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from ddpq.daemon.settings import PUBLIC_NAMES
from ddpq.entry import command_line
from ddpq.server.metrics import render
from ddpq.store.db import Database
from tests.template_db import migrated

ROOT = Path(__file__).resolve().parents[1]
GUIDE = (ROOT / "docs" / "interactive.md").read_text()
README = (ROOT / "README.md").read_text()
_AT = README.index("### Interactive sessions")
SECTION = README[_AT : README.index("\n### ", _AT + 1)]  # to the next section


def commands(text: str) -> list[list[str]]:
    """The `ddpq ...` lines of the shell examples, as words up to a bare `--`."""
    found = []
    for block in re.findall(r"```sh\n(.*?)```", text, re.S):
        for line in block.splitlines():
            for part in line.split(";"):
                words = shlex.split(part, comments=True)
                if words and words[0] == "ddpq":
                    found.append(words[1 : words.index("--")] if "--" in words else words[1:])
    return found


def test_every_command_shown_exists_with_its_options() -> None:
    shown = commands(GUIDE) + commands(SECTION)
    assert len(shown) >= 10
    for args in shown:
        command: Any = command_line()
        for word in args:
            if word in getattr(command, "commands", {}):
                command = command.commands[word]
        assert not hasattr(command, "commands"), args
        options = {o for p in command.params for o in (*p.opts, *p.secondary_opts)}
        for word in args:
            if word.startswith("-"):
                assert word.split("=")[0] in options, f"ddpq {args[0]} has no {word}"


def test_the_settings_named_are_the_daemons() -> None:
    rows = re.findall(r"^\| `--([a-z-]+)` / `DDPQ_([A-Z_]+)` / `([a-z_]+)` \|", GUIDE, re.M)
    assert len(rows) == 3
    for flag, variable, key in rows:
        assert flag.replace("-", "_") == key == variable.lower() and key in PUBLIC_NAMES


def test_the_metrics_named_are_served(tmp_path: Path) -> None:
    migrated(tmp_path / "ddpq.db")
    db = Database(tmp_path / "ddpq.db")
    with db.read() as s:
        text = render(s, 1.0)[0].decode()
    db.dispose()
    families = list(text_string_to_metric_families(text))
    served = {f.name for f in families} | {x.name for f in families for x in f.samples}
    named = set(re.findall(r"`(ddpq_[a-z_]+)", GUIDE))
    assert len(named) >= 4 and named <= served, named - served
