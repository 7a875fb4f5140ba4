"""`ddpq submit --dependency`, `ddpq update` and `ddpq restart` against a real daemon
(fake GPUs, real processes): what the commands print, what the jobs then do, and one
readable line and a non-zero exit for what is refused."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tests.cli_inprocess import ddpq_in_process
from tests.helpers import Daemon, wait_for


def test_dependencies_updates_and_restarts_from_the_command_line(
    make_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    d = make_daemon("--fake-gpus", "2", "--grace", "1s")
    c = d.client()
    where = ("--cwd", str(tmp_path))

    def submit(*args: str) -> int:
        return int(d.cli("submit", *where, *args).stdout.strip())

    def state_is(job_id: int, state: str) -> bool:
        return c.show(job_id).state == state

    failing = submit("--name", "first", "--", "sh", "-c", "exit 3")
    wait_for(lambda: state_is(failing, "failed"), what="the first job to fail")
    # afternotok on a failed job, singleton after an ended one of its name: it runs.
    after = submit(
        "--name", "first", "--dependency", f"afternotok:{failing},singleton", "--", "true"
    )
    shown = d.cli("show", str(after)).stdout
    assert f"depends on afternotok:{failing},singleton" in shown
    wait_for(lambda: state_is(after, "succeeded"), what="the afternotok job to succeed")

    held = submit("--hold", "--", "sleep", "60")
    out = d.cli("update", str(held), "--priority", "5", "--gpus", "1", "--time-limit", "10m")
    assert out.stdout.strip() == f"{held}: held (held by user)"
    job = c.show(held)
    assert (job.priority, job.gpus, job.time_limit_s) == (5, 1, 600)
    d.cli("update", str(held), "--release")
    wait_for(lambda: state_is(held, "running"), what="the released job to run")
    refused = d.cli("update", str(held), "--gpus", "2", check=False)
    assert refused.returncode != 0 and len(refused.stderr.strip().splitlines()) == 1
    assert "once started only its time limit can change" in refused.stderr
    # Lowered while it runs: the worker holds it to the new limit.
    d.cli("update", str(held), "--time-limit", "1s")
    wait_for(lambda: state_is(held, "timed_out"), what="the lowered time limit to end it")

    again = int(d.cli("restart", str(failing), "--gpus", "1").stdout.strip())
    assert again > held
    new = c.show(again)
    assert (new.command, new.gpus, new.name) == (["sh", "-c", "exit 3"], 1, "first")
    wait_for(lambda: state_is(again, "failed"), what="the restarted job to run")


def test_bad_dependencies_and_changes_say_one_line(
    make_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    d = make_daemon("--fake-gpus", "1")
    cases = [
        (["submit", "--dependency", "afterevery:1", "--", "true"], "not a dependency kind"),
        (["submit", "--dependency", "afterok:99", "--", "true"], "no job 99"),
        (["submit", "--dependency", "afterany:s99", "--", "true"], "no sweep 99"),
        (["update", "99", "--priority", "1"], "no job 99"),
        (["update", "1"], "nothing to change"),
        (["update", "1", "--hold", "--release"], "give one"),
        (["update", "1", "--time-limit", "soon"], "--time-limit"),
        (["restart", "99"], "no job 99"),
    ]
    for args, says in cases:  # what the command says, in this process (tests/cli_inprocess.py)
        r = ddpq_in_process(d.url, *args)
        assert r.returncode != 0, args
        assert says in r.stderr and len(r.stderr.strip().splitlines()) == 1, (args, r.stderr)
        assert "Traceback" not in r.stderr
    # A change the daemon refuses as invalid is bad usage, said as the option, as submit's.
    held = ddpq_in_process(d.url, "submit", "--hold", "--", "true").stdout.strip()
    r = ddpq_in_process(d.url, "update", held, "--gpus", "9")
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == "ddpq: --gpus: asked for 9 GPUs but this server has 1"
