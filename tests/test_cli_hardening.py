"""The CLI against hostile text and careless input (issue 9, items 12 and 16, `ddpq login`).

Names, owners, commands, reasons, progress and GPU names are chosen by users, jobs or a
driver: whatever they hold, `ls`, `show`, `gpus`, `watch`, `cancel`/`hold` must print it
inert (no escape sequence reaches the terminal, no Rich markup is interpreted).
"""

from __future__ import annotations

import io
import json
import re
import stat
import subprocess
import sys
import unicodedata
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from ddpq import entry
from ddpq.client import account
from ddpq.client import draw as drawing
from ddpq.client.format import progress_fraction, progress_line, sanitize
from ddpq.client.watchview import render
from ddpq.core.units import parse_duration
from ddpq.schemas import DeviceList, JobDetail
from tests.cli_inprocess import run_in_process
from tests.helpers import Daemon, free_port, root_flags, wait_for
from tests.stub_api import Answer, Request, StubApi, json_answer

# (hostile text, how it must show): each would act on a terminal if printed raw.
HOSTILE = [
    pytest.param("\x1b[31mred\x1b[0m", "\\x1b[31mred", id="csi-colour"),
    pytest.param("\x1b[2J\x1b[H", "\\x1b[2J", id="csi-clear-screen"),
    pytest.param("\x1b]0;pwned\x07", "\\x1b]0;pwned\\x07", id="osc-title"),
    pytest.param(
        "\x1b]8;;https://evil.example\x1b\\click\x1b]8;;\x1b\\",
        "\\x1b]8;;https://evil.example",
        id="osc8-hyperlink",
    ),
    pytest.param("\x9b2J", "\\x9b2J", id="c1-csi"),
    pytest.param("ok\rFAKE", "ok\\rFAKE", id="carriage-return"),
    pytest.param("abc\b\b\bxyz", "abc\\x08\\x08", id="backspace"),
    pytest.param("a\nb", "a\\nb", id="newline"),
    pytest.param("nul\x00del\x7f", "nul\\x00del\\x7f", id="nul-del"),
    pytest.param("\u202egnp.exe", "\\u202egnp.exe", id="bidi-override"),
    pytest.param("\u2066isolate\u2069", "\\u2066isolate", id="bidi-isolate"),
    pytest.param("zero\u200bwidth", "zero\\u200bwidth", id="zero-width-space"),
    pytest.param("line\u2028sep", "line\\u2028sep", id="line-separator"),
    pytest.param("lone\ud800", "lone\\ud800", id="lone-surrogate"),
]
# Rich markup and emoji codes: each would crash Rich or restyle/rewrite the text.
MARKUP = [
    "[/bold]",
    "[/]",
    "[red]red[/red]",
    "[link=https://evil.example]click[/link]",
    "[bold]x",
    "x :smile: y",
]
UNSAFE = {"Cc", "Cf", "Cs", "Zl", "Zp"}
NOW = datetime.now(UTC) - timedelta(minutes=5)


def assert_inert(out: str) -> None:
    """No character in ``out`` acts on a terminal, except newlines and Rich's own colours."""
    stripped = re.sub(r"\x1b\[[0-9;]*m", "", out)  # SGR colour codes Rich writes itself
    bad = [
        ch
        for ch in stripped
        if ch != "\n" and ch not in "\u200c\u200d" and unicodedata.category(ch) in UNSAFE
    ]
    assert not bad, f"raw control characters {bad!r} in {out!r}"


def job_data(text: str, job_id: int = 1) -> dict[str, Any]:
    """A job whose every user- or job-chosen field holds ``text``."""
    return {
        "id": job_id,
        "name": text,
        "owner": text,
        "command": ["python", text],
        "launcher": "exec",
        "gpus": 1,
        "priority": 0,
        "state": "running",
        "reason": text,
        "submitted_at": NOW.isoformat(),
        "started_at": NOW.isoformat(),
        "ended_at": None,
        "exit_code": None,
        "exit_signal": None,
        "time_limit_s": None,
        "retries": 0,
        "attempt": 1,
        "after": [],
        "hold": False,
        "leases": {"gpus": [0], "port": 29600},
        "progress": {"epoch": text, "epochs": 5},
        "job_dir": f"/state/jobs/{text}",
        "events": [
            {"at": NOW.isoformat(), "from_state": None, "to_state": "queued", "reason": text}
        ],
        "attempts": [
            {
                "number": 1,
                "gpus": [0],
                "port": 29600,
                "started_at": NOW.isoformat(),
                "ended_at": None,
                "exit_code": None,
                "exit_signal": None,
                "state": None,
                "reason": text,
            }
        ],
    }


def devices_data(text: str) -> dict[str, Any]:
    return {
        "items": [
            {
                "index": 0,
                "uuid": "GPU-0",
                "name": text,
                "fake": False,
                "memory_total_mb": 80000,
                "memory_used_mb": 10,
                "status": "leased",
                "job_id": 1,
                "owner": text,
                "since": NOW.isoformat(),
            },
            {
                "index": 1,
                "uuid": "GPU-1",
                "name": text,
                "fake": True,
                "memory_total_mb": 80000,
                "memory_used_mb": 0,
                "status": "free",
            },
        ],
        "ports_leased": {"29600": 1},
    }


def draw(renderable: Any) -> str:
    """``renderable`` as a pipe and as a colour terminal would get it."""
    out = []
    for terminal in (False, True):
        buf = io.StringIO()
        Console(file=buf, width=500, force_terminal=terminal, color_system="standard").print(
            renderable
        )
        out.append(buf.getvalue())
    return "\n".join(out)


def render_show(text: str, capsys: pytest.CaptureFixture[str], as_model: bool = True) -> str:
    job = JobDetail.model_validate(job_data(text)) if as_model else job_data(text)
    drawing.render_job(job, f"log {text}\nlast line".encode("utf-8", "surrogatepass"))
    return capsys.readouterr().out


def render_env(text: str, capsys: pytest.CaptureFixture[str]) -> str:
    drawing.render_env({"id": 1, "base": "exported", "env": {text: text, "OK": text}})
    return capsys.readouterr().out


# The views take the API's JSON as the CLI gets it, and the wire schemas' models.
RENDERERS: dict[str, Callable[[str, pytest.CaptureFixture[str]], str]] = {
    "ls": lambda t, _: draw(drawing.jobs_table([JobDetail.model_validate(job_data(t))])),
    "ls (json)": lambda t, _: draw(drawing.jobs_table([job_data(t)])),
    "show": render_show,
    "show (json)": lambda t, capsys: render_show(t, capsys, as_model=False),
    "gpus": lambda t, _: draw(drawing.gpu_table(DeviceList.model_validate(devices_data(t)))),
    "gpus (json)": lambda t, _: draw(drawing.gpu_table(devices_data(t))),
    "watch": lambda t, _: draw(
        render(
            [JobDetail.model_validate(job_data(t))],
            DeviceList.model_validate(devices_data(t)),
        )
    ),
    "watch (json)": lambda t, _: draw(render([job_data(t)], devices_data(t))),
    "show --env": render_env,
}


# How many places each view prints the text of job_data/devices_data.
FIELDS = {"ls": 3, "show": 9, "gpus": 3, "watch": 4, "show --env": 3}
FIELDS.update({f"{view} (json)": FIELDS[view] for view in ("ls", "show", "gpus", "watch")})


@pytest.fixture(autouse=True)
def _wide(monkeypatch: pytest.MonkeyPatch) -> None:
    # `show` prints through its own Console on stdout: wide enough that nothing wraps.
    monkeypatch.setenv("COLUMNS", "500")


@pytest.mark.parametrize("view", RENDERERS)
@pytest.mark.parametrize(("text", "shown"), HOSTILE)
def test_views_print_escape_sequences_and_controls_as_visible_escapes(
    view: str, text: str, shown: str, capsys: pytest.CaptureFixture[str]
) -> None:
    out = RENDERERS[view](text, capsys)
    assert_inert(out)
    assert shown in out


@pytest.mark.parametrize("view", RENDERERS)
@pytest.mark.parametrize("text", MARKUP)
def test_views_print_rich_markup_literally(
    view: str, text: str, capsys: pytest.CaptureFixture[str]
) -> None:
    out = RENDERERS[view](text, capsys)
    # Neither a MarkupError nor styled or rewritten text, in every field that holds it.
    assert out.count(text) >= FIELDS[view], out


def test_show_keeps_the_log_tails_lines_and_escapes_the_rest(
    capsys: pytest.CaptureFixture[str],
) -> None:
    job = JobDetail.model_validate(job_data("x"))
    drawing.render_job(job, b"epoch 1\n\x1b]0;pwned\x07[/bold]\n\tindented \xff")
    out = capsys.readouterr().out
    assert_inert(out)
    tail = out.split("log tail\n", 1)[1]
    lines = tail.splitlines()
    assert lines[:2] == ["epoch 1", "\\x1b]0;pwned\\x07[/bold]"]
    assert lines[2] == " " * 8 + "indented \ufffd"  # Rich expands the tab


@pytest.mark.parametrize(
    "text",
    ["plain", "naïve café", "日本語", "👩\u200d🔬 scientist", "tab-less spaces  two", "a\\x1b"],
)
def test_sanitize_leaves_printable_text_alone(text: str) -> None:
    assert sanitize(text) == text


@pytest.mark.parametrize(("text", "shown"), HOSTILE)
def test_sanitize_leaves_nothing_that_acts_on_a_terminal(text: str, shown: str) -> None:
    out = sanitize(text)
    assert_inert(out)
    assert shown in out


def test_sanitize_keeps_newlines_and_tabs_only_when_asked() -> None:
    assert sanitize("a\nb\tc") == "a\\nb\\tc"
    assert sanitize("a\nb\tc\x1b", multiline=True) == "a\nb\tc\\x1b"


# ---- progress values a job chose ---------------------------------------------------------


@pytest.mark.parametrize(
    "progress",
    [
        {"epoch": 1, "epochs": 5, "eta_s": float("nan")},
        {"epoch": 1, "epochs": 5, "eta_s": float("inf")},
        {"epoch": 1, "epochs": 5, "eta_s": -float("inf")},
        {"epoch": 1, "epochs": 5, "test_acc": 10**400},
        {"epoch": 1, "epochs": 5, "test_acc": float("nan")},
        {"epoch": 1, "epochs": 5, "images_per_s": 10**400},
        {"epoch": 1, "epochs": 5, "train_loss": float("inf")},
    ],
)
def test_progress_line_skips_numbers_that_are_not_finite(progress: dict[str, Any]) -> None:
    line = progress_line(progress)
    assert line == "epoch 1/5"


@pytest.mark.parametrize(
    "progress",
    [
        {"epochs": "nan", "epoch": 1},
        {"epochs": "inf", "epoch": 1},
        {"epochs": 5, "epoch": "inf"},
        {"epochs": 5, "epoch": float("nan")},
        {"epochs": 10**400, "epoch": 1},
        {"epochs": 5, "epoch": 2, "phase": "train", "steps": 10**400, "step": 1},
    ],
)
def test_progress_fraction_gives_no_bar_for_numbers_that_are_not_finite(
    progress: dict[str, Any],
) -> None:
    assert progress_fraction(progress) is None


# ---- --time-limit and parse_duration ------------------------------------------------------

BAD_DURATIONS = [
    "",
    "   ",
    "nan",
    "NaN",
    "inf",
    "-inf",
    "infinity",
    "-1",
    "-5m",
    "0",
    "0s",
    "0m",
    "1e400",
    "1e3",
    "9" * 400,
    "9" * 400 + "d",
    "1_000",
    "\u0663",  # ARABIC-INDIC DIGIT THREE: float() and \d take it
    "1h30",
    "30 m",
    "m",
]


@pytest.mark.parametrize("text", BAD_DURATIONS)
def test_parse_duration_refuses_what_is_not_a_positive_finite_duration(text: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90", 90),
        ("90s", 90),
        ("30m", 1800),
        ("1h30m", 5400),
        ("1d", 86400),
        ("1.5h", 5400),
        (" 2H ", 7200),
        (".5", 0.5),
        ("1.", 1),
    ],
)
def test_parse_duration_reads_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


def run_ddpq(*args: str, stdin: str | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    """`ddpq` as a user runs it, pointed at a port where nothing listens (exit 3 if it
    ever gets that far); in this process: these tests are of what it says, not of the
    process (tests/cli_inprocess.py)."""
    url = f"http://127.0.0.1:{free_port()}"
    return run_in_process(*args, env={"DDPQ_URL": url, **env}, stdin=stdin or "")


def assert_usage_error(r: subprocess.CompletedProcess[str], *words: str) -> None:
    assert r.returncode == 2, r
    assert "Traceback" not in r.stderr and "Usage:" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    for word in words:
        assert word in r.stderr


@pytest.mark.parametrize(
    "value", ["", " ", "nan", "inf", "-1", "1e400", "0", "0s", "1_000", "1h30"]
)
def test_submit_refuses_a_bad_time_limit_naming_the_option(value: str) -> None:
    r = run_ddpq("submit", f"--time-limit={value}", "--", "true")
    assert_usage_error(r, "--time-limit")


def test_submit_refuses_a_time_limit_over_the_bound_in_days(shared_daemon: Daemon) -> None:
    # The bound is the wire schema's, which the daemon checks (the CLI imports no pydantic):
    # this one needs a daemon to say no.
    queued = shared_daemon.client().list().total
    r = shared_daemon.cli("submit", "--time-limit=400d", "--", "true", check=False)
    assert_usage_error(r, "--time-limit: at most 365d")
    assert shared_daemon.client().list().total == queued  # nothing queued


@pytest.mark.parametrize("value", ["", "nan", "inf", "-1s", "1e400"])
def test_daemon_refuses_a_bad_grace(value: str, tmp_path: Path) -> None:
    args = ["serve", "--home", str(tmp_path), "--port", str(free_port()), "--grace", value]
    r = run_ddpq(*args, *root_flags(args), "--fake-gpus", "1")
    assert r.returncode == 2 and "duration" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("grace", ["0", "0s"])
def test_daemon_still_takes_a_zero_grace(grace: str, make_daemon: Callable[..., Daemon]) -> None:
    d = make_daemon("--fake-gpus", "1", "--grace", grace)
    assert d.client().health()


# ---- ddpq login ---------------------------------------------------------------------------


@pytest.fixture
def config(tmp_path: Path) -> dict[str, str]:
    # The daemon the token is for: `ddpq login` keeps it with the token.
    return {
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "DDPQ_TOKEN": "",
        "DDPQ_URL": "http://ddpq.example:8765",
    }


def saved(config: dict[str, str]) -> dict[str, str]:
    data: dict[str, str] = json.loads(saved_token(config).read_text())
    return data


def saved_token(config: dict[str, str]) -> Path:
    return Path(config["XDG_CONFIG_HOME"]) / "ddpq" / "token"


@pytest.mark.parametrize("stdin", ["ddpq_abc-DEF_123\n", "  ddpq_abc-DEF_123  \n\n"])
def test_login_reads_the_token_from_standard_input(stdin: str, config: dict[str, str]) -> None:
    r = run_ddpq("login", stdin=stdin, **config)
    assert r.returncode == 0 and r.stderr == "", r
    path = saved_token(config)
    assert saved(config) == {"url": "http://ddpq.example:8765", "token": "ddpq_abc-DEF_123"}
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_login_with_the_token_as_an_argument_works_but_warns(config: dict[str, str]) -> None:
    r = run_ddpq("login", "ddpq_abc", **config)
    assert r.returncode == 0
    assert "warning" in r.stderr and "visible to other users" in r.stderr
    assert saved(config)["token"] == "ddpq_abc"


@pytest.mark.parametrize("via", ["stdin", "argument"])
@pytest.mark.parametrize(
    "token",
    ["", "   ", "\n", "two words", "t\u00f6k", "tok\x1b[31m", "tok\nsecond-line", "x" * 2000],
)
def test_login_refuses_an_empty_or_malformed_token(
    via: str, token: str, config: dict[str, str]
) -> None:
    r = (
        run_ddpq("login", stdin=token, **config)
        if via == "stdin"
        else run_ddpq("login", token, **config)
    )
    assert r.returncode == 2, r
    assert "Traceback" not in r.stderr and "Usage:" not in r.stderr
    assert "token" in r.stderr.splitlines()[-1]
    assert not saved_token(config).exists()


def test_login_on_a_terminal_asks_at_a_hidden_prompt(
    config: dict[str, str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for key, value in config.items():
        monkeypatch.setenv(key, value)

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

        def read(self, *_: Any) -> str:
            raise AssertionError("read the terminal in the clear")

    prompts: list[str] = []

    def getpass(prompt: str) -> str:
        prompts.append(prompt)
        return "ddpq_tty"

    monkeypatch.setattr(sys, "stdin", Terminal())
    monkeypatch.setattr("getpass.getpass", getpass)
    account.login(None)
    assert prompts and saved(config)["token"] == "ddpq_tty"
    assert "warning" not in capsys.readouterr().err


@pytest.mark.parametrize("token", ["t\u00f6k", "two words", "tok\x1b]0;x\x07"])
def test_a_malformed_token_from_the_environment_is_a_usage_error(token: str) -> None:
    assert_usage_error(run_ddpq("ls", DDPQ_TOKEN=token), "token")


# ---- every command's printing, against an API that answers hostile text -------------------


@pytest.fixture
def hostile_api(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], None]]:
    """Point the CLI at a stand-in API (real HTTP, in this process) whose every answer
    carries the given text."""
    said: list[str] = []

    def answer(request: Request) -> Answer:
        text = said[-1]
        path, method = request.path, request.method
        job = job_data(text)
        if path == "/v1/jobs" and method == "GET":
            return json_answer(200, {"items": [job], "total": 1, "offset": 0, "limit": 1000})
        if path == "/v1/queue":
            hidden = [{"owner": text, "counts": {"held": 3, text: 1}}]
            view = {"jobs": [job], "sweeps": [], "total": 5, "only_owner": text, "limit": 100}
            return json_answer(200, {**view, "hidden": hidden})
        if path == "/v1/jobs/1":
            return json_answer(200, job)
        if path == "/v1/jobs/1/log":
            body = f"log {text}\n".encode("utf-8", "surrogatepass")
            return Answer(200, body, {"X-Ddpq-Log-Size": "9"})
        if path == "/v1/jobs/1/env":
            env = {"base": "exported", "env": {text: text, "OK": text}}
            return json_answer(200, {"id": 1, **env})
        if path == "/v1/jobs/1/cancel":
            return json_answer(200, {"id": 1, "state": "running", "reason": text})
        if path in ("/v1/jobs/1/hold", "/v1/jobs/1/release"):
            return json_answer(200, job)
        if path == "/v1/devices":
            return json_answer(200, devices_data(text))
        if path == "/v1/whoami":
            return json_answer(200, {"name": text, "admin": False})
        # Errors quote things too: a detail, or whatever else answers on that port.
        if path == "/v1/jobs/2/cancel":
            return json_answer(409, {"detail": f"job 2 is {text}"})
        if path == "/v1/jobs" and method == "POST":
            return json_answer(422, {"detail": f"name: {text}; env.{text}: bad", "code": "x"})
        page = f"<html>\n{text}\n</html>".encode("utf-8", "surrogatepass")
        return Answer(404, page)

    with StubApi(answer) as stub:
        monkeypatch.setenv("DDPQ_URL", stub.url)
        monkeypatch.delenv("DDPQ_TOKEN", raising=False)
        yield said.append


def run_main(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str
) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "argv", ["ddpq", *args])
    with pytest.raises(SystemExit) as exc:
        entry.main()
        raise SystemExit(0)
    captured = capsys.readouterr()
    return int(exc.value.code or 0), captured.out, captured.err


# (arguments, exit code): job 2 answers a 409 with a detail, job 3 a 404 page.
COMMANDS = [
    (("ls",), 0),
    (("show", "1"), 0),
    (("gpus",), 0),
    (("cancel", "1"), 0),
    (("hold", "1"), 0),
    (("release", "1"), 0),
    (("whoami",), 0),
    (("show", "1", "--env"), 0),
    (("cancel", "2"), 1),
    (("show", "3"), 4),
    (("submit", "--", "true"), 2),
]


@pytest.mark.parametrize(("args", "exit_code"), COMMANDS, ids=[" ".join(a) for a, _ in COMMANDS])
@pytest.mark.parametrize(
    "text",
    [
        "\x1b]0;pwned\x07[/bold]",
        "\x1b[2J\r\u202e[red]x[/red]\x9b2J",
        "\x08\x00\u2028[link=https://evil.example]x",
        "lone\ud800",
    ],
)
def test_every_command_prints_hostile_text_inert(
    args: tuple[str, ...],
    exit_code: int,
    text: str,
    hostile_api: Callable[[str], None],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    hostile_api(text)
    code, out, err = run_main(monkeypatch, capsys, *args)
    assert code == exit_code
    assert_inert(out)
    assert_inert(err)
    if code:
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


@pytest.mark.parametrize("args", [("ls", "--json"), ("show", "1", "--json"), ("gpus", "--json")])
def test_json_output_keeps_the_exact_text(
    args: tuple[str, ...],
    hostile_api: Callable[[str], None],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    text = "\x1b]0;pwned\x07[/bold]\u202e"
    hostile_api(text)
    code, out, _ = run_main(monkeypatch, capsys, *args)
    assert code == 0 and "\x1b" not in out  # JSON escapes control characters itself
    data = json.loads(out)
    first = data[0] if isinstance(data, list) else data.get("items", [data])[0]
    assert first["name"] == text


# ---- end to end: what a job may legitimately carry ----------------------------------------

JOB = """
import json, os, sys, time
evil = sys.argv[1]
with open(os.path.join(os.environ["DDPQ_JOB_DIR"], "metrics.jsonl"), "a") as f:
    f.write(json.dumps({"epoch": evil, "epochs": 5}) + "\\n")
print("out " + evil, flush=True)
time.sleep(600)
"""


def test_a_jobs_escapes_and_markup_come_out_inert_from_ls_and_show(shared_daemon: Daemon) -> None:
    evil = "\x1b]0;pwned\x07\x1b[2J[/bold][red]x[/red]"
    job_id = int(shared_daemon.cli("submit", "--", sys.executable, "-c", JOB, evil).stdout)
    c = shared_daemon.client()
    wait_for(lambda: c.show(job_id).progress, what="the job's progress")
    wait_for(lambda: b"out" in c.log_tail(job_id), what="the job's output")
    for args in (("ls",), ("show", str(job_id))):
        out = shared_daemon.cli(*args, COLUMNS="500").stdout
        assert_inert(out)
        assert "\\x1b]0;pwned\\x07\\x1b[2J[/bold][red]x[/red]" in out, out
    # `ddpq logs` is the job's own bytes, on purpose (they may be piped to a file).
    assert f"out {evil}" in shared_daemon.cli("logs", str(job_id)).stdout
    assert_inert(shared_daemon.cli("cancel", str(job_id)).stdout)
