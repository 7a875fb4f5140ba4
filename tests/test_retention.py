"""Retention through the real commands: the settings from every source, `ddpq admin prune
[--dry-run]`, and a daemon whose janitor removes an old finished job's folder (with a
link its job planted to a file outside) but never a running job's, logs it once, and
counts it in /metrics."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from ddpq.daemon import settings as daemon_settings
from ddpq.daemon.settings import load_settings
from ddpq.schemas import JobSubmit
from tests.cli_inprocess import run_in_process
from tests.helpers import Daemon, wait_done, wait_for, wait_state
from tests.test_metrics import scrape, value


def ddpq(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``ddpq ARGS`` with ``env`` for the ``DDPQ_*`` variables, in this process
    (tests/cli_inprocess.py): these commands refuse, print help or prune a state folder,
    and none serves."""
    cleared: dict[str, str | None] = {k: None for k in os.environ if k.startswith("DDPQ_")}
    return run_in_process(*args, env={**cleared, **env})


def assert_one_line(r: subprocess.CompletedProcess[str], *words: str) -> None:
    assert r.returncode == 2, r
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    for word in words:
        assert word in r.stderr, r.stderr


# ---- settings ---------------------------------------------------------------------------------


def test_retention_settings_from_each_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(daemon_settings, "DEFAULT_CONFIG_FILE", tmp_path / "absent.toml")
    for name in ("DDPQ_KEEP_FINISHED", "DDPQ_JOBS_BUDGET", "DDPQ_PRUNE_ROWS"):
        monkeypatch.delenv(name, raising=False)
    s = load_settings({})
    assert (s.keep_finished_s, s.jobs_budget_bytes, s.prune_rows) == (None, None, False)
    config = tmp_path / "ddpq.toml"
    config.write_text('keep_finished = "30d"\njobs_budget = "500G"\nprune_rows = true\n')
    s = load_settings({}, config)
    assert (s.keep_finished_s, s.jobs_budget_bytes, s.prune_rows) == (30 * 86400, 500 << 30, True)
    monkeypatch.setenv("DDPQ_KEEP_FINISHED", "12h")
    monkeypatch.setenv("DDPQ_JOBS_BUDGET", "unlimited")  # lifts the file's budget
    s = load_settings({"keep_finished": "forever", "prune_rows": False}, config)
    assert (s.keep_finished_s, s.jobs_budget_bytes, s.prune_rows) == (None, None, False)
    assert load_settings({}, config).keep_finished_s == 12 * 3600


@pytest.mark.parametrize(
    ("args", "env", "says"),
    [
        (["--keep-finished", "soon"], {}, "--keep-finished: 'soon' is not a duration"),
        (["--keep-finished", "0"], {}, "a duration must be more than 0"),
        (["--jobs-budget", "lots"], {}, "--jobs-budget: 'lots' is not a size"),
        ([], {"DDPQ_JOBS_BUDGET": "0"}, "DDPQ_JOBS_BUDGET='0': Input should be greater than 0"),
        ([], {"DDPQ_PRUNE_ROWS": "perhaps"}, "DDPQ_PRUNE_ROWS='perhaps'"),
    ],
)
def test_a_bad_retention_value_is_one_line(
    args: list[str], env: dict[str, str], says: str, tmp_path: Path
) -> None:
    empty = tmp_path / "empty.toml"
    empty.write_text("")
    # --host 0.0.0.0 without --auth: a value wrongly accepted still ends the daemon at once.
    home = ["--home", str(tmp_path / "home"), "--host", "0.0.0.0", "--config", str(empty)]
    assert_one_line(ddpq("serve", *home, *args, **env), says)


def test_only_the_processes_that_run_jobs_take_retention_flags() -> None:
    r = ddpq("server", "--keep-finished", "30d")
    assert r.returncode == 2 and "No such option: --keep-finished" in r.stderr
    for command in ("serve", "worker"):
        helptext = ddpq(command, "--help").stdout
        assert "--keep-finished" in helptext and "--jobs-budget" in helptext, command


def test_admin_prune_needs_a_limit_and_a_database(tmp_path: Path) -> None:
    empty = tmp_path / "empty.toml"
    empty.write_text("")
    home = ["--home", str(tmp_path / "home"), "--config", str(empty)]
    assert_one_line(ddpq("admin", "prune", *home), "nothing to prune by")
    assert_one_line(ddpq("admin", "prune", "--keep-finished", "1d", *home), "no database at")


# ---- through a daemon -------------------------------------------------------------------------


def test_a_daemon_removes_old_finished_jobs_folders_and_admin_prune_their_rows(
    make_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    outside = tmp_path / "someone-elses.txt"
    outside.write_text("not the job's")
    d = make_daemon("--fake-gpus", "2", "--keep-finished", "1s")
    script = (
        'head -c 300000 /dev/urandom > "$DDPQ_JOB_DIR/last.pt"; '
        f'ln -s {outside} "$DDPQ_JOB_DIR/model.pt"; echo trained'
    )
    with d.client() as c:
        done = wait_done(c, c.submit(JobSubmit(command=["sh", "-c", script])).id)
        running = c.submit(JobSubmit(command=["sleep", "600"], gpus=1))
        wait_state(c, running.id, "running")
        held = c.submit(JobSubmit(command=["true"], hold=True))
    assert done.state == "succeeded" and done.ended_at is not None
    finished = d.home / "jobs" / str(done.id)
    assert (finished / "last.pt").exists() and (finished / "output.log").exists()
    ended = done.ended_at.timestamp()
    wait_for(lambda: time.time() - ended > 1.5, 10, "the job to be older than --keep-finished")

    home = ["--home", str(d.home)]
    dry = ddpq("admin", "prune", "--dry-run", "--keep-finished", "1s", *home)
    assert dry.returncode == 0, dry.stderr
    assert (
        f"job {done.id}: folder, " in dry.stdout and "would go (finished more than 1s" in dry.stdout
    )
    assert f"job {running.id}:" not in dry.stdout and finished.exists()

    # The janitor looks when the daemon starts (then every 10 minutes).
    d.stop()
    d.start()

    def removal_lines() -> list[str]:
        log = (d.home / "daemon.log").read_text()
        return [line for line in log.splitlines() if "retention: removed" in line]

    # The pass logs its line (and has stored its counters) after it removed the folder:
    # wait on the line, the pass's last step, not on the folder.
    wait_for(removal_lines, 30, "the janitor's line of what it removed")
    assert not finished.exists()
    assert outside.read_text() == "not the job's"
    assert (d.home / "jobs" / str(running.id)).is_dir()
    lines = removal_lines()
    assert len(lines) == 1 and "checkpoints of 1 job" in lines[0], lines
    m = scrape(d)
    assert value(m, "ddpq_retention_removed_jobs_total", what="checkpoints") == 1
    assert value(m, "ddpq_retention_removed_jobs_total", what="logs") == 1
    assert value(m, "ddpq_retention_removed_bytes_total", what="checkpoints") >= 300_000
    assert value(m, "ddpq_job_folders_bytes") > 0
    with d.client() as c:
        assert c.show(done.id).state == "succeeded"  # the row stays without --prune-rows
        assert c.show(running.id).state == "running"  # re-adopted, untouched

    r = ddpq("admin", "prune", "--keep-finished", "1s", "--prune-rows", *home)
    assert r.returncode == 0, r.stderr
    assert f"job {done.id}: row removed" in r.stdout and "removed 1 job row" in r.stdout
    assert d.cli("show", str(done.id), check=False).returncode == 4
    assert d.cli("show", str(held.id)).returncode == 0
    assert value(scrape(d), "ddpq_retention_removed_jobs_total", what="rows") == 1
    with d.client() as c:
        c.cancel(running.id)
