"""The GPUs: `ddpq gpus` (who holds each, memory, outside processes) and `ddpq watch` (a
live view of the queue and the GPU map). Rich is imported when they draw."""

from __future__ import annotations

import time
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
    import sys

    from rich.live import Live

    from ddpq.client.draw import console
    from ddpq.client.format import plain
    from ddpq.client.reconnect import Staying
    from ddpq.client.watchview import render

    # "Ctrl-C to leave" even when started with SIGINT ignored (a parent that ignores it, as
    # a test runner's worker may): Python keeps an inherited SIG_IGN.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    con = console()
    states = None if all_ else ACTIVE_STATES
    with client() as c:

        def view(staying: Staying) -> Any:
            jobs = staying.call(c.list_all, states=states)
            return render(jobs, staying.call(c.devices))

        try:
            if not con.is_terminal:
                # Into a pipe or a file a live view shows nothing until it ends (Rich keeps
                # its last frame only): each view is printed whole instead, as `top -b` does,
                # and what the client says goes to stderr, as `logs -f` says it.
                staying = Staying(lambda line: print(f"ddpq: {line}", file=sys.stderr))
                while True:
                    con.print(view(staying))
                    con.print()
                    time.sleep(interval)
            with Live(console=con, auto_refresh=False, screen=False) as live:
                # A restart of the daemon is waited for (the view stays; one line above it
                # says so).
                staying = Staying(lambda line: live.console.print(plain(f"ddpq: {line}")))
                while True:
                    live.update(view(staying), refresh=True)
                    time.sleep(interval)
        except KeyboardInterrupt:
            return


def register(app: typer.Typer) -> None:
    """Add `gpus` and `watch` to the client's app."""
    app.command("gpus", cls=QuickCommand)(gpus)
    app.command("watch", cls=QuickCommand)(watch)
