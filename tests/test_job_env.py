"""A job runs in its submitter's environment (issue 11): `ddpq submit --export`, end to end.

Each job here prints its whole environment as JSON (``sys.executable -c``, no shell in
between to add or drop variables), submitted through the real CLI from an environment the
test controls.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from ddpq.core.jobenv import MINIMAL_PATH, TERMINAL_ONLY
from ddpq.schemas import JobSubmit
from tests.helpers import Daemon, wait_done
from tests.test_auth import authed  # noqa: F401 - the --auth fixture, used below

Completed = subprocess.CompletedProcess[str]
PRINT_ENV = "import json, os; print('ENV=' + json.dumps(dict(os.environ)))"


def cli(d: Daemon, *args: str, env: dict[str, str], check: bool = True) -> Completed:
    """`ddpq ARGS` run from the test's environment plus ``env`` (variables of any name)."""
    r = subprocess.run(
        [sys.executable, "-m", "ddpq", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "DDPQ_URL": d.url, **env},
        timeout=120,
    )
    if check and r.returncode != 0:
        raise AssertionError(f"ddpq {' '.join(args)} -> {r.returncode}: {r.stderr}")
    return r


def submit_env(d: Daemon, *args: str, **env: str) -> dict[str, str]:
    """Submit a job that prints its environment through `ddpq submit ARGS`, run from the
    test's environment plus ``env``; the environment the job saw."""
    job_id = int(cli(d, "submit", *args, "--", sys.executable, "-c", PRINT_ENV, env=env).stdout)
    return environment_of(d, job_id)


def environment_of(d: Daemon, job_id: int, token: str | None = None) -> dict[str, str]:
    c = d.client(token)
    done = wait_done(c, job_id)
    log = c.log_tail(job_id, 1 << 20).decode()
    assert done.state == "succeeded", (done.reason, log)
    line = next(ln for ln in log.splitlines() if ln.startswith("ENV="))
    printed: dict[str, str] = json.loads(line.removeprefix("ENV="))
    return printed


@pytest.fixture(scope="module")
def one_gpu(module_daemons: Callable[..., Daemon]) -> Daemon:
    """The module's daemon: its tests submit and read their own jobs, each waits for its
    own to end, and "nothing queued" is an unchanged count of jobs."""
    # A variable of the daemon's own: a job that exported its submitter's must not see it.
    return module_daemons("--fake-gpus", "1", "--grace", "1s", DAEMON_ONLY="the-daemon's")


def test_a_job_from_an_activated_venv_runs_its_python_and_sees_the_shells_variable(
    one_gpu: Daemon, tmp_path: Path
) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    activated = {
        "PATH": f"{venv}/bin:{os.environ['PATH']}",
        "VIRTUAL_ENV": str(venv),
        "MYVAR": "from the shell",
    }
    script = 'command -v python; python -c "import sys; print(sys.prefix)"; echo "MYVAR=$MYVAR"'
    job_id = int(cli(one_gpu, "submit", "--", "sh", "-c", script, env=activated).stdout)
    c = one_gpu.client()
    assert wait_done(c, job_id).state == "succeeded"
    lines = c.log_tail(job_id).decode().splitlines()[1:]  # after ddpq's attempt header
    assert lines == [f"{venv}/bin/python", str(venv), "MYVAR=from the shell"]
    env = c.env(job_id)
    assert env.base == "exported" and env.env["VIRTUAL_ENV"] == str(venv)


def test_an_exported_environment_replaces_the_daemons_and_ddpqs_variables_win(
    one_gpu: Daemon,
) -> None:
    env = submit_env(
        one_gpu,
        "--gpus",
        "1",
        MYVAR="mine",
        MASTER_PORT="1234",  # a shell's own: left out, ddpq's wins
        CUDA_VISIBLE_DEVICES="7",
        DDPQ_TOKEN="ddpq_my-own-token",  # the submitter's token never travels
    )
    assert env["MYVAR"] == "mine" and env["PATH"] == os.environ["PATH"]
    assert "DAEMON_ONLY" not in env
    assert env["CUDA_VISIBLE_DEVICES"] == "0" and env["MASTER_PORT"] != "1234"
    assert env["DDPQ_JOB_ID"] and "DDPQ_TOKEN" not in env
    job_id = int(env["DDPQ_JOB_ID"])
    stored = one_gpu.client().env(job_id).env
    assert "DDPQ_TOKEN" not in stored and "MASTER_PORT" not in stored


def test_export_none_gives_a_minimal_environment(one_gpu: Daemon) -> None:
    env = submit_env(one_gpu, "--export", "NONE", MYVAR="mine", LANG="C.UTF-8")
    assert "MYVAR" not in env and "DAEMON_ONLY" not in env
    assert env["PATH"] == MINIMAL_PATH
    assert env["LANG"] == "C.UTF-8"
    assert env["HOME"] and env["USER"] and env["LOGNAME"] == env["USER"]
    assert env["DDPQ_JOB_DIR"] and env["OMP_NUM_THREADS"]


def test_export_a_list_gives_those_variables_and_the_minimal_ones(one_gpu: Daemon) -> None:
    env = submit_env(one_gpu, "--export", "MYVAR", MYVAR="mine", OTHER="not listed")
    assert env["MYVAR"] == "mine"
    assert "OTHER" not in env and env["PATH"] == MINIMAL_PATH


def test_env_options_win_over_the_exported_environment(one_gpu: Daemon) -> None:
    env = submit_env(one_gpu, "--env", "MYVAR=explicit", "-e", "EXTRA=x", MYVAR="shell")
    assert env["MYVAR"] == "explicit" and env["EXTRA"] == "x"


def test_terminal_only_variables_never_reach_the_job(one_gpu: Daemon) -> None:
    terminal = {
        "SSH_AUTH_SOCK": "/tmp/ssh-agent.sock",
        "SSH_CONNECTION": "10.0.0.1 50000 10.0.0.2 22",
        "DISPLAY": ":0",
        "XAUTHORITY": "/home/x/.Xauthority",
        "TERM": "xterm-256color",
        "TMUX": "/tmp/tmux-0/default,1,0",
        "SHLVL": "3",
        "OLDPWD": "/somewhere",
        "_": "/usr/bin/ddpq",
    }
    env = submit_env(one_gpu, KEPT="yes", **terminal)
    assert env["KEPT"] == "yes"
    assert not set(terminal) & set(env), set(terminal) & set(env)
    # A client that sends them anyway: the daemon leaves them out too.
    c = one_gpu.client()
    sent = {**terminal, "KEPT": "yes"}
    job = c.submit(JobSubmit(command=[sys.executable, "-c", PRINT_ENV], exported_env=sent))
    stored = c.env(job.id)
    assert stored.base == "exported" and stored.env == {"KEPT": "yes"}
    assert not set(TERMINAL_ONLY) & set(environment_of(one_gpu, job.id))


def test_an_api_client_that_exports_nothing_gets_the_daemons_environment(
    one_gpu: Daemon,
) -> None:
    c = one_gpu.client()
    job = c.submit(JobSubmit(command=[sys.executable, "-c", PRINT_ENV], env={"A": "1"}))
    env = environment_of(one_gpu, job.id)
    assert env["DAEMON_ONLY"] == "the-daemon's" and env["A"] == "1"
    assert c.env(job.id).model_dump() == {"id": job.id, "base": "daemon", "env": {"A": "1"}}


def test_an_explicit_env_may_not_set_ddpqs_variables(one_gpu: Daemon) -> None:
    queued = one_gpu.client().list().total
    r = one_gpu.cli("submit", "--env", "MASTER_PORT=1", "--", "true", check=False)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip() == (
        "ddpq: --env: MASTER_PORT is set by ddpq for every job and cannot be overridden"
    )
    assert one_gpu.client().list().total == queued  # nothing queued


# ---- sizes -------------------------------------------------------------------------------


def conda_like() -> dict[str, str]:
    """A big but ordinary conda shell: 64 KiB of PATH and LD_LIBRARY_PATH, ~150 variables."""
    dirs = [f"/opt/conda/envs/exp{i}/lib/python3.11/site-packages/nvidia/lib" for i in range(600)]
    env = {f"CONDA_VAR_{i}": "x" * 100 for i in range(150)}
    env["LD_LIBRARY_PATH"] = ":".join(dirs)[: 32 * 1024]
    env["PATH"] = f"{Path(sys.executable).parent}:" + ":".join(dirs)[: 32 * 1024] + ":/usr/bin:/bin"
    return env


def test_a_conda_sized_environment_travels_whole(one_gpu: Daemon) -> None:
    big = conda_like()
    env = submit_env(one_gpu, **big)
    for key, value in big.items():
        assert env[key] == value, key


def post(d: Daemon, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(d.url + "/v1/jobs", json={"command": ["true"], **body}, timeout=30)


@pytest.mark.parametrize(
    ("exported", "words"),
    [
        ({f"V{i}": "1" for i in range(1025)}, "more than 1024 variables"),
        ({f"V{i}": "x" * 60_000 for i in range(5)}, "more than 256 KiB"),
        ({"HUGE": "x" * (64 * 1024 + 1)}, "HUGE is longer than 64 KiB"),
        ({"A=B": "1"}, "not a variable name"),
        ({"": "1"}, "not a variable name"),
        ({"SECRET": "s3cr3t\x00"}, "SECRET contains a NUL byte"),
    ],
    ids=["too-many", "too-large", "value-too-long", "equals-in-name", "empty-name", "nul"],
)
def test_an_environment_too_large_or_malformed_is_refused_with_422(
    one_gpu: Daemon, exported: dict[str, str], words: str
) -> None:
    queued = one_gpu.client().list().total
    r = post(one_gpu, {"exported_env": exported})
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert "exported_env" in detail and words in detail, detail
    assert "s3cr3t" not in detail  # names in messages, never values
    assert one_gpu.client().list().total == queued  # nothing queued


def test_the_cli_says_a_too_large_environment_in_its_own_words(one_gpu: Daemon) -> None:
    huge = {f"BIG_{i}": "x" * 60_000 for i in range(5)}
    r = cli(one_gpu, "submit", "--", "true", check=False, env=huge)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith("ddpq: --export: ") and "more than 256 KiB" in r.stderr
    small = cli(one_gpu, "submit", "--export", "NONE", "--", "true", env=huge)
    assert int(small.stdout) >= 1


def test_bash_functions_exported_by_name_travel(one_gpu: Daemon) -> None:
    # Lmod's `module` is an exported Bash function: not an identifier, still a variable.
    key = "BASH_FUNC_module%%"
    env = submit_env(one_gpu, **{key: "() {  echo module\n}"})
    assert env[key] == "() {  echo module\n}"


# ---- secrets ----------------------------------------------------------------------------

SECRET = "s3cr3t-value-of-alices"


def get_paths(d: Daemon, job_id: int) -> list[str]:
    """Every GET path the API documents, with this job's id in it, and those it does not."""
    spec = httpx.get(d.url + "/openapi.json", timeout=10).json()
    paths = [p.replace("{job_id}", str(job_id)) for p, ops in spec["paths"].items() if "get" in ops]
    return [*paths, "/metrics", "/", "/static/app.js", f"/v1/jobs/{job_id}/log?follow=false"]


def test_only_the_owner_and_admins_read_a_jobs_environment(
    authed: tuple[Daemon, str, str, str],  # noqa: F811 - the fixture imported above
) -> None:
    d, alice, bob, admin = authed
    job_id = int(
        d.cli(
            "submit", "--", sys.executable, "-c", "print('done')", DDPQ_TOKEN=alice, API_KEY=SECRET
        ).stdout
    )
    wait_done(d.client(alice), job_id)
    as_alice = d.cli("show", str(job_id), "--env", DDPQ_TOKEN=alice)
    assert f"API_KEY={SECRET}" in as_alice.stdout
    assert alice not in as_alice.stdout  # the submitter's own DDPQ_TOKEN never travelled
    assert d.client(admin).env(job_id).env["API_KEY"] == SECRET

    refused = d.cli("show", str(job_id), "--env", check=False, DDPQ_TOKEN=bob)
    assert refused.returncode == 5 and "belongs to alice" in refused.stderr
    bob_headers = {"Authorization": f"Bearer {bob}"}
    seen = []
    for path in get_paths(d, job_id):
        r = httpx.get(d.url + path, headers=bob_headers, timeout=10)
        assert SECRET not in r.text, path
        seen.append((path, r.status_code))
    assert (f"/v1/jobs/{job_id}/env", 403) in seen, seen
    for args in (("ls", "--all", "--json"), ("show", str(job_id), "--json"), ("ls", "--all")):
        assert SECRET not in d.cli(*args, DDPQ_TOKEN=bob).stdout
    d.stop()
    assert SECRET not in (d.home / "daemon.log").read_text()


# Larger than a datagram on a SOCK_SEQPACKET socket may be where net.core.wmem_max is the
# default 208 KiB: the request travels in a memory file (forkclient.INLINE_REQUEST_MAX).
def test_the_largest_environment_accepted_is_started_by_the_fork_server(
    one_gpu: Daemon,
) -> None:
    c = one_gpu.client()
    near_the_limit = {f"V{i}": "x" * 60_000 for i in range(4)}  # 240,000 bytes of 256 KiB
    command = [sys.executable, "-c", "import os; print(len(os.environ['V3']))"]
    job = c.submit(JobSubmit(command=command, exported_env=near_the_limit))
    assert wait_done(c, job.id).state == "succeeded"  # started either way...
    assert b"60000" in c.log_tail(job.id)
    log = (one_gpu.home / "daemon.log").read_text()
    assert "fork server is gone" not in log  # ...but through the fork server?
