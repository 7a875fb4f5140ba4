"""The GPUs: `ddpq gpus` (who holds each, memory, outside processes) and `ddpq watch` (a
live view of the queue and the GPU map). Rich is imported when they draw."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable
from typing import Annotated, Any

import typer

from ddpq.client.coercion import QuickCommand
from ddpq.client.common import ACTIVE_STATES, client, print_json


def gpus(
    as_json: Annotated[bool, typer.Option("--json")] = False,
    topology: Annotated[
        bool, typer.Option("--topology", help="how the GPUs are linked, as nvidia-smi topo -m")
    ] = False,
) -> None:
    """Every GPU: who holds it (job, owner, since when), memory, outside processes; the
    host's CPU cores and memory, and the jobs holding them."""
    from ddpq.client.draw import console, gpu_table
    from ddpq.client.format import as_data, plain
    from ddpq.client.host import host_summary

    with client() as c:
        devs = c.devices()
    if as_json:
        print_json(devs)
        return
    if topology:
        from ddpq.client.format import as_data
        from ddpq.client.topology import topology_text

        typer.echo(topology_text(as_data(devs)["items"]))
        return
    from ddpq.client.format import as_data

    con = console()
    con.print(gpu_table(devs))
    for line in host_summary(as_data(devs)):
        con.print(plain(line))
    # What holds jobs to their cores, memory and processes here; a kind nothing enforces
    # is said so (the daemon never pretends).
    for limit in as_data(devs).get("limits") or []:
        style = "" if limit.get("enforced") else "yellow"
        con.print(plain(str(limit.get("said", "")), style))


def watch(
    # At least a tenth of a second: each refresh is two requests to the daemon.
    interval: Annotated[
        float, typer.Option(min=0.1, help="seconds between refreshes (0.1 or more)")
    ] = 1.0,
    all_: Annotated[bool, typer.Option("--all", "-a", help="include finished jobs")] = False,
) -> None:
    """A live view of the queue and the GPU map, with progress bars. Ctrl-C to leave."""
    import signal

    from ddpq.client.draw import console
    from ddpq.client.reconnect import Staying
    from ddpq.client.watchview import render

    # "Ctrl-C to leave" even when started with SIGINT ignored (a parent that ignores it, as
    # a test runner's worker may): Python keeps an inherited SIG_IGN.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    with client() as c, contextlib.ExitStack() as stack:
        say, show = _watch_outputs(console(), stack)
        staying = Staying(say)  # a restart of the daemon is waited for, one line saying so
        try:
            while True:
                jobs = staying.call(c.list_all, states=None if all_ else ACTIVE_STATES)
                show(render(jobs, staying.call(c.devices)))
                time.sleep(interval)
        except KeyboardInterrupt:
            return


def _watch_outputs(
    con: Any, stack: contextlib.ExitStack[Any]
) -> tuple[Callable[[str], None], Callable[[Any], None]]:
    """Where `watch` says a line and shows a view. On a terminal, a live view redrawn in
    place, each line said above it. Into a pipe or a file a live view would show nothing
    until it ended (Rich keeps its last frame only there): each view is printed whole, as
    `top -b` does, and the lines go to stderr, as `logs -f` says them."""
    from rich.live import Live

    from ddpq.client.format import plain

    if con.is_terminal:
        live = stack.enter_context(Live(console=con, auto_refresh=False, screen=False))

        def above(line: str) -> None:
            live.console.print(plain(f"ddpq: {line}"))

        def redraw(view: Any) -> None:
            live.update(view, refresh=True)

        return above, redraw

    def to_stderr(line: str) -> None:
        print(f"ddpq: {line}", file=sys.stderr)

    def whole(view: Any) -> None:
        con.print(view)
        con.print()

    return to_stderr, whole


def register(app: typer.Typer) -> None:
    """Add `gpus` and `watch` to the client's app."""
    app.command("gpus", cls=QuickCommand)(gpus)
    app.command("watch", cls=QuickCommand)(watch)
