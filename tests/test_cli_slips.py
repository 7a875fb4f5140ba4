"""What a new user trips on (issue 26, item 14): bad usage is one line and exit 2, asking
for nothing is not an error, and a slip in a sweep is refused at submission."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ddpq import entry
from ddpq.client.sweeps import BadRef, sweep_params
from ddpq.core.sweeps import SweepError, check_params
from tests.stub_api import Answer, Request, StubApi, json_answer


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Request]]:
    """A daemon with no job of alice's; the requests it got."""
    seen: list[Request] = []

    def answer(request: Request) -> Answer:
        seen.append(request)
        if request.path == "/v1/whoami":
            return json_answer(200, {"name": "alice", "admin": False})
        if request.path == "/v1/jobs" and request.method == "GET":
            return json_answer(200, {"items": [], "total": 0, "offset": 0, "limit": 1000})
        if request.path == "/v1/queue" and request.method == "GET":  # ls's one screen
            return json_answer(200, {"jobs": [], "sweeps": [], "hidden": [], "only_owner": None})
        return json_answer(404, {"detail": "not here"})

    with StubApi(answer) as stub:
        monkeypatch.setenv("DDPQ_URL", stub.url)
        monkeypatch.delenv("DDPQ_TOKEN", raising=False)
        yield seen


def run(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str
) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "argv", ["ddpq", *args])
    with pytest.raises(SystemExit) as exc:
        entry.main()
        raise SystemExit(0)
    captured = capsys.readouterr()
    return int(exc.value.code or 0), captured.out, captured.err


def one_line(err: str) -> bool:
    return len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_cancel_mine_with_nothing_to_cancel_is_not_an_error(
    api: list[Request], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(monkeypatch, capsys, "cancel", "--mine")
    assert (code, out.strip(), err) == (0, "nothing to cancel", "")
    assert not [r for r in api if r.method != "GET"]  # nothing was cancelled


def test_cancel_with_neither_ids_nor_mine_is_still_bad_usage(
    api: list[Request], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(monkeypatch, capsys, "cancel")
    assert code == 2 and one_line(err) and "--mine" in err


@pytest.mark.parametrize(
    "states",
    [("bogus",), ("running", "RUNNNING"), ("",), ("preempted",), ("queued\x1b[31m",)],
    ids=["unknown", "typo-among-good", "empty", "an-attempts-state", "escape"],
)
def test_ls_with_a_state_that_is_none_is_one_line_and_exit_2_before_any_request(
    states: tuple[str, ...],
    api: list[Request],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = [arg for s in states for arg in ("--state", s)]
    code, out, err = run(monkeypatch, capsys, "ls", *args)
    assert code == 2 and out == "" and one_line(err), err
    assert "not one of queued, held" in err and "\x1b" not in err
    assert not api  # refused before asking


def test_ls_takes_a_state_in_any_case(
    api: list[Request], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(monkeypatch, capsys, "ls", "--state", "Running", "-s", "queued")
    assert code == 0 and out.split()[0] == "ID"
    assert [r.query.get("state") for r in api if r.path == "/v1/queue"] == [["running", "queued"]]


@pytest.mark.parametrize("spec", ["lr=", "lr= ", "lr=0.1,", "lr=,0.1", "lr=0.1,,0.2", "lr=0.1, ,2"])
def test_an_empty_sweep_value_is_refused_by_the_cli_and_the_daemon(spec: str) -> None:
    with pytest.raises(BadRef, match="an empty value"):
        sweep_params([spec])
    values = spec.partition("=")[2].split(",")
    with pytest.raises(SweepError, match="an empty value"):
        check_params({"lr": values})


def test_sweep_values_that_are_there_are_taken() -> None:
    assert sweep_params(["lr=0.1,0.2", "bs= 64"]) == {"lr": ["0.1", "0.2"], "bs": [" 64"]}
    assert check_params({"lr": ["0.1", "0.2"], "bs": ["64"]}) == 2


@pytest.mark.parametrize(
    ("words", "misplaced"),
    [
        (["--gpus", "1", "python", "train.py", "--gpus", "3"], "--gpus"),
        (["python", "train.py", "--gpus=3"], "--gpus=3"),
        (["python", "x.py", "-n", "5"], "-n"),
        (["--name", "x", "sleep", "1", "--no-hold"], "--no-hold"),
        (["--env", "A=1", "./run.sh", "--time-limit", "1h"], "--time-limit"),
    ],
)
def test_ddpqs_option_after_the_command_is_refused_not_taken(
    api: list[Request],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    words: list[str],
    misplaced: str,
) -> None:
    """Click reads options anywhere before `--`: `submit --gpus 1 python train.py --gpus 3`
    queued train.py with no argument on 3 GPUs (a new user's walk through the README)."""
    code, _, err = run(monkeypatch, capsys, "submit", *words)
    assert code == 2 and one_line(err), err
    assert err.startswith(f"ddpq: {misplaced}: after the command") and "after `--`" in err
    assert not any(r.method == "POST" for r in api)  # nothing queued


@pytest.mark.parametrize(
    "words",
    [
        ["--gpus", "1", "--", "python", "train.py", "--gpus", "3"],  # the command's, after --
        ["--gpus", "1", "python", "train.py", "--lr", "0.1"],  # no option of ddpq's
        ["--name", "python", "--hold", "--", "sleep", "1"],  # a value is no command
        ["resnet18", "--gpus", "1", "--epochs", "1"],  # a workload's name, then ddpq's options
    ],
)
def test_a_command_with_only_its_own_options_is_sent(
    api: list[Request],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    words: list[str],
) -> None:
    run(monkeypatch, capsys, "submit", *words)
    assert [r.path for r in api if r.method == "POST"] == ["/v1/jobs"]


def test_a_ctrl_c_before_the_command_runs_is_exit_130_without_a_trace(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ctrl-C while `ddpq` still imports (found interrupting `make demo`): no traceback."""
    from ddpq.client import quick

    def interrupted(_argv: object) -> bool:
        raise KeyboardInterrupt

    monkeypatch.setattr(quick, "run", interrupted)
    code, out, err = run(monkeypatch, capsys, "ls")
    assert (code, out, err) == (130, "", "")


@pytest.mark.parametrize(
    ("words", "warning"),
    [
        (
            ["resnet"],
            "resnet is not found where the job will look (did you mean the workload resnet18?)",
        ),
        (["--", "./no-such-script.sh"], "./no-such-script.sh is not found where the job will look"),
        (
            ["--", "no-such-program-here"],
            "no-such-program-here is not found where the job will look",
        ),
        (["--", "sh", "-c", "true"], None),  # on PATH
        (["--torchrun", "--", "train.py"], None),  # torchrun's script: torchrun's to find
    ],
)
def test_a_program_nowhere_the_job_looks_is_sent_with_a_warning(
    api: list[Request],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    words: list[str],
    warning: str | None,
) -> None:
    """`ddpq submit resnet` (a slip for the workload) was queued silently and failed a
    moment later: now it says so. Not refused: an earlier job may build the program."""
    _, _, err = run(monkeypatch, capsys, "submit", *words)
    warned = [line for line in err.splitlines() if "warning" in line]
    assert warned == ([f"ddpq: warning: {warning}"] if warning else []), err
    assert [r.path for r in api if r.method == "POST"] == ["/v1/jobs"]


def test_an_unknown_command_is_one_line(
    api: list[Request], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(monkeypatch, capsys, "frobnicate")
    assert code == 2 and one_line(err), err
    assert err.strip() == "ddpq: No such command 'frobnicate'. (`ddpq --help` lists the commands)"


@pytest.mark.parametrize(
    ("url", "here"),
    [
        ("", True),
        ("unix:/run/ddpq/ddpq.sock", True),
        ("http://127.0.0.1:8765", True),
        ("http://localhost:8765/", True),
        ("http://[::1]:8765", True),
        ("http://alice:pw@127.0.0.2:8765", True),
        ("http://server:8765", False),
        ("https://gpu.lab.example.org", False),
        ("http://10.0.0.7:8765", False),
    ],
)
def test_a_missing_program_is_warned_of_only_for_a_daemon_on_this_machine(
    monkeypatch: pytest.MonkeyPatch, url: str, here: bool
) -> None:
    """A job of a daemon elsewhere runs on another machine, whose files are not this one's."""
    from ddpq.client import submitting
    from ddpq.client.runtime import OPTIONS

    monkeypatch.setitem(OPTIONS, "url", None)
    monkeypatch.setenv("DDPQ_URL", url)
    assert submitting._daemon_here() is here


def test_a_folder_is_no_program_and_no_path_is_the_minimal_one(
    api: list[Request],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    (tmp_path / "tool").mkdir()
    monkeypatch.chdir(tmp_path)
    _, _, err = run(monkeypatch, capsys, "submit", "--", "./tool")
    assert "ddpq: warning: ./tool is not found" in err
    _, _, err = run(monkeypatch, capsys, "submit", "--export", "NONE", "--", "sh", "-c", "true")
    assert "warning" not in err  # /bin/sh, on the minimal PATH the job gets


def test_an_option_not_submits_before_the_command_is_left_to_its_own_error(
    api: list[Request], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--url` after `submit` is not submit's: its value is no command to blame (review)."""
    code, _, err = run(monkeypatch, capsys, "submit", "--url", "http://h", "--gpus", "2", "x")
    assert code == 2 and one_line(err) and "no such option: --url" in err, err
