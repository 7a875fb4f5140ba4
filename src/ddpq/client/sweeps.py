"""Sweeps in the command line: what `submit --sweep/--array` sends, references such as ``s3``,
and how a sweep is drawn (one line in `ls`, a table of its members in `show`).

Sweep ids and job ids are separate sequences, so a sweep is written ``s3`` wherever a job id
may go (`show`, `cancel`, `hold`, `release`, `--after`). The daemon judges the sweep itself
(sizes, placeholders, the array form: 422 with the field named); only the CLI's own syntax
is checked here.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ddpq.client.format import Data, notify_lines, sanitize, text

# Not typing.TYPE_CHECKING: `ddpq submit` and `ddpq ls` import no ``typing`` (``client.quick``).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

SWEEP_PREFIX = "s"


class BadRef(ValueError):
    """Not a job id (``12``) nor a sweep (``s3``)."""


# A plain class: a dataclass imports ``inspect`` (~5 ms), a NamedTuple compiles each
# (string) annotation; `ddpq submit` and `ddpq ls` are typed in shell loops.
class Ref:
    """A job (``12``) or a sweep (``s3``) as the command line names it."""

    __slots__ = ("id", "sweep")

    def __init__(self, id: int, sweep: bool) -> None:
        self.id = id
        self.sweep = sweep

    def __str__(self) -> str:
        return f"{SWEEP_PREFIX}{self.id}" if self.sweep else str(self.id)


def parse_ref(value: str) -> Ref:
    """``12`` is job 12, ``s3`` (or ``S3``) sweep 3."""
    raw = value.strip()
    sweep = raw[:1].lower() == SWEEP_PREFIX
    digits = raw[1:] if sweep else raw
    # isdecimal() also takes other scripts' digits, which int() reads: ASCII only here.
    if not digits or not digits.isascii() or not digits.isdigit() or len(digits) > 18:
        raise BadRef(f"{value!r} is not a job id (12) or a sweep (s3)")
    number = int(digits)
    if number < 1:
        raise BadRef(f"{value!r}: ids start at 1")
    return Ref(number, sweep)


def parse_refs(values: Iterable[str]) -> list[Ref]:
    return [parse_ref(v) for v in values]


def sweep_params(specs: Sequence[str]) -> dict[str, list[str]]:
    """``--sweep lr=0.05,0.1 --sweep batch-size=64,128`` as the API's ``params``, in the order
    given (the first varies slowest)."""
    params: dict[str, list[str]] = {}
    for spec in specs:
        name, sep, values = spec.partition("=")
        name = name.strip()
        if not sep or not name:
            raise BadRef(f"--sweep {spec!r}: expected NAME=VALUE,VALUE,...")
        if name in params:
            raise BadRef(f"--sweep {name}: given twice; list all its values once")
        params[name] = values.split(",")
        if not all(v.strip() for v in params[name]):
            raise BadRef(f"--sweep {spec!r}: an empty value; expected NAME=VALUE,VALUE,...")
    return params


def sweep_body(
    template: dict[str, Any],
    specs: Sequence[str],
    array: str | None,
    max_running: int | None,
) -> dict[str, Any]:
    body: dict[str, Any] = {"template": template}
    if specs:
        body["params"] = sweep_params(specs)
    if array is not None:
        body["array"] = array
    if max_running is not None:
        body["max_running"] = max_running
    return body


def fold(jobs: Sequence[Data]) -> tuple[list[Data], list[int]]:
    """The jobs that belong to no sweep, and the sweeps the others belong to (in the order
    their first member appears)."""
    plain: list[Data] = []
    sweeps: dict[int, None] = {}
    for job in jobs:
        sweep_id = job.get("sweep_id")
        if sweep_id is None:
            plain.append(job)
        else:
            sweeps.setdefault(int(sweep_id), None)
    return plain, list(sweeps)


# Counts in this order: what is happening first, then how it ended.
COUNT_ORDER = (
    "running",
    "starting",
    "queued",
    "held",
    "succeeded",
    "failed",
    "timed_out",
    "cancelled",
)


def counts_text(counts: dict[str, int]) -> str:
    known = [f"{counts[s]} {s}" for s in COUNT_ORDER if counts.get(s)]
    other = [f"{n} {text(s)}" for s, n in sorted(counts.items()) if s not in COUNT_ORDER and n]
    return ", ".join(known + other)


def sweeps_table(sweeps: Iterable[Data]) -> Any:
    from ddpq.client.draw import new_table
    from ddpq.client.format import age
    from ddpq.client.grid import Cell

    table = new_table("SWEEP", "NAME", "OWNER", "MEMBERS", "STATES", "AGE", wrap="STATES")
    for sw in sweeps:
        cap = f" ({sw['max_running']} at once)" if sw.get("max_running") else ""
        cells = (
            f"{SWEEP_PREFIX}{sw['id']}",
            text(sw["name"]),
            text(sw["owner"]),
            f"{sw['size']}{cap}",
            counts_text(sw["counts"]),
            age(sw["submitted_at"]),
        )
        # Cells, not Text: `ddpq ls` into a pipe draws them without Rich (``draw.show``).
        table.add_row(*(Cell(sanitize(cell)) for cell in cells))
    return table


def render_sweep(sw: Data) -> None:
    """One sweep for people: what it runs, its counts, and each member with its
    parameters, state and newest metrics (sorted as the daemon was asked)."""
    from rich.text import Text

    from ddpq.client.draw import console, new_table, styled_state
    from ddpq.client.format import number_text, plain

    con = console()
    con.print(
        Text.assemble(
            (f"sweep {SWEEP_PREFIX}{sw['id']}", "bold"),
            f" {sanitize(text(sw['name']))}  ",
            "done" if sw["done"] else "active",
        )
    )
    con.print(Text(f"  owner      {sanitize(text(sw['owner']))}"))
    con.print(Text(f"  command    {sanitize(' '.join(map(text, sw['command'])))}"))
    swept = sw["array"] if sw.get("array") else ", ".join(sw["params"])
    con.print(Text(f"  swept      {sanitize(text(swept))}  ({sw['size']} members)"))
    con.print(Text(f"  states     {counts_text(sw['counts'])}"))
    for line in notify_lines(sw, "one message, once every member has ended"):
        con.print(Text(line))
    metric = (sw.get("sort") or "").lstrip("-")
    names = list(sw["params"]) if sw["params"] else ["index"]
    columns = ["JOB", *(n.upper() for n in names), "STATE", "EXIT", "METRICS"]
    if metric:
        columns.insert(-1, metric.upper())
    table = new_table(*columns, wrap="METRICS")
    for m in sw["members"]:
        values = [str(m["index"])] if not sw["params"] else [m["params"].get(n, "") for n in names]
        row = [plain(str(m["id"])), *(plain(text(v)) for v in values), styled_state(m["state"])]
        row.append(plain("" if m["exit_code"] is None else str(m["exit_code"])))
        metrics = m.get("metrics") or {}
        if metric:
            row.append(plain(number_text(metrics.get(metric, ""))))
        row.append(plain(_metrics_text(metrics)))
        table.add_row(*row)
    con.print(table)


def _metrics_text(metrics: dict[str, Any]) -> str:
    from ddpq.client.format import number_text, progress_line

    shown = {k: v for k, v in metrics.items() if k in ("test_loss", "test_acc")}
    line = progress_line(metrics)
    extra = [f"{k} {number_text(v)}" for k, v in shown.items() if k != "test_acc"]
    return sanitize(" · ".join([p for p in [line, *extra] if p]))
