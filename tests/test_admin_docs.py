"""docs/admin.md says only what ddpq does: every `ddpq` command it shows exists with the
options it uses, its config example is one ddpq reads, and its Prometheus config and alert
rules are YAML that name metrics /metrics serves."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from ddpq.core.usage import Sighting
from ddpq.entry import command_line
from ddpq.server.metrics import render
from ddpq.store import retention, usage
from ddpq.store.db import Database
from tests.template_db import migrated

DOC = Path(__file__).resolve().parents[1] / "docs" / "admin.md"


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", DOC.read_text(), re.S)


def ddpq_commands() -> list[list[str]]:
    """Every `ddpq ...` of the shell examples, as arguments (comments left out)."""
    found = []
    for block in blocks("sh"):
        for line in block.splitlines():
            words = shlex.split(line, comments=True)
            while words and "=" in words[0]:
                words.pop(0)  # VAR=value before the command
            if words and (words[0] == "ddpq" or words[0].endswith("/bin/ddpq")):
                found.append(words[1:])
    return found


def test_every_ddpq_command_in_the_guide_exists_with_its_options() -> None:
    commands = ddpq_commands()
    assert len(commands) >= 12
    for args in commands:
        # Typer's own copy of Click: groups are told by their commands.
        command: Any = command_line()
        path = []
        for word in args:
            if word in getattr(command, "commands", {}):
                command = command.commands[word]
                path.append(word)
        assert path and not hasattr(command, "commands"), args
        options = {o for p in command.params for o in (*p.opts, *p.secondary_opts)}
        for word in args:
            if word.startswith("--"):
                assert word.split("=")[0] in options, f"ddpq {' '.join(path)} has no {word}"


def test_the_guides_config_examples_are_ones_ddpq_reads(tmp_path: Path) -> None:
    from ddpq.daemon.settings import load_settings

    retention_example, disk_example = blocks("toml")
    config = tmp_path / "ddpq.toml"
    config.write_text(retention_example)
    s = load_settings({}, config)
    assert (s.keep_finished_s, s.jobs_budget_bytes, s.prune_rows) == (30 * 86400, 500 << 30, True)
    config.write_text(disk_example)
    s = load_settings({}, config)
    assert (s.state_reserve_bytes, s.job_folder_max) == (64 << 20, 200 << 30)


def served_metrics(tmp_path: Path) -> set[str]:
    """The sample names a scrape holds, once retention has run once."""
    path = tmp_path / "ddpq.db"
    migrated(path)
    db = Database(path)
    with db.write() as s:
        retention.record_pass(s, 1.0, 0)
        usage.record_sample(s, [Sighting(1000, "alice", 0)], 1.0, 5.0)  # outside use, once
    with db.read() as s:
        text = render(s, 2.0)[0].decode()
    db.dispose()
    families = list(text_string_to_metric_families(text))
    return {f.name for f in families} | {s.name for f in families for s in f.samples}


def test_the_scrape_config_and_alert_rules_name_metrics_that_exist(tmp_path: Path) -> None:
    scrape, rules = (yaml.safe_load(block) for block in blocks("yaml"))
    (job,) = scrape["scrape_configs"]
    assert job["static_configs"][0]["targets"][0].endswith(":8765")
    alerts = rules["groups"][0]["rules"]
    assert [a["alert"] for a in alerts] == ["DdpqQueueStuck", "DdpqGpusHeldByLostJobs"]
    served = served_metrics(tmp_path)
    text = DOC.read_text()
    named = set(re.findall(r"\bddpq_[a-z_]+", " ".join(a["expr"] for a in alerts)))
    named |= set(re.findall(r"`(ddpq_[a-z_]+)", text))  # the table and the prose too
    assert named and named <= served, named - served
