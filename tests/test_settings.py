"""The daemon's settings: flags > DDPQ_* variables > the config file > the defaults in Settings.

Every test here names its config file (``--config``, or a monkeypatched default): none reads
the machine's /etc/ddpq/ddpq.toml.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from ddpq.config import ConfigError, Settings
from ddpq.daemon import settings as daemon_settings
from ddpq.daemon.settings import PUBLIC_NAMES, load_settings, written_defaults
from ddpq.schemas import JobSubmit
from tests.cli_inprocess import run_in_process
from tests.helpers import Daemon, free_port, wait_state

PUBLIC_VARIABLES = [f"DDPQ_{name.upper()}" for name in PUBLIC_NAMES]
# DDPQ_* variables that are not settings: a daemon must start with any of them set.
OTHER_VARIABLES = {
    "DDPQ_URL": "http://127.0.0.1:1",
    "DDPQ_TOKEN": "ddpq_x",
    "DDPQ_LONG": "1",
    "DDPQ_CIFAR_DIR": "/nonexistent",
    "DDPQ_TRACKING": "session",
    "DDPQ_ALLOWED_HOSTS": "example.test",
    "DDPQ_JOB_DIR": "/nonexistent/jobs/1",
    "DDPQ_JOB_ID": "1",
    "DDPQ_ATTEMPT": "1",
    "DDPQ_NOT_A_SETTING_YET": "x",
}


@pytest.fixture(autouse=True)
def _no_outside_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No DDPQ_* setting from the shell that runs the tests, no default file of the machine."""
    for name in PUBLIC_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(daemon_settings, "DEFAULT_CONFIG_FILE", tmp_path / "absent.toml")


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


# ---- precedence -----------------------------------------------------------------------------


def test_each_source_overrides_the_ones_below(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = write(
        tmp_path / "ddpq.toml",
        'grace = "30s"\nlog_cap = "1M"\nport_range = "29700-29799"\nfake_gpus = 2\n',
    )
    monkeypatch.setenv("DDPQ_GRACE", "20s")
    monkeypatch.setenv("DDPQ_LOG_CAP", "2M")
    s = load_settings({"grace": "5s", "fake_gpus": None}, config)
    assert s.grace_s == 5  # the flag
    assert s.log_cap_bytes == 2 << 20  # the variable
    assert (s.port_range, s.fake_gpus) == ((29700, 29799), 2)  # the file; None is no flag
    assert (s.port, s.external_policy) == (8765, "avoid")  # the defaults


@pytest.mark.parametrize(
    ("flag", "variable", "file", "expected"),
    [
        (None, None, None, 10.0),
        (None, None, "grace = 0", 0.0),
        (None, "1m", "grace = 0", 60.0),
        ("1h30m", "1m", "grace = 0", 5400.0),
        (None, "", "grace = 90", 90.0),  # an empty variable is an unset one
    ],
)
def test_grace_from_each_source(
    flag: str | None,
    variable: str | None,
    file: str | None,
    expected: float,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if variable is not None:
        monkeypatch.setenv("DDPQ_GRACE", variable)
    config = write(tmp_path / "ddpq.toml", file) if file is not None else None
    assert load_settings({"grace": flag}, config).grace_s == expected


@pytest.mark.parametrize(
    ("line", "attribute", "value"),
    [
        ('log_cap = "64MiB"', "log_cap_bytes", 64 << 20),
        ("log_cap = 65536", "log_cap_bytes", 65536),
        ("port_range = [29700, 29701]", "port_range", (29700, 29701)),
        ('grace = "2.5s"', "grace_s", 2.5),
        ("grace = 2.5", "grace_s", 2.5),
        ('external_gpus = "ignore"', "external_policy", "ignore"),
        ('outside_use = "show"', "outside_use", "show"),
        ("stop_jobs = true", "stop_jobs_on_exit", True),
        ("ports_per_user = 5", "max_user_ports", 5),
    ],
)
def test_the_file_takes_values_as_people_write_them(
    line: str, attribute: str, value: object, tmp_path: Path
) -> None:
    config = write(tmp_path / "ddpq.toml", line + "\n")
    assert getattr(load_settings({}, config), attribute) == value


def test_the_default_file_is_read_when_it_exists(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert load_settings({}).fake_gpus is None  # the default path does not exist
    default = write(tmp_path / "etc-ddpq.toml", "fake_gpus = 3\n")
    monkeypatch.setattr(daemon_settings, "DEFAULT_CONFIG_FILE", default)
    assert load_settings({}).fake_gpus == 3
    other = write(tmp_path / "other.toml", "fake_gpus = 1\n")
    assert load_settings({}, other).fake_gpus == 1  # --config replaces it


def test_settings_built_directly_read_neither_the_file_nor_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    default = write(tmp_path / "etc-ddpq.toml", "fake_gpus = 3\ngrace = 'not even valid'\n")
    monkeypatch.setattr(daemon_settings, "DEFAULT_CONFIG_FILE", default)
    monkeypatch.setenv("DDPQ_AUTH", "1")
    s = Settings(home=tmp_path, fake_gpus=2)
    assert (s.fake_gpus, s.grace_s, s.auth) == (2, 10.0, False)
    with pytest.raises(ConfigError, match="not even valid"):
        load_settings({})  # the loader, by contrast, reads both


def test_other_ddpq_variables_are_not_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    without = load_settings({})
    for name, value in OTHER_VARIABLES.items():
        monkeypatch.setenv(name, value)
    assert load_settings({}) == without  # no error, and nothing read from them


def test_the_worker_is_not_refused_for_the_apis_address(tmp_path: Path) -> None:
    """One config file serves `ddpq server` and `ddpq worker`; only the server listens."""
    s = Settings(home=tmp_path, host="0.0.0.0", allow_root_without_auth=True)
    with pytest.raises(ConfigError, match="without --auth"):
        s.validate(ephemeral=(32768, 60999))
    s.validate(ephemeral=(32768, 60999), listens=False)


# ---- bad values: one line, exit 2, wherever they come from ------------------------------------


def ddpq(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """In this process (tests/cli_inprocess.py): these tests are of what the command line
    says; a refused ``ddpq serve`` process costs ~1.5 s of CPU, and there are ~50."""
    unset: dict[str, str | None] = {k: None for k in PUBLIC_VARIABLES}
    return run_in_process(*args, env={**unset, **env})


def assert_one_line(r: subprocess.CompletedProcess[str], *words: str) -> None:
    assert r.returncode == 2, r
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    for word in words:
        assert word in r.stderr, r.stderr


# (public name, a bad value as a string, what the message says)
BAD_VALUES = [
    ("grace", "soon", "not a duration"),
    ("grace", "-1s", "0 or more"),
    ("log_cap", "64Q", "not a size"),
    ("log_cap", "1K", "at least 4096 bytes"),
    ("port_range", "30000", "LOW-HIGH"),
    ("port_range", "80-90", "within 1024-65535"),
    ("fake_gpus", "-1", "between 0 and 1024"),
    ("port", "70000", "between 0 and 65535"),
    ("external_gpus", "sometimes", "'avoid' or 'ignore'"),
    ("outside_use", "always", "'count' or 'show'"),
    ("ports_per_user", "-2", "at least 0"),
]
# Only a variable or the file can hold these: Typer refuses them as flags itself.
BAD_TYPES = [("fake_gpus", "many", "valid integer"), ("auth", "maybe", "valid boolean")]


def serve(tmp_path: Path, *args: str) -> list[str]:
    # --host 0.0.0.0 without --auth: a value wrongly accepted still ends the daemon at once
    # (refused by validate()), with a message that fails the test instead of hanging it.
    home = str(tmp_path / "home")
    return ["serve", "--home", home, "--port", str(free_port()), "--host", "0.0.0.0", *args]


@pytest.mark.parametrize(("name", "value", "says"), BAD_VALUES)
def test_a_bad_flag_is_one_line_naming_the_flag(
    name: str, value: str, says: str, tmp_path: Path
) -> None:
    empty = write(tmp_path / "empty.toml", "")
    flag = "--" + name.replace("_", "-")
    r = ddpq(*serve(tmp_path, "--config", str(empty), f"{flag}={value}"))
    assert_one_line(r, f"{flag}: ", says)


@pytest.mark.parametrize(("name", "value", "says"), BAD_VALUES + BAD_TYPES)
def test_a_bad_variable_is_one_line_naming_the_variable(
    name: str, value: str, says: str, tmp_path: Path
) -> None:
    empty = write(tmp_path / "empty.toml", "")
    variable = f"DDPQ_{name.upper()}"
    r = ddpq(*serve(tmp_path, "--config", str(empty)), **{variable: value})
    assert_one_line(r, f"{variable}={value!r}: ", says)


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [(n, f'"{v}"', s) for n, v, s in BAD_VALUES + BAD_TYPES]
    + [
        ("fake_gpus", "2.5", "valid integer"),
        ("grace", "true", "not true"),
        ("grace", "inf", "finite number"),
        ("log_cap", "-1", "at least 4096"),
        ("port_range", "[29700, 29701, 29702]", "at most 2 items"),
        ("auth", '"on second thought"', "valid boolean"),
    ],
)
def test_a_bad_value_in_the_file_is_one_line_naming_the_file_and_key(
    name: str, value: str, says: str, tmp_path: Path
) -> None:
    config = write(tmp_path / "ddpq.toml", f"{name} = {value}\n")
    r = ddpq(*serve(tmp_path, "--config", str(config)))
    assert_one_line(r, f"{config}: {name} = ", says)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('grce = "10s"\n', "unknown setting 'grce' (did you mean 'grace'?)"),
        ('log-cap = "64M"\n', "unknown setting 'log-cap' (did you mean 'log_cap'?)"),
        ("grace_s = 10\n", "unknown setting 'grace_s' (did you mean 'grace'?)"),
        ("python = '/bin/sh'\n", "unknown setting 'python' (known: home, host, port,"),
        ("[server]\nport = 1\n", "unknown setting 'server'"),
        ("grace = \n", "not valid TOML"),
        ("grace = '\udcff'\n", "not valid TOML"),  # written as the byte 0xff: not UTF-8
    ],
)
def test_a_config_file_that_says_what_ddpq_cannot_read_is_refused(
    text: str, says: str, tmp_path: Path
) -> None:
    config = tmp_path / "ddpq.toml"
    config.write_bytes(text.encode("utf-8", "surrogateescape"))
    assert_one_line(ddpq(*serve(tmp_path, "--config", str(config))), str(config), says)


@pytest.mark.parametrize("command", ["serve", "server", "worker"])
def test_a_missing_config_file_is_refused(command: str, tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    r = ddpq(command, "--home", str(tmp_path / "h"), "--config", str(missing))
    assert_one_line(r, f"--config {missing}: does not exist")
    assert_one_line(ddpq(command, "--config", str(tmp_path)), "is not a file")


def test_a_bad_value_is_refused_even_where_a_flag_overrides_it(tmp_path: Path) -> None:
    """A typo in the file or the environment would bite the day the flag is dropped."""
    config = write(tmp_path / "ddpq.toml", 'grace = "soon"\n')
    r = ddpq(*serve(tmp_path, "--config", str(config), "--grace", "1s"))
    assert_one_line(r, "grace = 'soon'")


# ---- through the command line, end to end ---------------------------------------------------


def test_a_daemon_takes_flags_then_variables_then_the_file(
    make_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    config = write(
        tmp_path / "ddpq.toml",
        f'fake_gpus = 3\nport = {free_port()}\nport_range = "29710-29711"\ngrace = "1s"\n',
    )
    # make_daemon passes --port: above DDPQ_PORT and the file's port.
    d = make_daemon(
        "--config",
        str(config),
        DDPQ_FAKE_GPUS="2",
        DDPQ_PORT=str(free_port()),
        **OTHER_VARIABLES,
    )
    c = d.client()
    assert len(c.devices().items) == 2  # the variable, above the file
    job = c.submit(JobSubmit(command=["sleep", "30"], gpus=1))
    port = wait_state(c, job.id, "running").leases.port
    assert port in (29710, 29711)  # the file, where nothing else says
    c.cancel(job.id)


def test_admin_finds_the_state_folder_the_daemon_would(tmp_path: Path) -> None:
    home = tmp_path / "state"
    config = write(tmp_path / "ddpq.toml", f'home = "{home}"\n')
    assert ddpq("admin", "user", "add", "alice", "--config", str(config)).returncode == 0
    assert (home / "ddpq.db").exists()
    listed = ddpq("admin", "user", "list", "--config", str(config)).stdout
    assert listed.split()[0] == "alice"
    other = ["--home", str(tmp_path / "other"), "--config", str(config)]  # --home first
    assert ddpq("admin", "user", "list", *other).stdout == ""


def test_help_shows_the_defaults_that_settings_holds() -> None:
    options = re.split(r"\n  (?=--)", ddpq("serve", "--help", COLUMNS="80").stdout)
    shown = {}
    for text in options:
        flag = re.match(r"--([a-z-]+)", text)
        # Lines joined again; Click breaks long words after a hyphen ("no-stop-\n jobs").
        joined = " ".join(text.split()).replace("- ", "-")
        default = re.search(r"\[default: ([^]]+)\]", joined)
        if flag and default:
            shown[flag.group(1)] = default.group(1)
    defaults = written_defaults()
    for name in ("host", "port", "port_range", "external_gpus", "grace", "log_cap"):
        assert shown[name.replace("_", "-")] == str(defaults[name]), name
    assert (shown["auth"], shown["stop-jobs"]) == ("no-auth", "no-stop-jobs")
    assert "home" not in shown and "allow-root" not in shown  # as Typer showed them before
    assert defaults["grace"] == "10s" and defaults["log_cap"] == "64M"


def test_the_readmes_example_is_a_config_file_ddpq_reads(tmp_path: Path) -> None:
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    (example,) = re.findall(r"```toml\n(.*?)```", readme, re.S)
    s = load_settings({}, write(tmp_path / "ddpq.toml", example))
    assert (s.home, s.grace_s, s.log_cap_bytes) == (Path("/var/lib/ddpq"), 30.0, 256 << 20)
