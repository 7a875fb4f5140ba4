"""Columns of text for the queue and the GPU map: a Rich renderable, lighter than Rich's Table.

`ddpq ls` is run in shell loops, and Rich's ``Table`` measures and renders every cell as a
renderable of its own: ~0.4 ms a row on this kind of machine, 15 ms for a queue of 40 jobs,
more than the whole HTTP round trip. The queue needs only left-aligned columns two spaces
apart under a bold header, as ``Table(box=None, pad_edge=False)`` draws them; this lays them
out from the cells' widths (``rich.cells.cell_len``: wide characters count two) and draws
the lines as one ``Text``.

On a terminal the lines fit its width: first whole columns are dropped, those with nothing
in them, then those named in ``drop`` in that order (a header is never cut to ``PROGR…``),
while the columns that may wrap (``wrap``: PROGRESS, REASON) cannot take the rest by
wrapping to ``COMFORTABLE_WRAP``; then those columns wrap, down to ``NARROWEST_WRAP``; what
is still too wide is cut with an ellipsis. Into a pipe or a file (not a terminal) every
column is drawn and every row is one line, however long: ``grep`` and ``awk`` see one job a
line.

Cells are ``Text`` (``format.plain``) or ``Cell`` (the same, made without Rich): never
markup, control characters made visible. Into a pipe, ``plain_text`` draws the same lines
without importing Rich at all (``draw.show``): `ddpq ls` in a script does not pay for it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

# Not typing.TYPE_CHECKING: `ddpq submit` and `ddpq ls` import no ``typing`` (``client.quick``).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

GAP = 2  # spaces between columns
NARROWEST_WRAP = 10  # a wrapping column keeps at least this width
# Before a column is dropped, the wrapping ones wrap down to this width (a few lines each);
# narrower than this, losing PORT or AGE reads better than a reason over eight lines.
COMFORTABLE_WRAP = 30


class Cell:
    """A cell's text (made safe already: ``format.sanitize``) and its style, a ``Text``
    only when Rich draws it. (A plain class: a NamedTuple compiles its annotations.)"""

    __slots__ = ("plain", "style")

    def __init__(self, plain: str, style: str = "") -> None:
        self.plain = plain
        self.style = style


def cell_len(text: str) -> int:
    """The cells ``text`` takes on a terminal (wide characters two), as Rich counts them;
    Rich's table is imported only for text that is not ASCII."""
    if text.isascii():
        return len(text)
    from rich.cells import cell_len as rich_cell_len

    return rich_cell_len(text)


def as_text(cell: Any) -> Any:
    """A cell as Rich's ``Text``."""
    from rich.text import Text

    return cell if isinstance(cell, Text) else Text(cell.plain, style=cell.style)


class Grid:
    """Rows of ``Text`` cells under a header; ``wrap`` names the columns that may wrap,
    ``drop`` those a narrow terminal may go without, the first to go first."""

    def __init__(
        self,
        *columns: str,
        wrap: str | Iterable[str] = "",
        title: str | None = None,
        drop: Iterable[str] = (),
    ) -> None:
        self.columns = columns
        wrapping = {wrap} if isinstance(wrap, str) else set(wrap)
        self.wrap = {i for i, c in enumerate(columns) if c in wrapping}
        self.drop = [columns.index(c) for c in drop if c in columns]
        self.title = title
        self.rows: list[Sequence[Any]] = []

    def add_row(self, *cells: Any) -> None:
        assert len(cells) == len(self.columns), (cells, self.columns)
        self.rows.append(cells)

    def natural(self) -> list[int]:
        """Each column's width with nothing cut: its widest cell or its header."""
        widths = [cell_len(c) for c in self.columns]
        for row in self.rows:
            for i, cell in enumerate(row):
                widths[i] = max(widths[i], cell_len(cell.plain))
        return widths

    def layout(self, room: int) -> tuple[list[int], list[int]]:
        """The columns shown (their indices) and each one's width, to fit ``room`` cells."""
        widths = self.natural()
        shown = list(range(len(widths)))

        def over() -> int:
            return sum(widths[i] for i in shown) + GAP * (len(shown) - 1) - room

        def slack() -> int:  # what the wrapping columns shown could give up comfortably
            return sum(max(0, widths[i] - COMFORTABLE_WRAP) for i in shown if i in self.wrap)

        empty = [i for i in shown if not any(row[i].plain for row in self.rows)]
        for i in [*empty, *(i for i in self.drop if i not in empty)]:
            if over() <= slack():
                break
            shown.remove(i)
        # The widest wrapping column gives up a cell at a time, down to NARROWEST_WRAP.
        while over() > 0:
            wrapping = [i for i in shown if i in self.wrap and widths[i] > NARROWEST_WRAP]
            if not wrapping:
                break
            widths[max(wrapping, key=lambda i: widths[i])] -= 1
        return shown, [widths[i] for i in shown]

    def plain_text(self) -> str:
        """The lines Rich draws into a pipe or a file (every column, one line a row, no
        style), drawn without Rich."""
        widths = self.natural()
        lines = [self.title] if self.title else []
        for row in [self.columns, *([c.plain for c in r] for r in self.rows)]:
            cells = [
                f"{c}{' ' * (w - cell_len(c) + GAP)}" for c, w in zip(row, widths, strict=True)
            ]
            lines.append(("".join(cells[:-1]) + row[-1]).rstrip())
        return "".join(f"{line}\n" for line in lines)

    def __rich_console__(self, console: Any, options: Any) -> Iterator[Any]:
        from rich.text import Text

        terminal = console.is_terminal
        if terminal:
            shown, widths = self.layout(options.max_width)
        else:  # a pipe or a file: every column, one line a row, nothing cut
            shown, widths = list(range(len(self.columns))), self.natural()
        out = Text(no_wrap=True, overflow="ellipsis" if terminal else "ignore", end="")
        if self.title:
            out.append(self.title + "\n", style="italic")
        header = [Text(c, style="bold") for c in self.columns]
        for row in [header, *self.rows]:
            cells = [as_text(row[i]) for i in shown]
            wrap = {n for n, i in enumerate(shown) if i in self.wrap} if terminal else set()
            for line in _lines(cells, widths, wrap, console):
                out.append_text(line)
                out.append("\n")
        yield out


def _lines(row: Sequence[Any], widths: list[int], wrap: set[int], console: Any) -> Iterator[Any]:
    """One row as lines: more than one when a wrapping cell wraps."""
    from rich.text import Text

    cells: list[list[Any]] = []
    for i, cell in enumerate(row):
        if i in wrap and cell_len(cell.plain) > widths[i]:
            cells.append(list(cell.wrap(console, widths[i])))
        else:
            cells.append([cell])
    last = len(row) - 1
    for n in range(max(len(parts) for parts in cells)):
        line = Text()
        for i, parts in enumerate(cells):
            part = parts[n] if n < len(parts) else Text()
            line.append_text(part)
            if i < last:  # no spaces after the last column
                line.append(" " * (widths[i] - cell_len(part.plain) + GAP))
        line.rstrip()
        yield line
