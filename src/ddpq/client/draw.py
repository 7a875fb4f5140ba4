"""How the client draws jobs and GPUs for people (Rich), apart from the commands.

Everything a user or a job chose (names, commands, reasons, progress) is printed as plain
text, never read as markup, with control characters made visible (``format.sanitize``).
Rich itself is imported only when something is drawn.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ddpq.core.states import JobState

if TYPE_CHECKING:
    from ddpq.schemas import DeviceList, JobDetail, JobOut


def console() -> Any:
    from rich.console import Console

    # Rich turns colours off by itself when stdout is not a terminal (and honours NO_COLOR).
    return Console()


def jobs_table(jobs: list[JobOut]) -> Any:
    """The queue as a Rich table. Names, owners and progress are the users' and jobs' own
    text: ``plain`` cells, never markup, with control characters made visible."""
    from rich.table import Table

    from ddpq.client.format import age, plain, progress_line

    table = Table(box=None, header_style="bold", pad_edge=False)
    for col in ("ID", "NAME", "OWNER", "STATE", "GPUS", "PORT", "PROGRESS", "AGE"):
        table.add_column(col, no_wrap=col != "PROGRESS")
    for j in jobs:
        gpus = ",".join(map(str, j.leases.gpus)) if j.leases.gpus else str(j.gpus)
        table.add_row(
            str(j.id),
            plain(j.name),
            plain(j.owner),
            styled_state(j.state),
            gpus,
            str(j.leases.port or ""),
            plain(progress_line(j.progress)),
            age(j.submitted_at),
        )
    return table


STATE_STYLE = {
    JobState.QUEUED: "yellow",
    JobState.HELD: "magenta",
    JobState.STARTING: "cyan",
    JobState.RUNNING: "green",
    JobState.SUCCEEDED: "bold green",
    JobState.FAILED: "bold red",
    JobState.CANCELLED: "dim",
    JobState.TIMED_OUT: "red",
}


def styled_state(state: JobState) -> Any:
    from ddpq.client.format import plain

    return plain(state.value, STATE_STYLE[state])


def render_job(job: JobDetail, tail: bytes) -> None:
    """Print one job for people. Every line is a ``Text`` (never markup: a command may hold
    ``[/bold]``), and everything a user or job chose goes through ``sanitize``."""
    from rich.text import Text

    from ddpq.client.format import plain, progress_line, sanitize
    from ddpq.core.units import human_duration

    con = console()

    def line(text: str) -> None:
        con.print(Text(text))

    con.print(
        Text.assemble(
            (f"job {job.id}", "bold"),
            f" {sanitize(job.name)}  ",
            styled_state(job.state),
            f"  {sanitize(job.reason)}",
        )
    )
    line(f"  owner      {sanitize(job.owner)}")
    line(
        f"  command    {sanitize(' '.join(job.command))}"
        + ("  (torchrun)" if job.launcher == "torchrun" else "")
    )
    line(
        f"  gpus       {job.gpus} requested"
        + (f", leased {job.leases.gpus}" if job.leases.gpus else "")
    )
    if job.leases.port:
        line(f"  port       {job.leases.port}")
    line(f"  priority   {job.priority}")
    if job.time_limit_s:
        line(f"  time limit {human_duration(job.time_limit_s)}")
    if job.after:
        line(f"  after      {', '.join(map(str, job.after))}")
    line(f"  attempt    {job.attempt} (retries allowed: {job.retries})")
    if job.exit_code is not None or job.exit_signal is not None:
        line(
            f"  exit       code {job.exit_code}"
            + (f", signal {job.exit_signal}" if job.exit_signal else "")
        )
    if job.progress:
        line(f"  progress   {sanitize(progress_line(job.progress))}")
    if job.job_dir:
        line(f"  folder     {sanitize(job.job_dir)}")
    con.print(plain("history", "bold"))
    for e in job.events:
        at = f"{e.at.astimezone():%Y-%m-%d %H:%M:%S}"
        line(f"  {at}  {sanitize(e.to_state):<10} {sanitize(e.reason)}")
    if job.attempts:
        con.print(plain("attempts", "bold"))
        for a in job.attempts:
            state = sanitize(a.state or "running")
            where = f"  ({sanitize(a.executor or '?')} {sanitize(a.handle)})" if a.handle else ""
            line(f"  #{a.number} GPUs {a.gpus} port {a.port}  {state}  {sanitize(a.reason)}{where}")
    if tail:
        con.print(plain("log tail", "bold"))
        # `ddpq logs` prints a job's bytes raw on purpose (they are the job's, and may be
        # piped to a file); this tail is part of a rendering, so it is made safe like the
        # rest: lines kept, escapes and other control characters made visible.
        text = sanitize(tail.decode(errors="replace"), multiline=True)
        con.print(Text(text), highlight=False, soft_wrap=True)


def gpu_table(devs: DeviceList) -> Any:
    from rich.table import Table

    from ddpq.client.format import age, plain

    port_of = {job: port for port, job in devs.ports_leased.items()}
    table = Table(box=None, header_style="bold", pad_edge=False)
    for col in ("GPU", "NAME", "STATUS", "JOB", "OWNER", "PORT", "SINCE", "MEMORY", "OUTSIDE"):
        table.add_column(col, no_wrap=True)
    for d in devs.items:
        status = {
            "free": "[green]free[/]",
            "leased": "[cyan]leased[/]",
            "external": "[red]external[/]",
        }[d.status]
        outside = ", ".join(f"pid {p.pid}" for p in d.external_processes)
        table.add_row(
            str(d.index),
            # The driver's name for the GPU and a user's name: plain text, never markup.
            plain(d.name + (" (fake)" if d.fake and d.name != "fake" else "")),
            status,
            str(d.job_id or ""),
            plain(d.owner or ""),
            str(port_of.get(d.job_id, "")) if d.job_id else "",
            age(d.since) if d.since else "",
            f"{d.memory_used_mb}/{d.memory_total_mb} MiB",
            outside,
        )
    return table
