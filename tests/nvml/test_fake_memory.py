"""The fake libnvidia-ml's per-GPU memory and its file, which a test rewrites while a daemon
runs: each look (nvmlInit) reads it again."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

Discover = Callable[..., Any]
RunPython = Callable[..., Any]


def test_each_gpu_has_its_own_total(nvml_discover: Discover) -> None:
    devices = nvml_discover(FAKE_NVML_GPUS="3", FAKE_NVML_MEM_MB="16384,81920")
    assert [d["memory_total_mb"] for d in devices] == [16384, 81920, 81920]


def test_the_file_is_read_again_at_every_look(
    nvml_python: RunPython, fake_nvml_dir: Path, tmp_path: Path
) -> None:
    state = tmp_path / "nvml"
    state.write_text("FAKE_NVML_GPUS=1\nFAKE_NVML_MEM_MB=16384\n")
    code = f"""
import json, pathlib
from ddpq.worker.devices import DevicesUnavailable, discover
path = pathlib.Path({str(state)!r})
seen = []
def look():
    try:
        seen.append([(d.memory_total_mb, d.memory_used_mb, [p.pid for p in d.processes])
                     for d in discover(None)])
    except DevicesUnavailable as exc:
        seen.append(str(exc))
look()
path.write_text("FAKE_NVML_GPUS=1\\nFAKE_NVML_MEM_MB=16384\\nFAKE_NVML_PROCS=0:77:10240\\n")
look()
path.write_text("this is not NAME=VALUE\\nFAKE_NVML_PROCS\\n")
look()
path.unlink()
look()
print(json.dumps(seen))
"""
    # The environment says otherwise: the file wins; without the file, the environment.
    first, second, broken, gone = nvml_python(
        code, fake_nvml_dir, FAKE_NVML_FILE=str(state), FAKE_NVML_GPUS="2"
    )
    assert first == [[16384, 0, []]]
    assert second == [[16384, 10240, [77]]]
    assert "NVML" in broken  # a line that is not NAME=VALUE fails loudly
    assert "NVML" in gone  # a file that was named and is missing, too
