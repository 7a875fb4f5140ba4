"""Build the fake ``libnvidia-ml.so.1`` and run code against it in a fresh process.

pynvml loads the library with ``CDLL("libnvidia-ml.so.1")``, resolved by the
dynamic loader, and keeps it loaded for the life of the process. Only a new
process started with ``LD_LIBRARY_PATH`` set picks up our copy (and its
configuration, read from the environment at ``nvmlInit``), so each check runs
in its own subprocess.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
SRC = HERE.parents[1] / "src"
LIBNAME = "libnvidia-ml.so.1"

# Prints what discover(None) returns, or the DevicesUnavailable message, as JSON.
DISCOVER = """
import dataclasses, json
from ddpq.worker.devices import DevicesUnavailable, discover
try:
    print(json.dumps([dataclasses.asdict(d) for d in discover(None)]))
except DevicesUnavailable as exc:
    print(json.dumps({"error": str(exc)}))
"""


def _compile(out_dir: Path, *defines: str) -> Path:
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler (gcc/cc) to build the fake libnvidia-ml.so.1")
    out_dir.mkdir(parents=True, exist_ok=True)
    cmd = [cc, "-std=c11", "-shared", "-fPIC", "-O1", "-Wall", "-Werror", *defines]
    cmd += ["-o", str(out_dir / LIBNAME), str(HERE / "fake_nvml.c")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    # A compile error is a broken test fixture, not a reason to skip.
    assert proc.returncode == 0, f"compiling fake_nvml.c failed:\n{proc.stderr}"
    return out_dir


@pytest.fixture(scope="session")
def fake_nvml_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding the fake library with every symbol."""
    return _compile(tmp_path_factory.mktemp("fake-nvml") / "full")


@pytest.fixture(scope="session")
def old_driver_nvml_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fake library without nvmlDeviceGetComputeRunningProcesses_v3."""
    return _compile(tmp_path_factory.mktemp("fake-nvml") / "no-v3", "-DFAKE_NVML_NO_V3")


def run_python(code: str, lib_dir: Path, **env: str) -> Any:
    """Run ``code`` in a fresh interpreter that loads NVML from ``lib_dir``.

    ``env`` adds FAKE_NVML_* settings; inherited ones are dropped so that the
    caller's environment cannot change a test. Returns the JSON that ``code``
    printed on its last line of output.
    """
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_NVML_")}
    # Replaces rather than extends: a real driver's directory on the inherited
    # path must not be searched.
    child_env["LD_LIBRARY_PATH"] = str(lib_dir)
    child_env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(SRC), os.environ.get("PYTHONPATH", "")) if p
    )
    child_env.update(env)
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=child_env, timeout=60
    )
    assert proc.returncode == 0, f"subprocess failed ({proc.returncode}):\n{proc.stderr}"
    lines = proc.stdout.strip().splitlines()
    assert lines, f"subprocess printed nothing; stderr:\n{proc.stderr}"
    return json.loads(lines[-1])


@pytest.fixture
def nvml_python() -> Callable[..., Any]:
    """:func:`run_python`, for tests that need another library directory or code."""
    return run_python


@pytest.fixture
def nvml_discover(fake_nvml_dir: Path) -> Callable[..., Any]:
    """``discover(None)`` in a child process, configured by keyword env.

    It loads NVML from ``lib_dir``, by default the full fake library.
    """

    def run(lib_dir: Path | None = None, **env: str) -> Any:
        return run_python(DISCOVER, lib_dir or fake_nvml_dir, **env)

    return run
