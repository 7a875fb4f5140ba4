"""What `ddpq watch` draws: the queue with progress bars, and the GPU map.

Every string a user, a job or the GPU driver chose goes in as ``plain(...)``: a ``str``
cell would be read as Rich markup, and control characters would reach the terminal. Jobs
and GPUs come as the API's JSON (or a wire schema's model: ``format.as_data``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ddpq.client.draw import gpu_text, new_table
from ddpq.client.format import (
    Data,
    age,
    as_data,
    plain,
    progress_fraction,
    progress_line,
    text,
)
from ddpq.client.sharing import share_text

if TYPE_CHECKING:
    from ddpq.client.format import Dumps


def bar(fraction: float | None, width: int = 20) -> str:
    if fraction is None:
        return ""
    filled = round(fraction * width)
    return "█" * filled + "░" * (width - filled) + f" {fraction * 100:3.0f}%"


def render(jobs: Iterable[Data | Dumps], devices: Data | Dumps) -> Any:
    from rich.console import Group

    columns = ("ID", "NAME", "OWNER", "STATE", "GPUS", "PORT", "PROGRESS", "", "AGE")
    queue = new_table(*columns, title="queue", wrap="", drop=("PORT", "AGE", "OWNER"))
    listed = [as_data(j) for j in jobs]
    for j in listed:
        queue.add_row(
            plain(str(j["id"])),
            plain(text(j["name"])),
            plain(text(j["owner"])),
            plain(text(j["state"])),
            plain(gpu_text(j)),
            plain(str(j["leases"]["port"] or "")),
            plain(bar(progress_fraction(j["progress"]))),
            plain(progress_line(j["progress"])),
            plain(age(j["submitted_at"])),
        )
    owner_of = {j["id"]: j["owner"] for j in listed}
    devs = as_data(devices)
    port_of = {job: port for port, job in devs["ports_leased"].items()}
    gpus = new_table("GPU", "STATUS", "JOB", "OWNER", "PORT", "MEMORY", title="GPUs", wrap="")
    for d in devs["items"]:
        job_id = d.get("job_id")
        holders, owners = str(job_id or ""), text(d.get("owner") or owner_of.get(job_id, ""))
        ports = [port_of[job_id]] if job_id in port_of else []
        if d.get("shares"):  # a GPU jobs share by memory: each of them, as `ddpq gpus` says
            holders, owners = share_text(d)
            ports = [port_of[s["job_id"]] for s in d["shares"] if s["job_id"] in port_of]
        gpus.add_row(
            plain(str(d["index"])),
            plain(text(d["status"])),
            plain(holders),
            plain(owners),
            plain(",".join(map(str, ports))),
            plain(f"{d['memory_used_mb']}/{d['memory_total_mb']} MiB"),
        )
    return Group(queue, gpus)
