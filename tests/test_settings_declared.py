"""Each setting is declared once (ddpq.config_decl) and reachable the three ways people set
it, with one meaning: the flag (through the real command line), the ``DDPQ_*`` variable and
the TOML key give the same value; a bad value from any of them is one line and exit 2; the
docs' table is the declarations'. Parametrised over every declaration, so a new setting is
checked as soon as it is declared.

The commands run in-process with the daemon's ``run`` replaced: nothing starts.
"""

from __future__ import annotations

import functools
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from pydantic.fields import FieldInfo

from ddpq import entry
from ddpq.config import Public, Settings, public_fields
from ddpq.config_values import CORES, DURATION, FOLDER_LIMIT, JOB_RAM, RANGE, SHARE, SIZE, Written
from ddpq.config_values import NAMES as NAMES_UNIT
from ddpq.daemon import options
from ddpq.daemon import settings as daemon_settings
from ddpq.entry import command_line

ROOT = Path(__file__).resolve().parents[1]
DECLARED = public_fields()
NAMES = {public.name: field for field, (public, _) in DECLARED.items()}

# A value other than the default, as people write it, for each kind of value...
BY_UNIT = {
    DURATION.unit: ("1h30m", 5400.0),
    SIZE.unit: ("3G", 3 << 30),
    SHARE.unit: ("20%", 0.2),
    RANGE.unit: ("29700-29799", (29700, 29799)),
    NAMES_UNIT.unit: ("qos,mem", ("qos", "mem")),
    FOLDER_LIMIT.unit: ("10G", 10 << 30),
    CORES.unit: ("7", 7),
    JOB_RAM.unit: ("50%", 0.5),
}
# ... and for each setting of free text, which no unit describes.
TEXT = {
    "host": ("127.0.0.2", "127.0.0.2"),
    "external_gpus": ("ignore", "ignore"),
    "outside_use": ("show", "show"),
    "socket": ("/run/ddpq-test.sock", "/run/ddpq-test.sock"),
    "admin_group": ("wheel", "wheel"),
    "notify_url": ("https://hooks.example.test/ddpq", "https://hooks.example.test/ddpq"),
    "policy": ("fifo", "fifo"),
    "executor": ("slurm", "slurm"),
    "slurm_partition": ("gpu", "gpu"),
    "slurm_account": ("lab", "lab"),
    "slurm_options": ("--qos=high --mem-per-gpu=32G", ("--qos=high", "--mem-per-gpu=32G")),
}
# A value each setting refuses (None: it takes any text), and what the refusal says.
BAD_TEXT = {
    "host": None,
    "external_gpus": ("sometimes", "'avoid' or 'ignore'"),
    "outside_use": ("always", "'count' or 'show'"),
    "socket": ("relative/ddpq.sock", "not an absolute path"),
    "admin_group": ("no such group!", "not a Unix group name"),
    "notify_url": ("ftp://example.test/x", "http:// or https://"),
    "policy": ("random", "fairshare"),
    "executor": ("kubernetes", "'local' or 'slurm'"),
    "slurm_partition": ("two words", "Slurm name"),
    "slurm_account": ("two words", "Slurm name"),
    "slurm_options": ("--qos='high", "cannot split"),
}
BAD_BY_UNIT = {
    DURATION.unit: ("soon", "not a duration"),
    SIZE.unit: ("64Q", "not a size"),
    SHARE.unit: ("lots", "not a fraction"),
    RANGE.unit: ("30000", "LOW-HIGH"),
    NAMES_UNIT.unit: ("tasks-per", "in full"),
    FOLDER_LIMIT.unit: ("10Q", "size"),
    CORES.unit: ("many", "not a whole number of cores"),
    JOB_RAM.unit: ("150%", "at most 100%"),
}


def written(info: FieldInfo) -> Written | None:
    return next((m for m in info.metadata if isinstance(m, Written)), None)


def example(public: Public, info: FieldInfo) -> tuple[str | bool, object]:
    """(the value as written, the value it means) for one setting: never the default."""
    kind = options.option_type(info)
    if kind is bool:  # a switch: the other way from its default
        return (False, False) if info.default is True else (True, True)
    if (unit := written(info)) is not None:
        return BY_UNIT[unit.unit]
    if kind is int:
        return "7", 7
    if kind is Path:
        return "/var/lib/ddpq-test", Path("/var/lib/ddpq-test")
    return TEXT[public.name]


def bad(public: Public, info: FieldInfo) -> tuple[str, str] | None:
    kind = options.option_type(info)
    if kind is bool:
        return "maybe", "valid boolean"
    if (unit := written(info)) is not None:
        return BAD_BY_UNIT[unit.unit]
    if kind is int:
        return "many", "valid integer"
    if kind is Path:
        return None  # any path names a state folder
    return BAD_TEXT[public.name]


@pytest.fixture(autouse=True)
def _no_outside_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in NAMES:
        monkeypatch.delenv(f"DDPQ_{name.upper()}", raising=False)
    monkeypatch.setattr(daemon_settings, "DEFAULT_CONFIG_FILE", tmp_path / "absent.toml")


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[Settings]:
    """The settings each command would have run with; the daemon itself never starts."""
    from ddpq.daemon import run as daemon_run

    runs: list[Settings] = []
    monkeypatch.setattr(daemon_run, "run", lambda s, **_: runs.append(s))
    return runs


class Ran(NamedTuple):
    code: int
    err: str


@functools.cache
def daemons_command_line() -> Any:
    """The command line ``entry.main`` builds for a daemon's command, built once, as a
    process builds it once: Typer takes ~50 ms of CPU to build it (half this file's CPU
    when each command built it again); it keeps nothing from one command to the next."""
    return command_line(["serve"])


@pytest.fixture
def ddpq(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Callable[..., Ran]:
    """`ddpq ARGS` in this process (as its entry point runs it), with ``env`` set; ARGS
    name one of the daemon's commands."""

    def run(*args: str, env: dict[str, str] | None = None) -> Ran:
        assert args[0] in daemons_command_line().commands, args
        with monkeypatch.context() as patch:
            patch.setattr(entry, "command_line", daemons_command_line)
            patch.setattr(sys, "argv", ["ddpq", *args])
            for name, value in (env or {}).items():
                patch.setenv(name, value)
            with pytest.raises(SystemExit) as exc:
                entry.main()
                raise SystemExit(0)
        captured = capsys.readouterr()
        return Ran(int(exc.value.code or 0), captured.out + captured.err)

    return run


def as_toml(text: str | bool) -> str:
    return json.dumps(text)  # a switch: true or false


@pytest.mark.parametrize("field", list(DECLARED))
def test_each_setting_means_the_same_by_flag_variable_and_key(
    field: str, tmp_path: Path, started: list[Settings], ddpq: Callable[..., Ran]
) -> None:
    public, info = DECLARED[field]
    text, meant = example(public, info)
    assert getattr(Settings(), field) != meant  # the example says something
    flag = options.flag_of(public)
    config = tmp_path / "ddpq.toml"
    config.write_text(f"{public.name} = {as_toml(text)}\n")
    empty = tmp_path / "empty.toml"
    empty.write_text("")
    switched = {True: [flag], False: [f"--no-{flag.removeprefix('--')}"]}
    by_flag = switched[text] if isinstance(text, bool) else [flag, str(text)]
    variable = {f"DDPQ_{public.name.upper()}": as_toml(text) if isinstance(text, bool) else text}
    for args, env in (
        (["serve", "--config", str(empty), *by_flag], None),
        (["serve", "--config", str(empty)], variable),
        (["serve", "--config", str(config)], None),
    ):
        r = ddpq(*args, env=env)
        assert r.code == 0, (args, env, r.err)
    assert [getattr(s, field) for s in started] == [meant] * 3


@pytest.mark.parametrize("command", ["serve", "server", "worker"])
def test_each_command_takes_the_flags_of_the_settings_it_reads(
    command: str, started: list[Settings]
) -> None:
    cli: Any = command_line([command])
    params = cli.commands[command].params
    flags = {o for p in params for o in p.opts if p.name != "config"}
    api, worker = command in ("serve", "server"), command in ("serve", "worker")
    expected = {
        options.flag_of(public)
        for public, _ in DECLARED.values()
        if options.reads(public, api=api, worker=worker)
    }
    assert flags == expected
    # What each half had before the flags were made from the declarations.
    worker_only = {"--keep-finished", "--jobs-budget", "--prune-rows", "--gpu-mem-headroom"}
    api_only = {"--host", "--port", "--socket", "--admin-group", "--remote-accounts"}
    assert flags >= {"--home", "--grace", "--auth", "--state-reserve", "--executor"}
    assert flags.isdisjoint(worker_only if command == "server" else ())
    assert flags.isdisjoint(api_only if command == "worker" else ())


BAD_CASES = [
    (field, source)
    for field, (public, info) in DECLARED.items()
    if bad(public, info) is not None
    for source in ("flag", "variable", "key")
    # A switch given as a flag is on; nothing there to refuse.
    if not (source == "flag" and options.option_type(info) is bool)
]


@pytest.mark.parametrize(("field", "source"), BAD_CASES)
def test_a_bad_value_from_any_source_is_one_line_and_exit_2(
    field: str, source: str, tmp_path: Path, started: list[Settings], ddpq: Callable[..., Ran]
) -> None:
    public, info = DECLARED[field]
    found = bad(public, info)
    assert found is not None
    text, says = found
    config = tmp_path / "ddpq.toml"
    config.write_text(f"{public.name} = {json.dumps(text)}\n" if source == "key" else "")
    flag = options.flag_of(public)
    args = ["serve", "--config", str(config), *([flag, text] if source == "flag" else [])]
    env = {f"DDPQ_{public.name.upper()}": text} if source == "variable" else None
    r = ddpq(*args, env=env)
    assert r.code == 2 and not started and "Traceback" not in r.err, r.err
    if source == "flag" and options.option_type(info) is int:
        # Typer refuses a number that is none before the settings see it: its usage error.
        assert f"Invalid value for '{flag}'" in r.err and says in r.err, r.err
        return
    where = {"flag": f"{flag}: ", "variable": f"DDPQ_{public.name.upper()}=", "key": str(config)}
    (line,) = r.err.strip().splitlines()
    assert line.startswith("ddpq: ") and where[source] in line and says in line, line


def test_every_setting_has_an_example_and_all_but_two_a_bad_value() -> None:
    """The lists above cover every declaration (a KeyError names a new setting of free
    text that needs its example here); only a state folder and a host take anything."""
    takes_anything = set()
    for public, info in DECLARED.values():
        assert example(public, info)[1] is not None
        if bad(public, info) is None:
            takes_anything.add(public.name)
    # fake_topology: any path is one; its file is checked when the worker starts.
    assert takes_anything == {"home", "host", "fake_topology"}


# ---- the docs ----------------------------------------------------------------------------

ADMIN = ROOT / "docs" / "admin.md"
BEGIN = "<!-- settings: made by `python -m ddpq.daemon.options`; edit ddpq/config_decl.py -->\n"
END = "<!-- end of settings -->"


def test_the_docs_table_is_the_declarations() -> None:
    text = ADMIN.read_text()
    assert BEGIN in text and END in text
    shown = text[text.index(BEGIN) + len(BEGIN) : text.index(END)]
    assert shown == options.markdown_table(), (
        "docs/admin.md's settings table differs from the declarations: replace it with the "
        "output of `python -m ddpq.daemon.options`"
    )


def test_every_settings_row_in_the_docs_names_a_setting_and_its_default() -> None:
    """Other tables (docs/interactive.md's) name settings as the declarations do, with their
    declared defaults, however written ("30m" for 30m00s)."""
    row = re.compile(
        r"^\| `--([a-z-]+)`(?:/`--no-[a-z-]+`)? / `DDPQ_([A-Z_]+)` / `([a-z_]+)` \| ([^|]*) \|",
        re.M,
    )
    found = 0
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for flag, variable, key, cell in row.findall(doc.read_text()):
            found += 1
            assert flag.replace("-", "_") == key == variable.lower() and key in NAMES, doc
            default = re.fullmatch(r"`([^`]*)`", cell)
            if default is None:
                continue  # a rule in words ("Slurm's default"), or none
            info = DECLARED[NAMES[key]][1]
            if options.option_type(info) is bool:
                assert default[1] == str(info.default).lower(), (doc, key)
            else:
                read = Settings.model_validate({NAMES[key]: default[1]})
                assert getattr(read, NAMES[key]) == info.default, (doc, key)
    assert found >= len(DECLARED) + 3  # the full table and interactive.md's
