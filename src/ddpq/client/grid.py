"""Columns of text for the queue and the GPU map: a Rich renderable, lighter than Rich's Table.

`ddpq ls` is run in shell loops, and Rich's ``Table`` measures and renders every cell as a
renderable of its own: ~0.4 ms a row on this kind of machine, 15 ms for a queue of 40 jobs,
more than the whole HTTP round trip. The queue needs only left-aligned columns two spaces
apart under a bold header, as ``Table(box=None, pad_edge=False)`` draws them; this lays them
out from the cells' widths on the terminal (``rich.cells.cell_len``: wide characters count
two) and draws the lines as one ``Text``. When the lines are wider than the terminal, the
column that may wrap (PROGRESS) gets what is left and wraps, as in Rich's table; what is
still too wide is cut with an ellipsis.

Cells are ``Text`` (``format.plain``): never markup, control characters made visible.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from rich.cells import cell_len
from rich.text import Text

GAP = 2  # spaces between columns
NARROWEST_WRAP = 10  # the wrapping column keeps at least this width


class Grid:
    """Rows of ``Text`` cells under a header; ``wrap`` names the column that may wrap."""

    def __init__(self, *columns: str, wrap: str = "", title: str | None = None) -> None:
        self.columns = columns
        self.wrap = columns.index(wrap) if wrap in columns else None
        self.title = title
        self.rows: list[Sequence[Text]] = []

    def add_row(self, *cells: Text) -> None:
        assert len(cells) == len(self.columns), (cells, self.columns)
        self.rows.append(cells)

    def widths(self, room: int) -> list[int]:
        widths = [cell_len(c) for c in self.columns]
        for row in self.rows:
            for i, cell in enumerate(row):
                widths[i] = max(widths[i], cell_len(cell.plain))
        over = sum(widths) + GAP * (len(widths) - 1) - room
        if over > 0 and self.wrap is not None:
            widths[self.wrap] = max(NARROWEST_WRAP, widths[self.wrap] - over)
        return widths

    def __rich_console__(self, console: Any, options: Any) -> Iterator[Text]:
        widths = self.widths(options.max_width)
        out = Text(no_wrap=True, overflow="ellipsis", end="")
        if self.title:
            out.append(self.title + "\n", style="italic")
        header = [Text(c, style="bold") for c in self.columns]
        for row in [header, *self.rows]:
            for line in self._lines(row, widths, console):
                out.append_text(line)
                out.append("\n")
        yield out

    def _lines(self, row: Sequence[Text], widths: list[int], console: Any) -> Iterator[Text]:
        """One row as lines: more than one when its wrapping cell wraps."""
        cells: list[list[Text]] = []
        for i, cell in enumerate(row):
            if i == self.wrap and cell_len(cell.plain) > widths[i]:
                cells.append(list(cell.wrap(console, widths[i])))
            else:
                cells.append([cell])
        for n in range(max(len(parts) for parts in cells)):
            line = Text()
            last = len(row) - 1
            for i, parts in enumerate(cells):
                part = parts[n] if n < len(parts) else Text()
                line.append_text(part)
                if i < last:  # no spaces after the last column
                    line.append(" " * (widths[i] - cell_len(part.plain) + GAP))
            line.rstrip()
            yield line
