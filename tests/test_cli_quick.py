"""`ddpq submit` and `ddpq ls` read without Typer (``client.quick``, issue 26 item 15): the
reader's tables say what the commands' Typer declarations say, and every command line it
accepts it reads as Typer does (the same parameters, the same words left for the job);
what it does not know it leaves to Typer. bench/cli_latency.py times the commands;
tests/test_cli_speed.py checks what they import."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.core import TyperGroup

from ddpq import entry
from ddpq.client import quick

# A new option of `submit` or `ls` must be written into client.quick's table as well.
HINT = "client.quick's table differs from the command's declarations: add or fix the option"


def typer_cli() -> TyperGroup:
    return entry.command_line(["ls"])


def spec_of(params: list[Any], defaults: dict[str, Any]) -> quick.Spec:
    """The reader's table for these Typer parameters, as ``client.quick`` writes it."""
    rows = []
    for p in params:
        annotation = getattr(p.type_descriptor, "annotation", None)
        if p.is_flag:
            kind = quick.SWITCH if p.secondary_opts else quick.FLAG
        elif p.multiple:
            kind = quick.LIST
        else:
            kinds: dict[Any, str] = {int: quick.INT, str: quick.TEXT, Path: quick.PATH}
            kind = kinds[annotation]
        rows.append((p.name, kind, defaults[p.name], tuple(p.opts)))
    return tuple(rows)


@pytest.mark.parametrize(("name", "spec"), [("ls", quick.LS), ("submit", quick.SUBMIT)])
def test_the_tables_are_the_commands_declarations(name: str, spec: quick.Spec) -> None:
    command = typer_cli().commands[name]
    defaults = command.make_context(name, ["x"] if name == "submit" else []).params
    assert spec_of(command.params, defaults) == spec, HINT


def test_the_global_options_are_the_apps() -> None:
    cli = typer_cli()
    defaults = {"url": None, "token": None, "debug": False}
    # --install-completion and --show-completion are Typer's own: left to it.
    params = [p for p in cli.params if not p.name.endswith("_completion")]
    assert spec_of(params, defaults) == quick.GLOBAL, HINT


LS_LINES = [
    [],
    ["--all"],
    ["-a", "--json"],
    ["--state", "queued", "-s", "held", "--user=ann"],
    ["--mine", "--no-mine", "--expand", "--limit", "5"],
    ["--limit=0", "-u", "bob"],
]
SUBMIT_LINES = [
    ["--", "true"],
    ["--gpus", "2", "--", "python", "train.py", "--lr", "3"],
    ["-g", "1", "-n", "run", "python", "train.py"],
    ["python", "train.py", "--gpus", "2"],  # an option after the command's first words
    ["--hold", "--no-hold", "--torchrun", "--", "train.py"],
    ["--env", "A=1", "-e", "B=2", "--export", "NONE", "--", "env"],
    ["--after", "3", "--after=s2", "--time-limit", "30m", "--", "true"],
    ["--sweep", "lr=1,2", "--sweep", "bs=8", "--max-running", "1", "--", "echo", "{lr}"],
    ["--array", "0-3", "--priority", "-5", "--", "true"],  # a value that looks like an option
    ["--name", "--", "true"],
    ["--cwd", "/tmp", "--notify", "http://x", "--preemptible", "--preempt-signal", "USR1", "t"],
    ["--gpu-mem", "10G", "--gpu-share", "2", "--gpu-link", "nvlink", "--gpu-type", "A100", "t"],
    ["--cpus", "4", "--mem", "4G", "--json", "--retries", "2", "--", "true"],
    ["--nodes", "2", "--gpus-per-node", "4", "--partition", "p", "--slurm-opt", "--qos=x", "t"],
    ["--gpus", "2-4", "--preemptible", "--", "true"],  # an elastic job's range
    ["--", "--gpus", "2"],  # after `--`, the job's words
    ["resnet18", "--gpus", "2", "--epochs", "5"],  # a workload's own option
    ["--gpus", "2.5", "--", "true"],  # not a count nor a range: `gpu_range` says so
    ["--gpus", "-g2", "--", "true"],
    ["--help"],
    ["--name"],
    ["--hold=yes", "--", "true"],
    ["--gpus", " 3 ", "--", "true"],
]
# What the reader must take itself (the rest it may leave to Typer).
TAKEN = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}


@pytest.mark.parametrize("words", LS_LINES, ids=" ".join)
def test_ls_is_read_as_typer_reads_it(words: list[str]) -> None:
    command = typer_cli().commands["ls"]
    ctx = command.make_context("ls", list(words))
    assert quick.read(quick.LS, words, arguments=False) == (ctx.params, ctx.args)


@pytest.mark.parametrize("n", range(len(SUBMIT_LINES)))
def test_submit_is_read_as_typer_reads_it_or_left_to_it(n: int) -> None:
    words = SUBMIT_LINES[n]
    try:
        ours = quick.read(quick.SUBMIT, words, arguments=True)
    except quick.Declined:
        assert n not in TAKEN, words
        return
    ctx = typer_cli().commands["submit"].make_context("submit", list(words))
    assert ours == (ctx.params, ctx.args), words


@pytest.mark.parametrize(
    "argv",
    [
        ["ls", "--help"],
        ["ls", "extra"],
        ["ls", "--limit", "-1"],
        ["--url"],
        ["--url", "http://x", "--debug", "show", "1"],
        ["submit", "--"],  # nothing to run: Typer's command says so
        ["submit", "--", "-x"],
        ["submit", "--priority", "x", "--", "true"],
        ["--no-such", "ls"],
        [],
    ],
)
def test_what_the_reader_does_not_know_goes_to_typer(argv: list[str]) -> None:
    assert quick.command(argv) is None


def test_a_batch_script_goes_to_typer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # It may be a batch script, whose directives Typer's parser reads (client.batch).
    (tmp_path / "job.sh").write_text("#!/bin/sh\n#SBATCH --gpus 2\ntrue\n")
    (tmp_path / "plain.sh").write_text("#!/bin/sh\ntrue\n")  # no directives: run as it is
    monkeypatch.chdir(tmp_path)
    assert quick.command(["submit", "job.sh"]) is None
    assert quick.command(["submit", "plain.sh"]) is not None
    assert quick.command(["submit", "--", "true"]) is not None


def test_the_global_options_are_set_only_when_the_reader_runs_the_command() -> None:
    from ddpq.client.runtime import OPTIONS

    before = dict(OPTIONS)
    try:
        assert quick.command(["--url", "http://a", "ls", "--help"]) is None
        assert before == OPTIONS
        assert quick.command(["--url=http://b", "--debug", "ls"]) is not None
        assert {**before, "url": "http://b", "debug": True} == OPTIONS
    finally:
        OPTIONS.clear()
        OPTIONS.update(before)


def test_the_queue_into_a_pipe_is_what_rich_draws_there() -> None:
    """``Grid.plain_text`` (no Rich: `ddpq ls` into a pipe) is byte for byte what Rich's
    console draws for a file: every column, one line a row, wide characters counted two."""
    import io

    from rich.console import Console

    from ddpq.client.format import plain
    from ddpq.client.grid import Cell, Grid

    grid = Grid("ID", "NAME", "EMPTY", "REASON", wrap=("REASON",), title="queue", drop=("NAME",))
    grid.add_row(Cell("1"), Cell("名前x"), Cell(""), Cell("a long reason " * 8, "red"))
    grid.add_row(plain("22"), plain("b"), plain(""), plain(""))
    grid.add_row(Cell("333"), Cell("c\\x1b"), Cell(""), Cell("held by user"))
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=40)
    console.soft_wrap = True  # as draw.console() makes it off a terminal
    console.print(grid)
    assert grid.plain_text() == out.getvalue()
    assert grid.plain_text().count("\n") == 5  # the title, the header, three rows
