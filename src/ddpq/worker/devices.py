"""Which GPUs this host has, and which processes are on them, through NVML.

Device indexes are NVML indexes, and NVML numbers GPUs in PCI bus order. CUDA's
default order is "fastest first", which can differ on a host with mixed cards,
so ddpq always sets ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` in a job's environment:
only then does ``CUDA_VISIBLE_DEVICES=2`` mean the GPU that NVML calls 2, the
one the job was leased.

With ``fake_gpus=N`` the host is pretended to have N idle GPUs, for laptops,
CI and demos; NVML is then never loaded. A fake topology file gives them models,
links, NUMA nodes and MIG instances (``worker.hardware``), as NVML does for real ones.

``pynvml`` (nvidia-ml-py) is imported inside :func:`discover` only: the CLI
imports this package and must not pay for loading the bindings, and a host
without them can still run with fake GPUs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from ddpq.core.gpus import Gpu, GpuProcess
from ddpq.worker.hardware import (
    FAKE_MEMORY_MB,
    TopologyUnusable,
    cached_topology,
    fake_devices,
    load_fake,
)

__all__ = ["FAKE_MEMORY_MB", "DevicesUnavailable", "discover"]
_MIB = 1024 * 1024
_HINT = (
    "is the NVIDIA driver installed and libnvidia-ml.so.1 on the loader path? "
    "To run without GPUs, start ddpq with --fake-gpus N"
)


class DevicesUnavailable(RuntimeError):
    """NVML cannot be used here: no library, no driver, or a failed query."""


def discover(fake_gpus: int | None, fake_topology: Path | None = None) -> list[Gpu]:
    """The GPUs of this host: ``fake_gpus`` simulated ones (as ``fake_topology``
    describes them, if given), or (None) NVML's.

    Raises :class:`DevicesUnavailable` with a one-line message when NVML cannot
    be loaded or initialised, or a query fails, or the topology file is unusable.
    """
    if fake_gpus is not None:
        if fake_gpus < 0:
            raise ValueError(f"fake_gpus must be >= 0, not {fake_gpus}")
        if fake_topology is None:
            return [_fake_device(i) for i in range(fake_gpus)]
        try:
            return fake_devices(load_fake(fake_topology, fake_gpus))
        except TopologyUnusable as exc:
            raise DevicesUnavailable(str(exc)) from None
    if fake_topology is not None:
        raise DevicesUnavailable("--fake-topology describes fake GPUs: give --fake-gpus N too")
    return _discover_nvml()


def _fake_device(index: int) -> Gpu:
    return Gpu(
        index=index,
        uuid=f"FAKE-GPU-{index}",
        name="fake",
        memory_total_mb=FAKE_MEMORY_MB,
        memory_used_mb=0,
        processes=(),
        fake=True,
    )


def _text(value: str | bytes) -> str:
    # Older nvidia-ml-py releases return bytes from the string getters (UUID,
    # name); current ones decode them. pyproject asks for >= 12, but an older
    # distribution package can still be the one that gets imported.
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _discover_nvml() -> list[Gpu]:
    try:
        import pynvml
    except ImportError as exc:
        raise DevicesUnavailable(
            f"NVML bindings (nvidia-ml-py) not installed: {exc}; {_HINT}"
        ) from exc

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise DevicesUnavailable(f"cannot initialise NVML ({exc}): {_HINT}") from exc
    try:
        try:
            count = int(pynvml.nvmlDeviceGetCount())
        except pynvml.NVMLError as exc:
            raise DevicesUnavailable(f"NVML cannot count the GPUs: {exc}") from exc
        return _with_topology(pynvml, count)
    finally:
        # Only NVML's reference count is left to release; failing to must not
        # hide the result or the error that got us here.
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()


def _nvml_device(pynvml: Any, index: int) -> Gpu:
    what = "handle"
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        what = "UUID"
        uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
        what = "name"
        name = _text(pynvml.nvmlDeviceGetName(handle))
        what = "memory info"
        memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
        what = "compute processes"
        procs = _compute_processes(pynvml, handle)
    except pynvml.NVMLError as exc:
        raise DevicesUnavailable(f"NVML query for the {what} of GPU {index} failed: {exc}") from exc
    return Gpu(
        index=index,
        uuid=uuid,
        name=name,
        memory_total_mb=int(memory.total) // _MIB,
        memory_used_mb=int(memory.used) // _MIB,
        processes=tuple(_process(p) for p in procs),
        fake=False,
    )


def _with_topology(pynvml: Any, count: int) -> list[Gpu]:
    """The GPUs with their links and NUMA nodes; a GPU split into MIG instances replaced by
    them, numbered after the physical GPUs."""
    gpus = [_nvml_device(pynvml, i) for i in range(count)]
    try:
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    except pynvml.NVMLError as exc:
        raise DevicesUnavailable(f"NVML cannot give a GPU's handle: {exc}") from exc
    placed = cached_topology(pynvml, handles, [g.uuid for g in gpus])
    gpus = [
        replace(g, numa=numa, cpus=cpus, links=links)
        for g, (numa, cpus, links) in zip(gpus, placed, strict=True)
    ]
    out: list[Gpu] = []
    instances: list[Gpu] = []
    for gpu, handle in zip(gpus, handles, strict=True):
        mig = _mig_instances(pynvml, handle, gpu, count + len(instances))
        if mig is None:
            out.append(gpu)
        else:
            instances.extend(mig)
    return out + instances


def _mig_instances(pynvml: Any, handle: Any, parent: Gpu, first: int) -> list[Gpu] | None:
    """The MIG instances of a GPU in MIG mode (None: not in MIG mode), numbered from
    ``first``."""
    try:
        current, _pending = pynvml.nvmlDeviceGetMigMode(handle)
        if current != 1:  # NVML_DEVICE_MIG_ENABLE
            return None
        most = int(pynvml.nvmlDeviceGetMaxMigDeviceCount(handle))
    except (pynvml.NVMLError, AttributeError, TypeError, ValueError):
        return None  # no MIG on this GPU or driver
    out: list[Gpu] = []
    for n in range(most):
        try:
            mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, n)
            uuid = _text(pynvml.nvmlDeviceGetUUID(mig))
            name = _text(pynvml.nvmlDeviceGetName(mig))
            memory = pynvml.nvmlDeviceGetMemoryInfo(mig)
        except pynvml.NVMLError:
            continue  # no instance in this slot
        try:
            procs = _compute_processes(pynvml, mig)
        except pynvml.NVMLError:
            procs = []
        profile = name.split("MIG ", 1)[1].strip() if "MIG " in name else None
        out.append(
            replace(
                parent,
                index=first + len(out),
                uuid=uuid,
                memory_total_mb=int(memory.total) // _MIB,
                memory_used_mb=int(memory.used) // _MIB,
                processes=tuple(_process(p) for p in procs),
                links=(),
                mig_profile=profile,
                parent=parent.index,
            )
        )
    return out


def _process(p: Any) -> GpuProcess:
    used = None if p.usedGpuMemory is None else int(p.usedGpuMemory) // _MIB
    return GpuProcess(pid=int(p.pid), used_memory_mb=used)


def _compute_processes(pynvml: Any, handle: Any) -> list[Any]:
    # nvidia-ml-py's unversioned call uses the newest symbol it knows
    # (nvmlDeviceGetComputeRunningProcesses_v3 today); a driver older than the
    # bindings lacks it, and the bindings then raise FunctionNotFound or their
    # own NVMLLibraryMismatchError (not an NVMLError). The _v2 symbol has the
    # same struct layout and exists in every driver ddpq supports.
    fallback: Callable[[Any], list[Any]] | None = getattr(
        pynvml, "nvmlDeviceGetComputeRunningProcesses_v2", None
    )
    mismatch: tuple[type[BaseException], ...] = tuple(
        cls
        for cls in (
            getattr(pynvml, "NVMLError_FunctionNotFound", None),
            getattr(pynvml, "NVMLLibraryMismatchError", None),
        )
        if isinstance(cls, type) and issubclass(cls, BaseException)
    )
    try:
        return list(pynvml.nvmlDeviceGetComputeRunningProcesses(handle))
    except mismatch as exc:
        if fallback is None:
            raise DevicesUnavailable(
                f"the NVIDIA driver does not match nvidia-ml-py ({exc}); "
                "install an nvidia-ml-py release as old as the driver"
            ) from exc
        return list(fallback(handle))
