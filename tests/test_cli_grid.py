"""The columns `ddpq ls`, `gpus` and `watch` draw (``client.grid``): aligned by terminal
cells, wrapped and cut to a terminal's width (a pipe gets every column, one line a row: see
tests/test_cli_fit.py), never more than a Text's worth of work."""

from __future__ import annotations

import io

from rich.console import Console
from rich.text import Text

from ddpq.client.format import plain
from ddpq.client.grid import Grid


def shown(
    grid: Grid, width: int = 200, terminal: bool = False, colour: bool | None = None
) -> list[str]:
    """``grid`` as a terminal ``width`` wide shows it (in colour unless told), or a pipe."""
    buf = io.StringIO()
    colour = terminal if colour is None else colour
    console = (
        Console(
            file=buf, width=width, force_terminal=True, color_system="standard" if colour else None
        )
        if terminal
        else Console(file=buf, width=width, soft_wrap=True)  # as draw.console() makes it
    )
    console.print(grid)
    return buf.getvalue().splitlines()


def grid(*rows: tuple[str, str, str], wrap: str = "NOTE") -> Grid:
    g = Grid("ID", "NAME", "NOTE", wrap=wrap)
    for row in rows:
        g.add_row(*(plain(cell) for cell in row))
    return g


def test_columns_are_aligned_two_spaces_apart_without_trailing_spaces() -> None:
    lines = shown(grid(("1", "a", "x"), ("22", "longer-name", "")))
    assert lines == ["ID  NAME         NOTE", "1   a            x", "22  longer-name"]


def test_wide_characters_count_as_two_cells() -> None:
    lines = shown(grid(("1", "日本語", "x"), ("2", "abc", "y")))
    assert lines[1] == "1   日本語  x" and lines[2] == "2   abc     y"


def test_the_wrapping_column_wraps_to_the_terminal_and_the_rest_is_cut() -> None:
    note = "epoch 1/40 · acc 50.0% · 1,234 img/s · ETA 1m40s"
    lines = shown(grid(("1", "job", note)), width=30, terminal=True, colour=False)
    assert lines[0] == "ID  NAME  NOTE"
    assert lines[1].startswith("1   job   epoch 1/40")
    assert all(len(line) <= 30 for line in lines)
    assert " ".join(line[10:].strip() for line in lines[1:]) == note  # all of it, wrapped
    tight = Grid("ID", "NAME", wrap="")
    tight.add_row(plain("1"), plain("x" * 50))
    cut = shown(tight, width=20, terminal=True, colour=False)[1]
    assert len(cut) == 20 and cut.endswith("…")


def test_columns_with_nothing_in_them_go_before_the_ones_named_to_drop() -> None:
    g = Grid("ID", "EMPTY", "PORT", "NOTE", wrap="", drop=("PORT",))
    g.add_row(plain("1"), plain(""), plain("29500"), plain("x" * 10))
    assert shown(g, width=24, terminal=True, colour=False)[0].split() == ["ID", "PORT", "NOTE"]
    assert shown(g, width=18, terminal=True, colour=False)[0].split() == ["ID", "NOTE"]
    assert shown(g, width=18)[0].split() == ["ID", "EMPTY", "PORT", "NOTE"]  # a pipe


def test_the_header_is_bold_and_cells_keep_their_style() -> None:
    g = Grid("ID", "STATE")
    g.add_row(Text("1"), Text("failed", style="bold red"))
    header, row = shown(g, terminal=True)
    assert header.startswith("\x1b[1mID\x1b[0m")
    assert "\x1b[1;31mfailed\x1b[0m" in row


def test_a_title_comes_first() -> None:
    g = Grid("GPU", title="GPUs")
    g.add_row(Text("0"))
    assert shown(g) == ["GPUs", "GPU", "0"]


def test_cells_are_never_read_as_markup() -> None:
    lines = shown(grid(("[red]1[/red]", "[/bold]", ":smile:")), terminal=True)
    assert "[red]1[/red]" in lines[1] and "[/bold]" in lines[1] and ":smile:" in lines[1]
