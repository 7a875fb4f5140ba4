"""What `ddpq submit` sends, checked at a stand-in API (no daemon), and how it says the
daemon's refusals; the CLI validates nothing the wire schema does (no pydantic on its path)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ddpq.client.submission import refusal
from ddpq.core.jobenv import TERMINAL_ONLY
from tests.stub_api import Answer, Request, StubApi, json_answer


@pytest.fixture
def stub() -> Iterator[StubApi]:
    def answer(request: Request) -> Answer:
        if request.method == "POST" and request.path == "/v1/jobs":
            body = json.loads(request.body)
            if body.get("name") == "refuse-me":
                detail = "name: must be short; time_limit_s: Input should be greater than 0"
                return json_answer(422, {"detail": detail, "code": "invalid"})
            return json_answer(201, {"id": 7})
        return Answer(404, b"no")

    with StubApi(answer) as api:
        yield api


def ddpq(
    stub: StubApi, *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in TERMINAL_ONLY}
    return subprocess.run(
        [sys.executable, "-m", "ddpq", *args],
        capture_output=True,
        text=True,
        env={**base, "DDPQ_URL": stub.url, **(env or {})},
        cwd=cwd,
        timeout=60,
    )


def sent(stub: StubApi) -> dict[str, Any]:
    (request,) = [r for r in stub.requests if r.method == "POST"]
    assert request.headers["content-type"] == "application/json"
    body: dict[str, Any] = json.loads(request.body)
    return body


def test_submit_sends_the_shells_environment_without_its_terminal_and_ddpqs_variables(
    stub: StubApi, tmp_path: Path
) -> None:
    shell = {
        "MYVAR": "mine",
        "SSH_AUTH_SOCK": "/tmp/agent",
        "DISPLAY": ":1",
        "TERM": "xterm",
        "DDPQ_TOKEN": "ddpq_never-sent-in-the-environment",
        "MASTER_PORT": "29500",
        "CUDA_VISIBLE_DEVICES": "3",
    }
    r = ddpq(stub, "submit", "--", "python", "train.py", env=shell, cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == "7", r
    body = sent(stub)
    exported = body["exported_env"]
    assert exported["MYVAR"] == "mine" and exported["PATH"] == os.environ["PATH"]
    for key in ("SSH_AUTH_SOCK", "DISPLAY", "TERM", "DDPQ_TOKEN", "MASTER_PORT"):
        assert key not in exported, key
    assert "CUDA_VISIBLE_DEVICES" not in exported
    # The submitter's directory; the defaults are not sent (the API has them).
    assert body["cwd"] == str(tmp_path.resolve())
    assert set(body) == {"command", "cwd", "exported_env"}
    assert body["command"] == ["python", "train.py"]


def test_submit_sends_the_options_that_differ_from_the_defaults(stub: StubApi) -> None:
    args = ["--gpus", "2", "--name", "n", "--priority", "-5", "--retries", "1", "--hold"]
    args += ["--after", "3", "--after", "4", "--time-limit", "1h30m", "--env", "A=b=c"]
    r = ddpq(stub, "submit", *args, "--export", "NONE", "--torchrun", "--", "train.py")
    assert r.returncode == 0, r
    body = sent(stub)
    assert {k: v for k, v in body.items() if k not in ("cwd", "exported_env")} == {
        "gpus": 2,
        "name": "n",
        "priority": -5,
        "retries": 1,
        "hold": True,
        "after": [3, 4],
        "time_limit_s": 5400.0,
        "env": {"A": "b=c"},
        "torchrun": True,
        "command": ["train.py"],
    }
    assert set(body["exported_env"]) <= {"LANG"}  # NONE: the language alone travels


def test_a_workload_is_sent_by_name_with_its_arguments(stub: StubApi) -> None:
    r = ddpq(stub, "submit", "resnet18", "--gpus", "2", "--epochs", "5", "--amp")
    assert r.returncode == 0, r
    body = sent(stub)
    assert body["workload"] == "resnet18" and body["args"] == ["--epochs", "5", "--amp"]
    assert "command" not in body and "torchrun" not in body


def test_a_refusal_is_said_with_the_options_names(stub: StubApi) -> None:
    r = ddpq(stub, "submit", "--name", "refuse-me", "--", "true")
    assert r.returncode == 2, r
    assert r.stderr == (
        "ddpq: --name: must be short; --time-limit: Input should be greater than 0\n"
    )


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--export", "A-B"], "--export: 'A-B' is not a variable name"),
        (["--export", "A,,B"], "--export: '' is not a variable name"),
        (["--env", "NOEQUALS"], "--env 'NOEQUALS': expected KEY=VALUE"),
        (["--time-limit", "soon"], "--time-limit: 'soon' is not a duration"),
    ],
)
def test_what_the_cli_parses_itself_is_refused_before_anything_is_sent(
    stub: StubApi, args: list[str], words: str
) -> None:
    r = ddpq(stub, "submit", *args, "--", "true")
    assert r.returncode == 2 and r.stderr.startswith(f"ddpq: {words}"), r
    assert len(r.stderr.splitlines()) == 1
    assert stub.requests == []


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (
            ["--gpu-memory", "4G", "--", "true"],
            "no such option: --gpu-memory (did you mean --gpu-mem?)",
        ),
        (
            ["--gpu-memory=4G", "--", "true"],
            "no such option: --gpu-memory (did you mean --gpu-mem?)",
        ),
        (["--priorty", "3", "resnet18"], "no such option: --priorty (did you mean --priority?)"),
        (["-x", "--", "python", "train.py"], "no such option: -x;"),
        (["--zzzz", "--", "true"], "no such option: --zzzz;"),
        (["--", "--not-a-program"], "no such option: --not-a-program;"),
    ],
)
def test_an_unknown_option_before_the_command_is_refused_not_run(
    stub: StubApi, args: list[str], words: str
) -> None:
    """Submit passes what it does not know to the job, so a misspelt option of its own
    would have become the command ("--gpu-memory 4G true", exit 127 later)."""
    r = ddpq(stub, "submit", *args)
    assert r.returncode == 2 and r.stderr.startswith(f"ddpq: {words}"), r
    assert len(r.stderr.splitlines()) == 1
    assert stub.requests == []


def test_options_after_the_command_or_workload_are_the_jobs(stub: StubApi) -> None:
    r = ddpq(stub, "submit", "--gpus", "1", "--", "python", "train.py", "--gpu-memory", "4G")
    assert r.returncode == 0, r
    assert sent(stub)["command"] == ["python", "train.py", "--gpu-memory", "4G"]


def test_a_variable_that_is_not_utf8_is_left_out_with_a_warning(stub: StubApi) -> None:
    env = {k: v for k, v in os.environ.items() if k not in TERMINAL_ONLY}
    bad: dict[bytes, bytes] = {os.fsencode(k): os.fsencode(v) for k, v in env.items()}
    bad[b"LATIN1"] = b"caf\xe9"
    bad[b"DDPQ_URL"] = stub.url.encode()
    r = subprocess.run(
        [sys.executable, "-m", "ddpq", "submit", "--", "true"],
        capture_output=True,
        env=bad,
        timeout=60,
    )
    assert r.returncode == 0, r
    assert r.stderr.decode() == (
        "ddpq: warning: left out of the job's environment (not UTF-8): LATIN1\n"
    )
    assert "LATIN1" not in sent(stub)["exported_env"]


@pytest.mark.parametrize(
    ("detail", "said"),
    [
        ("gpus: asked for 5 GPUs but this server has 4", "--gpus: asked for 5 GPUs"),
        ("time_limit_s: Input should be less than or equal to 31536000", "--time-limit: at most"),
        ("after.0: Input should be greater than or equal to 1", "--after: Input should be"),
        ("env.K: contains a NUL", "--env K: contains a NUL"),
        ("env.\\ud800.[key]: not valid Unicode", "--env \\ud800: not valid Unicode"),
        ("exported_env: 300 KiB of variables", "--export: 300 KiB"),
        ("cwd: /x is not a directory the job can enter", "--cwd: /x is not"),
        ("args: argument --epochs: invalid", "resnet18: argument --epochs: invalid"),
        ("give either a command or a workload, not both", "give either a command"),
        ("owner: whatever", "owner: whatever"),
        # A sweep's template: its fields are the job's (`template.command` was said as is).
        ("template.command: {nope} names no parameter", "the command: {nope} names no"),
        ("template.gpus: asked for 5 GPUs", "--gpus: asked for 5 GPUs"),
        # A token's lifetime (`ddpq token create --expires 400d`): in days, not seconds.
        ("expires_s: Input should be less than or equal to 31536000", "--expires: at most 365d"),
    ],
)
def test_refusal_names_the_options(detail: str, said: str) -> None:
    assert refusal(detail, "resnet18").startswith(said)


def test_refusal_keeps_every_problem_on_one_line() -> None:
    out = refusal("gpus: too many; name: bad; hold: Input should be a valid boolean")
    assert out == "--gpus: too many; --name: bad; --hold: Input should be a valid boolean"
