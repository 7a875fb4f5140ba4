"""What `ddpq watch` draws: the queue with progress bars, and the GPU map.

Every string a user, a job or the GPU driver chose goes in as ``plain(...)``: a ``str``
cell would be read as Rich markup, and control characters would reach the terminal.
"""

from __future__ import annotations

from typing import Any

from ddpq.client.format import age, plain, progress_fraction, progress_line
from ddpq.schemas import DeviceList, JobOut


def bar(fraction: float | None, width: int = 20) -> str:
    if fraction is None:
        return ""
    filled = round(fraction * width)
    return "█" * filled + "░" * (width - filled) + f" {fraction * 100:3.0f}%"


def render(jobs: list[JobOut], devices: DeviceList) -> Any:
    from rich.console import Group
    from rich.table import Table

    queue = Table(title="queue", box=None, header_style="bold", title_justify="left")
    for col in ("ID", "NAME", "OWNER", "STATE", "GPUS", "PORT", "PROGRESS", "", "AGE"):
        queue.add_column(col, no_wrap=True)
    for j in jobs:
        queue.add_row(
            str(j.id),
            plain(j.name),
            plain(j.owner),
            plain(j.state),
            ",".join(map(str, j.leases.gpus)) or str(j.gpus),
            str(j.leases.port or ""),
            bar(progress_fraction(j.progress)),
            plain(progress_line(j.progress)),
            age(j.submitted_at),
        )
    owner_of = {j.id: j.owner for j in jobs}
    port_of = {job: port for port, job in devices.ports_leased.items()}
    gpus = Table(title="GPUs", box=None, header_style="bold", title_justify="left")
    for col in ("GPU", "STATUS", "JOB", "OWNER", "PORT", "MEMORY"):
        gpus.add_column(col, no_wrap=True)
    for d in devices.items:
        gpus.add_row(
            str(d.index),
            plain(d.status),
            str(d.job_id or ""),
            plain(d.owner or owner_of.get(d.job_id or -1, "")),
            str(port_of.get(d.job_id, "")) if d.job_id else "",
            f"{d.memory_used_mb}/{d.memory_total_mb} MiB",
        )
    return Group(queue, gpus)
