"""GPU discovery: the real nvidia-ml-py bindings against the fake NVML library,
the fake-GPU mode, and the external-process helper."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ddpq.core.gpus import Gpu, GpuProcess, external_pids
from ddpq.worker.devices import FAKE_MEMORY_MB, DevicesUnavailable, _text, discover

Discover = Callable[..., Any]
RunPython = Callable[..., Any]


def as_device(d: dict[str, Any]) -> Gpu:
    """A Gpu back from its JSON form, to test it in this process."""
    procs = tuple(GpuProcess(**p) for p in d["processes"])
    return Gpu(**{**d, "processes": procs})


def uuid(i: int) -> str:
    return f"GPU-fa4e0000-0000-0000-0000-{i:012d}"


def proc(pid: int, mb: int | None) -> dict[str, Any]:
    """A process as discovery reports it: NVML names no owner (the worker does, later)."""
    return {"pid": pid, "used_memory_mb": mb, "uid": None, "account": None, "user": None}


# --- through NVML -----------------------------------------------------------


def test_every_gpu_with_its_uuid_name_and_memory(nvml_discover: Discover) -> None:
    devices = nvml_discover(FAKE_NVML_GPUS="3", FAKE_NVML_MEM_MB="81920")
    assert devices == [
        {
            "index": i,
            "uuid": uuid(i),
            "name": "Fake NVML GPU",
            "memory_total_mb": 81920,
            "memory_used_mb": 0,
            "processes": [],
            "fake": False,
            # This fake driver has no topology or MIG calls: unknown, and discovery works.
            "numa": None,
            "cpus": None,
            "links": [],
            "mig_profile": None,
            "parent": None,
        }
        for i in range(3)
    ]


def test_uuid_and_name_are_str_not_bytes(nvml_python: RunPython, fake_nvml_dir: Path) -> None:
    # JSON cannot carry bytes, so check the types in the child itself.
    code = (
        "import json; from ddpq.worker.devices import discover; d = discover(None)[0]; "
        "print(json.dumps([type(d.uuid).__name__, type(d.name).__name__, d.uuid]))"
    )
    assert nvml_python(code, fake_nvml_dir, FAKE_NVML_GPUS="1") == ["str", "str", uuid(0)]


def test_text_decodes_bytes_from_old_bindings() -> None:
    # The installed nvidia-ml-py already returns str; older releases gave bytes.
    assert _text(b"GPU-1234") == "GPU-1234"
    assert _text("NVIDIA H200") == "NVIDIA H200"


def test_compute_processes_per_gpu(nvml_discover: Discover) -> None:
    # Several processes on one GPU check the 24-byte stride of the process
    # struct; 70000 MiB does not fit in 32 bits; "na" is NVML_VALUE_NOT_AVAILABLE.
    devices = nvml_discover(
        FAKE_NVML_GPUS="3",
        FAKE_NVML_PROCS="0:1111:1024,2:2222:512,1:5555:70000,2:3333:na,0:4444:2048",
    )
    procs = {d["index"]: d["processes"] for d in devices}
    assert procs == {
        0: [proc(1111, 1024), proc(4444, 2048)],
        1: [proc(5555, 70000)],
        2: [proc(2222, 512), proc(3333, None)],
    }
    assert [d["memory_used_mb"] for d in devices] == [3072, 70000, 512]


def test_no_gpus(nvml_discover: Discover) -> None:
    assert nvml_discover(FAKE_NVML_GPUS="0") == []


def test_driver_without_v3_process_query_falls_back_to_v2(
    nvml_discover: Discover, old_driver_nvml_dir: Path
) -> None:
    devices = nvml_discover(old_driver_nvml_dir, FAKE_NVML_GPUS="2", FAKE_NVML_PROCS="1:42:100")
    assert [d["processes"] for d in devices] == [[], [proc(42, 100)]]


def test_nvml_is_shut_down_after_success_and_after_failure(
    nvml_python: RunPython, fake_nvml_dir: Path
) -> None:
    # pynvml counts nvmlInit/nvmlShutdown pairs; a leak would show here.
    code = """
import json, pynvml
from ddpq.worker.devices import DevicesUnavailable, discover
out = []
for _ in range(2):
    try:
        out.append(len(discover(None)))
    except DevicesUnavailable:
        out.append("unavailable")
print(json.dumps([*out, pynvml._nvmlLib_refcount]))
"""
    assert nvml_python(code, fake_nvml_dir, FAKE_NVML_GPUS="2") == [2, 2, 0]
    # The process query fails, but only after nvmlInit succeeded.
    failing = nvml_python(code, fake_nvml_dir, FAKE_NVML_GPUS="2", FAKE_NVML_FAIL="procs")
    assert failing == ["unavailable", "unavailable", 0]


# --- failures -----------------------------------------------------------------


def test_init_failure_is_devices_unavailable(nvml_discover: Discover) -> None:
    error = nvml_discover(FAKE_NVML_FAIL="1")["error"]
    assert "Driver Not Loaded" in error
    assert "--fake-gpus N" in error
    assert "\n" not in error


def test_failed_query_names_the_gpu_and_what_failed(nvml_discover: Discover) -> None:
    error = nvml_discover(FAKE_NVML_GPUS="2", FAKE_NVML_FAIL="procs")["error"]
    assert error == "NVML query for the compute processes of GPU 0 failed: GPU is lost"


def test_missing_library_is_devices_unavailable(
    nvml_python: RunPython, nvml_discover: Discover, tmp_path: Path
) -> None:
    empty = tmp_path / "no-nvml"
    empty.mkdir()
    probe = """
import ctypes, json
try:
    ctypes.CDLL("libnvidia-ml.so.1")
    print(json.dumps(True))
except OSError:
    print(json.dumps(False))
"""
    if nvml_python(probe, empty):
        pytest.skip("this host has a real libnvidia-ml.so.1; cannot test its absence")
    error = nvml_discover(empty)["error"]
    assert "NVML Shared Library Not Found" in error
    assert "libnvidia-ml.so.1" in error
    assert "--fake-gpus N" in error
    assert "\n" not in error


# --- fake GPUs ----------------------------------------------------------------


def test_fake_gpus() -> None:
    assert discover(3) == [
        Gpu(
            index=i,
            uuid=f"FAKE-GPU-{i}",
            name="fake",
            memory_total_mb=FAKE_MEMORY_MB,
            memory_used_mb=0,
            processes=(),
            fake=True,
        )
        for i in range(3)
    ]
    assert discover(0) == []


def test_negative_fake_gpus_is_an_error() -> None:
    with pytest.raises(ValueError, match="fake_gpus"):
        discover(-1)


def test_neither_import_nor_fake_mode_loads_pynvml(nvml_python: RunPython, tmp_path: Path) -> None:
    # The CLI imports this module; it must not pay for the NVML bindings, and
    # fake mode must work with no NVML library at all (an empty directory).
    code = """
import json, sys
import ddpq.worker.devices as devices
after_import = "pynvml" in sys.modules
n = len(devices.discover(2))
print(json.dumps([after_import, n, "pynvml" in sys.modules]))
"""
    assert nvml_python(code, tmp_path) == [False, 2, False]


def test_devices_unavailable_is_a_runtime_error() -> None:
    assert issubclass(DevicesUnavailable, RuntimeError)


# --- external_pids --------------------------------------------------------------


def _device_with(*pids: int) -> Gpu:
    procs = tuple(GpuProcess(pid=p, used_memory_mb=100) for p in pids)
    return dataclasses.replace(discover(1)[0], processes=procs)


def test_external_pids_are_those_ddpq_did_not_start() -> None:
    device = _device_with(10, 20, 30)
    assert external_pids(device, {20}) == [10, 30]
    assert external_pids(device, [10, 20, 30]) == []
    assert external_pids(device, frozenset()) == [10, 20, 30]
    assert external_pids(_device_with(), {1}) == []


def test_external_pids_lists_a_repeated_pid_once() -> None:
    # With MIG, NVML lists a process once per GPU instance it uses.
    assert external_pids(_device_with(7, 8, 7, 9, 8), {9}) == [7, 8]


def test_external_pids_on_devices_discovered_through_nvml(nvml_discover: Discover) -> None:
    raw = nvml_discover(FAKE_NVML_GPUS="2", FAKE_NVML_PROCS="0:100:10,0:200:20,1:300:30")
    devices = [as_device(d) for d in raw]
    assert [external_pids(d, {200, 300}) for d in devices] == [[100], []]
