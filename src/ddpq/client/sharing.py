"""The client's side of sharing GPUs by memory: ``submit``'s ``--gpu-mem``/``--gpu-share``,
and the memory a job reserved and used as `ls`, `show` and `gpus` print it (the drawing
itself is ``client.draw``'s, which imports this module; `ddpq reservations` is
``client.reservations``). Standard library only at import (the CLI's hot path)."""

from __future__ import annotations

from ddpq.client.format import Data

# Not typing.TYPE_CHECKING: `ddpq submit` and `ddpq ls` import no ``typing`` (``client.quick``).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


class BadOption(ValueError):
    """An option the CLI can tell is wrong before sending it (exit 2)."""


def submit_fields(gpu_mem: str | None, gpu_share: int | None) -> dict[str, Any]:
    """What ``--gpu-mem`` and ``--gpu-share`` add to a submission (the daemon checks the
    rest: the bounds, and that some GPU here has the memory)."""
    if gpu_mem is None:
        if gpu_share is not None:
            raise BadOption("--gpu-share: only with --gpu-mem")
        return {}
    fields: dict[str, Any] = {}
    if gpu_mem.strip().lower() == "auto":
        fields["gpu_mem"] = "auto"
    else:
        from ddpq.core.units import parse_size  # only when a size is given

        try:
            fields["gpu_mem"] = parse_size(gpu_mem)
        except ValueError as exc:
            raise BadOption(f"--gpu-mem: {exc}, or auto") from None
    if gpu_share is not None:
        fields["gpu_share"] = gpu_share
    return fields


def _size(n: int | None) -> str:
    from ddpq.core.units import size_for_people

    return "" if n is None else size_for_people(int(n))


def mem_text(job: Data) -> str:
    """The MEM column of `ls`: peak/reserved for a job that shares ("3.1G/5G"), its peak
    for one with whole GPUs, what it asks for while it waits ("5G", "auto")."""
    reserved = job["leases"].get("gpu_mem")
    peak = job.get("peak_mem")
    if reserved is not None:
        return f"{_size(peak) or '-'}/{_size(reserved)}"
    if job["leases"]["gpus"] or peak is not None:
        return _size(peak)
    if job.get("gpu_mem_auto"):
        return "auto"
    return _size(job.get("gpu_mem"))


def memory_lines(job: Data) -> list[str]:
    """`show`'s lines on memory: what it asks for, what it reserved, what it used."""
    lines = []
    asked = "auto" if job.get("gpu_mem_auto") else _size(job.get("gpu_mem"))
    if asked:
        cap = job.get("gpu_share")
        line = f"  gpu memory {asked} on each GPU, shared"
        lines.append(line + (f" (at most {cap} jobs on a GPU)" if cap else ""))
    if job["leases"].get("gpu_mem") is not None:
        lines.append(f"  reserved   {_size(job['leases']['gpu_mem'])} on each GPU")
    if job.get("peak_mem") is not None:
        lines.append(f"  peak       {_size(job['peak_mem'])} (measured on one of its GPUs)")
    return lines


def attempt_memory(attempt: Data) -> str:
    """What `show` adds to an attempt's line: "reserved 5G, peak 3.1G"."""
    parts = []
    if attempt.get("gpu_mem") is not None:
        parts.append(f"reserved {_size(attempt['gpu_mem'])}")
    if attempt.get("peak_mem") is not None:
        parts.append(f"peak {_size(attempt['peak_mem'])}")
    return f"  ({', '.join(parts)})" if parts else ""


def share_text(device: Data) -> tuple[str, str]:
    """The JOB and OWNER cells of `ddpq gpus` for a GPU jobs share: "12,13", "alice,bob"."""
    shares = device.get("shares") or []
    jobs = ",".join(str(s["job_id"]) for s in shares)
    owners = ",".join(dict.fromkeys(str(s.get("owner") or "?") for s in shares))
    return jobs, owners


def reserved_on(device: Data) -> int:
    return sum(int(s["gpu_mem"]) for s in device.get("shares") or [])
