"""The walking skeleton end to end: a real daemon, real HTTP, real processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx

from ddpq.schemas import JobSubmit
from tests.cli_inprocess import run_in_process
from tests.helpers import Daemon, free_port, root_flags, wait_done, wait_for, wait_state


def test_cli_submit_show_true_false_and_cancelled(shared_daemon: Daemon) -> None:
    ok = int(shared_daemon.cli("submit", "--name", "ok", "--", "true").stdout)
    bad = int(shared_daemon.cli("submit", "--", "false").stdout)
    sleeper = int(shared_daemon.cli("submit", "--", "sleep", "60").stdout)
    c = shared_daemon.client()
    wait_done(c, ok)
    wait_done(c, bad)
    wait_state(c, sleeper, "running")
    assert "stopping" in shared_daemon.cli("cancel", str(sleeper)).stdout
    wait_done(c, sleeper)

    def shown(job_id: int) -> dict[str, Any]:
        return dict(json.loads(shared_daemon.cli("show", str(job_id), "--json").stdout))

    assert (shown(ok)["state"], shown(ok)["exit_code"]) == ("succeeded", 0)
    assert (shown(bad)["state"], shown(bad)["exit_code"]) == ("failed", 1)
    cancelled = shown(sleeper)
    assert cancelled["state"] == "cancelled"
    assert cancelled["exit_signal"] == 15  # sleep dies of the SIGTERM
    history = [e["to_state"] for e in cancelled["events"]]
    assert history == ["queued", "starting", "running", "cancelled"]


def test_output_goes_to_the_log_and_ls_lists_jobs(daemon: Daemon) -> None:
    c = daemon.client()
    job = c.submit(JobSubmit(command=["sh", "-c", "echo out-line; echo err-line >&2"]))
    wait_done(c, job.id)
    log = daemon.cli("logs", str(job.id)).stdout
    assert "out-line" in log and "err-line" in log
    listed = json.loads(daemon.cli("ls", "--all", "--json").stdout)
    assert [j["id"] for j in listed] == [job.id]
    assert json.loads(daemon.cli("ls", "--json").stdout) == []  # finished jobs hidden by default


def test_logs_follow_ends_with_the_job(shared_daemon: Daemon) -> None:
    c = shared_daemon.client()
    job = c.submit(
        JobSubmit(command=["sh", "-c", "for i in 1 2 3; do echo tick $i; sleep 0.2; done"])
    )
    out = shared_daemon.cli("logs", "-f", str(job.id)).stdout
    assert [ln for ln in out.splitlines() if ln.startswith("tick")] == [
        "tick 1",
        "tick 2",
        "tick 3",
    ]
    assert c.show(job.id).state == "succeeded"


def test_watch_into_a_pipe_prints_each_view_as_it_comes(
    shared_daemon: Daemon, tmp_path: Path
) -> None:
    """Not only at its end, as a live view would there (Rich keeps its last frame only):
    `ddpq watch | tee` or into a file shows every refresh while it runs."""
    c = shared_daemon.client()
    job = c.submit(JobSubmit(command=["true"], name="seen-in-a-pipe", hold=True)).id
    out = tmp_path / "watch.out"
    with out.open("wb") as o:
        p = subprocess.Popen(
            [sys.executable, "-m", "ddpq", "watch", "--interval", "0.2"],
            stdout=o,
            stderr=subprocess.PIPE,
            env={**os.environ, "DDPQ_URL": shared_daemon.url},
        )
    try:
        wait_for(lambda: out.read_text().count("seen-in-a-pipe") >= 2, 60, "two views")
        assert p.poll() is None  # still watching
    finally:
        p.terminate()
        _, err = p.communicate(timeout=30)
        c.cancel(job)
    views = out.read_text().split("\n\n")
    assert "queue" in views[0] and "GPUs" in views[0], views[0]
    assert "\x1b[" not in out.read_text()  # plain text: no terminal's escapes
    assert b"Traceback" not in err


def test_bad_input_gets_clear_answers(shared_daemon: Daemon) -> None:
    r = httpx.post(shared_daemon.url + "/v1/jobs", json={"command": []})
    assert r.status_code == 422
    assert "command" in r.json()["detail"]
    r = httpx.post(shared_daemon.url + "/v1/jobs", json={"command": ["true"], "gpus": "two"})
    assert r.status_code == 422 and "gpus" in r.json()["detail"]
    r = httpx.post(shared_daemon.url + "/v1/jobs", json={"command": ["true"], "gpus": 99})
    assert r.status_code == 422 and "has 4" in r.json()["detail"]
    r = httpx.get(shared_daemon.url + "/v1/jobs/12345")
    assert r.status_code == 404 and r.json() == {"detail": "no job 12345", "code": "not_found"}
    empty = shared_daemon.cli("submit", "--", check=False)
    assert empty.returncode == 2 and "nothing to run" in empty.stderr
    missing = shared_daemon.cli("show", "999", check=False)
    assert missing.returncode == 4
    assert missing.stderr.strip().count("\n") == 0 and "Traceback" not in missing.stderr


def test_cli_without_daemon_prints_one_line(tmp_path: object) -> None:
    import subprocess

    url = f"http://127.0.0.1:{free_port()}"
    r = subprocess.run(
        [sys.executable, "-m", "ddpq", "--url", url, "ls"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 3
    assert r.stderr.count("\n") == 1 and url in r.stderr and "Traceback" not in r.stderr


def test_a_program_that_cannot_run_fails_saying_why(shared_daemon: Daemon, tmp_path: Path) -> None:
    """Missing, not executable, a folder, not on PATH: the job's reason says why, as its
    log does, not only "exit code 127"."""
    not_executable = tmp_path / "train.sh"
    not_executable.write_text("#!/bin/sh\necho hi\n")
    tmp_path.chmod(0o755)  # the job's account may enter it (a root daemon's jobs may not be root's)
    c = shared_daemon.client()
    programs = {
        "/nonexistent/prog": "No such file or directory",
        str(not_executable): "Permission denied",
        str(tmp_path): "Permission denied",
        "resnet19-no-such-command": "No such file or directory",
    }
    jobs = {program: c.submit(JobSubmit(command=[program, "--x"])).id for program in programs}
    for program, why in programs.items():
        done = wait_done(c, jobs[program])
        said = f"cannot run {program!r}: {why}"
        assert done.state == "failed" and done.exit_code == 127, done
        assert done.reason == said, done.reason
        assert said in c.log_tail(jobs[program]).decode()


def test_serve_without_gpus_or_with_bad_flags_says_why(tmp_path: Path) -> None:
    import shutil
    import subprocess

    def serve(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "ddpq",
                "serve",
                "--home",
                str(tmp_path),
                "--port",
                str(free_port()),
                *args,
                *root_flags(list(args)),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )

    if shutil.which("nvidia-smi") is None:
        r = serve()
        assert r.returncode == 2 and "--fake-gpus" in r.stderr and "Traceback" not in r.stderr
    # The refusals before the daemon sets itself up, in this process (a refused `ddpq
    # serve` process is ~1.5 s of CPU); the one above comes after, in a process.
    if os.geteuid() == 0:  # root without tokens: every local user could run as root
        r = run_in_process("serve", "--home", str(tmp_path), "--fake-gpus", "1")
        assert r.returncode == 2 and "--allow-root" in r.stderr and "Traceback" not in r.stderr
    for bad in (["--grace", "soon"], ["--port-range", "30000"], ["--fake-gpus", "-1"]):
        args = ["--fake-gpus", "1", *bad] if bad[0] != "--fake-gpus" else bad
        where = ["--home", str(tmp_path), "--port", str(free_port())]
        r = run_in_process("serve", *where, *args, *root_flags(args))
        assert r.returncode == 2, (bad, r.stderr)
        assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, (bad, r.stderr)


def test_the_api_never_serves_a_link_in_place_of_a_log(tmp_path: Path) -> None:
    from ddpq.jobdir import read_range

    secret = tmp_path / "secret"
    secret.write_text("root-only")
    log = tmp_path / "output.log"
    log.symlink_to(secret)
    assert read_range(log, 0, 1024) == (b"", 0)
    log.unlink()
    log.write_text("hello")
    assert read_range(log, 0, 1024) == (b"hello", 5)


def test_server_and_worker_as_two_processes(tmp_path: Path) -> None:
    import subprocess

    from tests.helpers import wait_for

    port = free_port()
    common = ["--home", str(tmp_path), "--fake-gpus", "2", *root_flags([])]
    procs = [
        subprocess.Popen([sys.executable, "-m", "ddpq", *cmd, *common], start_new_session=True)
        for cmd in (["server", "--port", str(port)], ["worker"])
    ]
    try:
        url = f"http://127.0.0.1:{port}"

        def ready() -> bool:
            try:
                return len(httpx.get(url + "/v1/devices", timeout=1).json()["items"]) == 2
            except (httpx.TransportError, ValueError, KeyError):
                return False

        wait_for(ready, 60, "the server and the worker")
        from ddpq.client.api import DdpqClient

        with DdpqClient(url) as c:
            job = c.submit(JobSubmit(command=["true"], gpus=1))
            assert wait_done(c, job.id).state == "succeeded"
    finally:
        for p in procs:
            p.terminate()
            p.wait(60)
