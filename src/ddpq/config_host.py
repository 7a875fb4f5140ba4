"""The host's CPU cores and memory as jobs' resources (``core.hostres``), its /dev/shm
(``executors.local.shim_shm``), and the fake hardware a test host shows (``core.topology``):
one group of ``ddpq.config_decl.Declared``'s settings, declared as every other is."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator
from pydantic_settings import BaseSettings

from ddpq.config_values import CpuCapacity, CpusPerGpu, JobRam, OptionalSize, Public, absolute
from ddpq.core.topology import FAKE_TOPOLOGY_HELP


class HostSettings(BaseSettings):
    """What jobs may lease of the host's cores and memory, and what a job that names
    none holds."""

    cpu_capacity: Annotated[
        CpuCapacity,
        Public(
            "cpu_capacity",
            "CPU cores running jobs may lease in all (more than the host has oversubscribes them)",
            default_is="auto: the cores the daemon may run on",
        ),
    ] = None
    cpus_per_gpu: Annotated[
        CpusPerGpu,
        Public(
            "cpus_per_gpu",
            "cores a GPU job that names no --cpus leases per GPU (0: none, it shares the "
            "cores unconfined)",
            only="worker",
            default_is="auto: cpu_capacity divided among the GPUs, rounded down",
        ),
    ] = None
    job_ram: Annotated[
        JobRam,
        Public(
            "job_ram",
            "host memory running jobs may hold in all (64G, 90% of the host's, or 'unlimited')",
        ),
    ] = 0.9
    private_shm: Annotated[
        bool,
        Public(
            "private_shm",
            "give each job a /dev/shm of its own, freed with all in it when the job ends "
            "(a root daemon; off: jobs share the host's)",
            only="worker",
        ),
    ] = True
    default_mem: Annotated[
        OptionalSize,
        Public(
            "default_mem",
            "host memory a CPU-only job that names no --mem holds and is limited to "
            "('none': none, no limit)",
            only="worker",
        ),
    ] = None
    default_mem_per_gpu: Annotated[
        OptionalSize,
        Public(
            "default_mem_per_gpu",
            "host memory per GPU a GPU job that names no --mem holds and is limited to "
            "('none': default_mem)",
            only="worker",
        ),
    ] = None
    fake_topology: Annotated[
        Path | None,
        AfterValidator(lambda p: None if p is None else absolute(p)),
        Public("fake_topology", FAKE_TOPOLOGY_HELP, only="worker"),
    ] = None
