"""`make gpu-check` (bench/gpu_check.py) on a machine without an NVIDIA GPU: it says so,
writes that to its one file and exits 0 (CI and laptops run it harmlessly)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ddpq.worker.devices import DevicesUnavailable, discover

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "gpu_check.py"


def has_gpu() -> bool:
    try:
        return bool(discover(None))
    except DevicesUnavailable:
        return False


@pytest.mark.skipif(has_gpu(), reason="this machine has an NVIDIA GPU: run make gpu-check")
def test_without_a_gpu_it_says_so_and_exits_cleanly(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert "no NVIDIA GPU here" in run.stdout and run.stderr == ""
    assert len(run.stdout.strip().splitlines()) == 1
    result = json.loads(out.read_text())
    assert result["gpu"] is False and "NVML" in result["reason"]
