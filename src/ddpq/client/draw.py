"""How the client draws jobs and GPUs for people (Rich), apart from the commands.

Everything a user or a job chose (names, commands, reasons, progress) is printed as plain
text, never read as markup, with control characters made visible (``format.sanitize``).
Rich itself is imported only when something is drawn. The views take the API's JSON as
``JsonApi`` returns it (or a wire schema's model: ``format.as_data``).
"""

from __future__ import annotations

from collections.abc import Iterable

from ddpq.client.format import Data, as_data, safe, text
from ddpq.core.states import JobState

# Not typing.TYPE_CHECKING: `ddpq submit` and `ddpq ls` import no ``typing`` (``client.quick``).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from datetime import datetime
    from typing import Any

    from ddpq.client.format import Dumps


def console() -> Any:
    from rich.console import Console

    # Rich turns colours off by itself when stdout is not a terminal (and honours NO_COLOR).
    # Into a pipe or a file nothing is wrapped or cut to an imagined 80 columns: one job,
    # one line (``grid.Grid`` draws every column there too).
    con = Console()
    con.soft_wrap = not con.is_terminal
    return con


# What makes Rich draw as on a terminal though stdout is not one (its own variables).
FORCED_TERMINAL = ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "JUPYTER_COLUMNS")


def show(table: Any) -> None:
    """Print a ``grid.Grid``: into a pipe or a file as plain lines, without importing Rich
    (~40 ms: `ddpq ls` in a script pays nothing for it); on a terminal through Rich, which
    fits it to the width and styles it."""
    import os
    import sys

    if not sys.stdout.isatty() and not any(os.environ.get(v) for v in FORCED_TERMINAL):
        sys.stdout.write(table.plain_text())
        sys.stdout.flush()
    else:
        console().print(table)


# `ls`'s columns; on a narrow terminal the first of DROP go first (``grid.Grid``), then
# PROGRESS and REASON wrap. REASON comes last, as squeue's NODELIST(REASON) does.
# START: when a queued job is expected to start (``squeue --start``'s column).
JOB_COLUMNS = (
    "ID",
    "NAME",
    "OWNER",
    "STATE",
    "GPUS",
    "MEM",
    "PORT",
    "PROGRESS",
    "AGE",
    "START",
    "REASON",
)
JOB_DROP = ("MEM", "PORT", "AGE", "START", "OWNER")
JOB_WRAP = ("PROGRESS", "REASON")


def jobs_table(jobs: Iterable[Data | Dumps]) -> Any:
    """The queue as columns. Names, owners, progress and reasons are the users', jobs' and
    daemon's own text: ``plain`` cells, never markup, with control characters made visible."""
    # Cells, not Text: into a pipe the table is drawn without Rich (``show``).
    from ddpq.client.format import age, progress_line, sanitize
    from ddpq.client.grid import Cell
    from ddpq.client.sharing import mem_text

    table = new_table(*JOB_COLUMNS, wrap=JOB_WRAP, drop=JOB_DROP)
    for job in jobs:
        j = as_data(job)
        cells = (
            str(j["id"]),
            text(j["name"]),
            text(j["owner"]),
            gpu_text(j),
            mem_text(j),
            str(j["leases"]["port"] or ""),
            progress_line(j["progress"]),
            age(j["submitted_at"]),
            start_text(j),
            reason_text(j),
        )
        row = [Cell(sanitize(cell)) for cell in cells]
        row.insert(3, state_cell(j["state"]))
        table.add_row(*row)
    return table


def start_text(job: Data, now: datetime | None = None) -> str:
    """When a queued job is expected to start, from now ("in 4m10s", "now"), "?" when the
    daemon cannot tell; nothing for a job that does not wait in the queue."""
    from ddpq.client.format import when
    from ddpq.core.units import human_duration

    if job["state"] != JobState.QUEUED.value:
        return ""
    if not job.get("predicted_start"):
        return "?"
    from datetime import UTC, datetime

    left = (when(job["predicted_start"]) - (now or datetime.now(UTC))).total_seconds()
    return "now" if left < 1 else f"in {human_duration(left)}"


def reason_text(job: Data) -> str:
    """Why a job waits, as the daemon says it: the scheduler's reason for a queued job (the
    gate that stopped it), "held by user" or the dependencies a held job waits for; how a
    finished job ended. A starting or running job has none to show."""
    if job["state"] in (JobState.STARTING.value, JobState.RUNNING.value):
        return ""
    return text(job.get("reason"))


def new_table(
    *columns: str,
    title: str | None = None,
    wrap: str | tuple[str, ...] = "PROGRESS",
    drop: tuple[str, ...] = (),
) -> Any:
    """A table of these columns (``grid.Grid``: Rich's Table costs ~0.4 ms a row); only
    the ``wrap`` ones may wrap, the ``drop`` ones go first on a narrow terminal. Every cell
    is a ``Text`` (``plain``), never markup."""
    from ddpq.client.grid import Grid

    return Grid(*columns, wrap=wrap, title=title, drop=drop)


def gpu_text(job: Data) -> str:
    """The GPUs of a job, one way for every row: "2:0,1" (how many: which) once it holds
    them, "2" while it waits for them, "-" for a job that asked for none; an elastic
    job's range for how many ("2-4:0,1", "2-4")."""
    leased = job["leases"]["gpus"]
    asked = asked_gpus(job)
    if leased:
        return f"{asked if job.get('gpus_max') else len(leased)}:" + ",".join(map(str, leased))
    return asked if job["gpus"] else "-"


def asked_gpus(job: Data) -> str:
    """The GPUs a job asked for: "2", or an elastic job's range "2-4"."""
    most = job.get("gpus_max")
    return f"{job['gpus']}-{most}" if most else str(job["gpus"])


STATE_STYLE = {
    JobState.QUEUED: "yellow",
    JobState.HELD: "magenta",
    JobState.STARTING: "cyan",
    JobState.RUNNING: "green",
    JobState.SUCCEEDED: "bold green",
    JobState.FAILED: "bold red",
    JobState.CANCELLED: "dim",
    JobState.TIMED_OUT: "red",
    JobState.PREEMPTED: "blue",  # an attempt's end, not a job's
}


def state_cell(state: str) -> Any:
    """``styled_state`` as a ``grid.Cell``."""
    from ddpq.client.format import sanitize
    from ddpq.client.grid import Cell

    try:
        known = JobState(state)
    except ValueError:
        return Cell(sanitize(text(state)))
    return Cell(known.value, STATE_STYLE[known])


def styled_state(state: str) -> Any:
    """A state name in its colour (one the client does not know: as it is, uncoloured)."""
    from ddpq.client.grid import as_text

    return as_text(state_cell(state))


def render_job(job: Data | Dumps, tail: bytes) -> None:
    """Print one job for people. Every line is a ``Text`` (never markup: a command may hold
    ``[/bold]``), and everything a user or job chose goes through ``sanitize``."""
    from rich.text import Text

    from ddpq.client.format import plain, sanitize

    j = as_data(job)
    con = console()
    con.print(
        Text.assemble(
            (f"job {j['id']}", "bold"),
            f" {safe(j['name'])}  ",
            styled_state(j["state"]),
            f"  {safe(j['reason'])}",
        )
    )
    for line in job_lines(j):
        con.print(Text(line))
    con.print(plain("history", "bold"))
    for line in history_lines(j):
        con.print(Text(line))
    if j.get("attempts"):
        con.print(plain("attempts", "bold"))
        for line in attempt_lines(j):
            con.print(Text(line))
    if tail:
        con.print(plain("log tail", "bold"))
        # `ddpq logs` prints a job's bytes raw on purpose (they are the job's, and may be
        # piped to a file); this tail is part of a rendering, so it is made safe like the
        # rest: lines kept, escapes and other control characters made visible.
        shown = sanitize(tail.decode(errors="replace"), multiline=True)
        con.print(Text(shown), highlight=False, soft_wrap=True)


def job_lines(j: Data) -> list[str]:
    """`show`'s lines under the job's title: what it asked for, holds, and has done."""
    from ddpq.client.format import notify_lines, progress_line, sanitize, when
    from ddpq.client.host import host_lines
    from ddpq.client.sharing import memory_lines
    from ddpq.core.units import human_duration

    leases = j["leases"]
    launcher = "  (torchrun)" if j["launcher"] == "torchrun" else ""
    lines = [
        f"  owner      {safe(j['owner'])}",
        f"  command    {sanitize(' '.join(map(text, j['command'])))}{launcher}",
        f"  gpus       {asked_gpus(j)} requested"
        + (" (elastic)" if j.get("gpus_max") else "")
        + (f", leased {leases['gpus']}" if leases["gpus"] else ""),
        *memory_lines(j),
        *host_lines(j),
    ]
    if j.get("gpu_link") or j.get("gpu_type"):  # what hardware it asked for (docs/topology.md)
        link = f"link {safe(j['gpu_link'])} or better" if j.get("gpu_link") else ""
        kind = f"type {safe(j['gpu_type'])}" if j.get("gpu_type") else ""
        lines.append(f"  hardware   {', '.join(x for x in (link, kind) if x)}")
    if leases["port"]:
        lines.append(f"  port       {leases['port']}")
    lines += session_lines(j)
    if j["state"] == JobState.QUEUED.value:  # the forecast (START in ls)
        at = j.get("predicted_start")
        clock = f" (at {when(at).astimezone():%H:%M:%S})" if at else ""
        lines.append(f"  start      {start_text(j) if at else 'unknown'}{clock}")
    lines.append(f"  priority   {j['priority']}")
    if j["time_limit_s"]:
        lines.append(f"  time limit {human_duration(j['time_limit_s'])}")
    if j.get("dependency"):  # every kind, as sbatch's --dependency (after: afterok only)
        lines.append(f"  depends on {safe(j['dependency'])}")
    elif j["after"]:
        lines.append(f"  after      {', '.join(map(str, j['after']))}")
    lines.append(f"  attempt    {j['attempt']} (retries allowed: {j['retries']})")
    if j["exit_code"] is not None or j["exit_signal"] is not None:
        parts = [f"code {j['exit_code']}"] if j["exit_code"] is not None else []
        parts += [f"signal {j['exit_signal']}"] if j["exit_signal"] else []
        lines.append(f"  exit       {', '.join(parts)}")
    if j["progress"]:
        lines.append(f"  progress   {sanitize(progress_line(j['progress']))}")
    if j["job_dir"]:
        lines.append(f"  folder     {safe(j['job_dir'])}")
    return lines + notify_lines(j, "one message, once it has ended")


def session_lines(j: Data) -> list[str]:
    """An interactive session's lines: its idle limit, how to attach, how long it idles."""
    from ddpq.client.format import age
    from ddpq.core.units import human_duration

    lines = []
    if j.get("interactive"):
        limit = j.get("idle_s")
        lines.append(
            "  session    interactive, "
            + (f"ended once its GPUs are unused {human_duration(limit)}" if limit else "never idle")
            + (f"; `ddpq attach {j['id']}`" if j.get("attach") else "")
        )
    if j.get("idle_since"):
        lines.append(f"  idle       its GPUs unused for {age(j['idle_since'])}")
    return lines


def history_lines(j: Data) -> list[str]:
    """The job's state changes, one a line, in local time."""
    from ddpq.client.format import when

    return [
        f"  {when(e['at']).astimezone():%Y-%m-%d %H:%M:%S}  "
        f"{safe(e['to_state']):<10} {safe(e['reason'])}"
        for e in j.get("events", [])
    ]


def attempt_lines(j: Data) -> list[str]:
    """Each attempt: its GPUs and port, how it ended, where it ran, its memory."""
    from ddpq.client.host import attempt_host
    from ddpq.client.sharing import attempt_memory

    lines = []
    for a in j["attempts"]:
        state = safe(a["state"] or "running")
        handle = a.get("handle")
        where = f"  ({safe(a.get('executor') or '?')} {safe(handle)})" if handle else ""
        port = f" port {a['port']}" if a.get("port") is not None else ""  # none leased
        lines.append(
            f"  #{a['number']} GPUs {a['gpus']}{port}  {state}  "
            f"{safe(a['reason'])}{where}{attempt_memory(a)}{attempt_host(a)}"
        )
    return lines


def render_env(env: Data) -> None:
    """The variables a job was submitted with, one ``NAME=value`` a line, sorted; each made
    safe to print (a value may hold anything, newlines and escapes included)."""
    from rich.text import Text

    from ddpq.client.format import sanitize

    con = console()
    exported = env["base"] == "exported"
    start = "its submitter's exported environment" if exported else "the daemon's environment"
    con.print(Text(f"job {env['id']} starts from {start}, with:", style="bold"))
    for key in sorted(env["env"]):
        con.print(Text(f"{sanitize(text(key))}={sanitize(text(env['env'][key]))}"))


GPU_DROP = ("NAME", "PORT", "SINCE", "IDLE", "OWNER")


def gpu_table(devices: Data | Dumps) -> Any:
    from ddpq.client.format import age, plain
    from ddpq.client.sharing import reserved_on, share_text
    from ddpq.core.units import size_for_people

    devs = as_data(devices)
    # JSON object keys are strings: "29600" -> job 1.
    port_of = {job: port for port, job in devs["ports_leased"].items()}
    columns = ("GPU", "NAME", "STATUS", "JOB", "OWNER", "PORT", "SINCE", "IDLE", "MEMORY")
    # Who is on a GPU outside the queue wraps rather than being cut off; a narrow terminal
    # loses the GPU's model name and the port first.
    table = new_table(*columns, "OUTSIDE", wrap="OUTSIDE", drop=GPU_DROP)
    colour = {"free": "green", "leased": "cyan", "shared": "blue", "external": "red"}
    for d in devs["items"]:
        outside = outside_text(d.get("external_processes") or [])
        name = text(d["name"])
        job_id = d.get("job_id")
        status = text(d["status"])
        jobs, owners = str(job_id or ""), text(d.get("owner"))
        memory = f"{d['memory_used_mb']}/{d['memory_total_mb']} MiB"
        if d.get("shares"):
            jobs, owners = share_text(d)
            memory += f", {size_for_people(reserved_on(d))} reserved"
        if d.get("mig_profile"):
            name += f" MIG {text(d['mig_profile'])} (on GPU {text(d.get('parent'))})"
        table.add_row(
            plain(str(d["index"])),
            # The driver's name for the GPU and a user's name: plain text, never markup.
            plain(name + (" (fake)" if d["fake"] and name != "fake" else "")),
            plain(status, colour.get(status, "")),
            plain(jobs),
            plain(owners),
            plain(str(port_of.get(job_id, "")) if job_id else ""),
            plain(age(d["since"]) if d.get("since") else ""),
            # How long the job holding it has left its GPUs unused; long: past --idle.
            plain(age(d["idle_since"]) if d.get("idle_since") else "", idle_style(d)),
            plain(memory),
            plain(outside),
        )
    return table


def person(proc: Data) -> str:
    """Whose an outside process is: "bob (robert)" for account robert of ddpq user bob,
    "alice" where both names are one, the account or "uid N" where no user has it."""
    account, user, uid = proc.get("account"), proc.get("user"), proc.get("uid")
    name = text(account) if account else (f"uid {text(uid)}" if uid is not None else "unknown")
    if user and user != account:
        return f"{text(user)} ({name})"
    return name


def outside_text(procs: Iterable[Data]) -> str:
    """The processes in no job on one GPU, by person: "alice: pid 12, 13; uid 1234: pid 9"."""
    by_person: dict[str, list[str]] = {}
    for p in procs:
        by_person.setdefault(person(p), []).append(text(p.get("pid")))
    return "; ".join(f"{who}: pid {', '.join(pids)}" for who, pids in by_person.items())


def idle_style(device: Data) -> str:
    return "bold red" if device.get("idle_long") else ""
