"""What `ddpq show` says of a job's CPU cores and host memory: asked, held, peak used."""

from __future__ import annotations

from ddpq.client.format import Data, sanitize


def _size(n: int | None) -> str:
    from ddpq.core.units import size_for_people

    return "" if n is None else size_for_people(int(n))


def cores_text(cores: list[int]) -> str:
    """ "0-3,8" for a list of CPU ids, as a cpuset is written."""
    runs: list[list[int]] = []
    for cpu in sorted(cores):
        if runs and cpu == runs[-1][-1] + 1:
            runs[-1].append(cpu)
        else:
            runs.append([cpu])
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


def cores_named(cores: list[int]) -> str:
    """ "core 0", "cores 0-3,8": which cores, never read as how many ("cpus 0")."""
    return f"core{'s' if len(cores) > 1 else ''} {cores_text(cores)}"


def host_lines(job: Data) -> list[str]:
    """`show`'s lines: "cpus  2 asked, held 0-1" and "memory  1G asked, 1G held"."""
    leases = job["leases"]
    held_cores = leases.get("cores") or []
    asked = job.get("cpus")
    lines = []
    if asked is not None or held_cores:
        parts = [f"{asked} asked" if asked is not None else "default"]
        if held_cores:
            parts.append(f"held {cores_text(held_cores)}")
        lines.append(f"  cpus       {', '.join(parts)}")
    asked_mem, held_mem = job.get("mem"), leases.get("mem")
    if asked_mem is not None or held_mem is not None:
        parts = [f"{_size(asked_mem)} asked" if asked_mem is not None else "default"]
        if held_mem is not None:
            parts.append(f"{_size(held_mem)} held")
        lines.append(f"  memory     {', '.join(parts)}")
    return lines


def attempt_host(attempt: Data) -> str:
    """What `show` adds to an attempt's line: "  (cores 0-1, memory 1G, peak 300M)"."""
    parts = []
    if attempt.get("cores"):
        parts.append(cores_named(attempt["cores"]))
    if attempt.get("mem") is not None:
        parts.append(f"memory {_size(attempt['mem'])}")
    if attempt.get("peak_ram") is not None:
        parts.append(f"peak {_size(attempt['peak_ram'])}")
    return f"  ({', '.join(parts)})" if parts else ""


def host_summary(devices: Data) -> list[str]:
    """`ddpq gpus`'s lines on the host: "cpu cores  1 of 2 held", "memory  1G of 21G held",
    then each job that holds cores or memory."""
    host = devices.get("host")
    if not host:
        return []
    capacity, job_ram = host.get("cpu_capacity"), host.get("job_ram")
    cores = f"{host.get('cores_held', 0)} of {capacity} held" if capacity else "not counted"
    held = _size(host.get("ram_held", 0)) or "0"
    memory = f"{held} of {_size(job_ram)} held" if job_ram else f"{held} held, not bounded"
    lines = [f"cpu cores  {cores}", f"memory     {memory}"]
    for job in host.get("jobs") or []:
        parts = [cores_named(job["cores"]) if job.get("cores") else "cores shared"]
        if job.get("mem") is not None:
            parts.append(f"memory {_size(job['mem'])}")
        owner = sanitize(str(job.get("owner") or "?"))
        lines.append(f"  job {int(job['job_id'])} ({owner}): {', '.join(parts)}")
    return lines
