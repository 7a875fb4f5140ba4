"""What ships: the wheel carries the migrations and the shim; the compose file is honest."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def test_the_wheel_carries_migrations_and_the_shim(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("ddpq-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "ddpq/migrations/env.py" in names
    assert any(n.startswith("ddpq/migrations/versions/0001_") for n in names)
    assert "ddpq/executors/local/shim.py" in names
    assert "ddpq/server/static/index.html" in names


def test_compose_file_uses_real_flags_and_files() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    service = compose["services"]["ddpq"]
    command = service["command"]
    assert command[0] == "serve"
    helptext = subprocess.run(
        [sys.executable, "-m", "ddpq", "serve", "--help"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    for flag in (arg for arg in command if arg.startswith("--")):
        assert flag in helptext, f"docker-compose.yml passes {flag}, which serve does not take"
    # Listening on all addresses is only allowed with --auth.
    assert "0.0.0.0" not in command or "--auth" in command
    assert service["environment"]["DDPQ_HOME"] in {v.split(":")[1] for v in service["volumes"]}
    assert (ROOT / service.get("build", ".") / "Dockerfile").exists()
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        if line.startswith("COPY "):
            for src in line.split()[1:-1]:
                assert (ROOT / src).exists(), f"Dockerfile copies {src}, which is missing"
