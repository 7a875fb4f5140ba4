"""Which GPUs this host has, and which processes are on them, through NVML.

Device indexes are NVML indexes, and NVML numbers GPUs in PCI bus order. CUDA's
default order is "fastest first", which can differ on a host with mixed cards,
so ddpq always sets ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` in a job's environment:
only then does ``CUDA_VISIBLE_DEVICES=2`` mean the GPU that NVML calls 2, the
one the job was leased.

With ``fake_gpus=N`` the host is pretended to have N idle GPUs, for laptops,
CI and demos; NVML is then never loaded.

``pynvml`` (nvidia-ml-py) is imported inside :func:`discover` only: the CLI
imports this package and must not pay for loading the bindings, and a host
without them can still run with fake GPUs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from ddpq.core.gpus import Gpu, GpuProcess

FAKE_MEMORY_MB = 16384
_MIB = 1024 * 1024
_HINT = (
    "is the NVIDIA driver installed and libnvidia-ml.so.1 on the loader path? "
    "To run without GPUs, start ddpq with --fake-gpus N"
)


class DevicesUnavailable(RuntimeError):
    """NVML cannot be used here: no library, no driver, or a failed query."""


def discover(fake_gpus: int | None) -> list[Gpu]:
    """The GPUs of this host: ``fake_gpus`` simulated ones, or (None) NVML's.

    Raises :class:`DevicesUnavailable` with a one-line message when NVML cannot
    be loaded or initialised, or a query fails.
    """
    if fake_gpus is not None:
        if fake_gpus < 0:
            raise ValueError(f"fake_gpus must be >= 0, not {fake_gpus}")
        return [_fake_device(i) for i in range(fake_gpus)]
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
        return [_nvml_device(pynvml, i) for i in range(count)]
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
        processes=tuple(
            GpuProcess(
                pid=int(p.pid),
                used_memory_mb=None if p.usedGpuMemory is None else int(p.usedGpuMemory) // _MIB,
            )
            for p in procs
        ),
        fake=False,
    )


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
