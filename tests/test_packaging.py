"""What ships: the wheel carries the migrations and the shim; the compose file is honest and
valid Compose; the systemd unit is one systemd reads, and keeps jobs across restarts."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys
import zipfile
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from ddpq.core.names import SYSTEM_SOCKET
from ddpq.core.units import parse_size
from ddpq.daemon.settings import load_settings

ROOT = Path(__file__).resolve().parents[1]
UNIT = ROOT / "packaging" / "ddpq.service"


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
    mounted = {v.split(":")[1] if isinstance(v, str) else v["target"] for v in service["volumes"]}
    assert service["environment"]["DDPQ_HOME"] in mounted
    assert (ROOT / service.get("build", ".") / "Dockerfile").exists()
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        if line.startswith("COPY "):
            for src in line.split()[1:-1]:
                assert (ROOT / src).exists(), f"Dockerfile copies {src}, which is missing"


# ---- the compose file against the Compose Specification -------------------------------------


def compose_schema() -> dict[str, Any]:
    """The Compose Specification's JSON schema, as check-jsonschema vendors it (dev extra)."""
    vendored = resources.files("check_jsonschema.builtin_schemas.vendor")
    schema: dict[str, Any] = json.loads(vendored.joinpath("compose-spec.json").read_text())
    assert schema["title"] == "Compose Specification"
    return schema


def compose_errors(document: object) -> list[str]:
    validator = jsonschema.Draft202012Validator(compose_schema())
    return [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(document)]


def test_the_compose_file_is_valid_compose_with_what_a_gpu_host_needs() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert compose_errors(compose) == []
    service = compose["services"]["ddpq"]
    assert service["init"] is True
    (gpus,) = service["deploy"]["resources"]["reservations"]["devices"]
    assert gpus["driver"] == "nvidia" and "gpu" in gpus["capabilities"]
    home = service["environment"]["DDPQ_HOME"]
    named = {v.split(":")[0]: v.split(":")[1] for v in service["volumes"] if isinstance(v, str)}
    assert named["ddpq-state"] == home and "ddpq-state" in compose["volumes"]
    datasets = [v for v in service["volumes"] if isinstance(v, dict)]
    assert [(v["target"], v["read_only"]) for v in datasets] == [("/datasets", True)]
    assert service["environment"]["DDPQ_CIFAR_DIR"].startswith("/datasets/")
    assert "/healthz" in " ".join(service["healthcheck"]["test"])
    # A container's jobs end with it: it cancels them, with time for their grace period.
    assert "--stop-jobs" in service["command"]
    # Its jobs share the container's /dev/shm (it may not mount one per job): more than
    # Docker's 64 MiB, which PyTorch's data loaders outgrow.
    assert parse_size(str(service["shm_size"])) >= 1 << 30


@pytest.mark.parametrize(
    "spoil",
    [
        lambda s: s.update(init=5),
        lambda s: s.update(inti=True),
        lambda s: s["deploy"]["resources"]["reservations"]["devices"][0].update(count=[1]),
        lambda s: s["healthcheck"].update(interval=30),
    ],
)
def test_the_schema_check_refuses_a_spoiled_compose_file(spoil: Any) -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    spoiled = copy.deepcopy(compose)
    spoil(spoiled["services"]["ddpq"])
    assert compose_errors(spoiled)


# ---- the systemd unit -------------------------------------------------------------------------


def unit_settings(text: str) -> dict[str, list[str]]:
    """Each key's values, in order (a unit may repeat a key), comments left out."""
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        if "=" in line and not line.startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            found.setdefault(key.strip(), []).append(value.strip())
    return found


def test_the_unit_keeps_jobs_across_restarts_and_agrees_with_the_config_file(
    tmp_path: Path,
) -> None:
    unit = unit_settings(UNIT.read_text())
    one = {key: values[-1] for key, values in unit.items()}
    assert one["KillMode"] == "process"  # a restart stops the daemon, not the jobs
    assert one["Delegate"] == "yes"  # job cgroups under the service's are ddpq's
    assert one["Restart"] == "on-failure" and one["RestartPreventExitStatus"] == "2"
    # Bounded: a fork bomb across jobs must leave the machine PIDs (issue 23).
    assert one["OOMPolicy"] == "continue" and one["TasksMax"] == "80%"
    assert one["EnvironmentFile"] == "-/etc/ddpq/ddpq.env"
    assert one["StateDirectory"] == "ddpq" and "User" not in one
    assert "DDPQ_HOME=/var/lib/ddpq" in unit["Environment"]
    for option in ("ProtectSystem", "ProtectHome", "PrivateTmp", "PrivateDevices", "DeviceAllow"):
        assert option not in one, f"{option} would change what every job sees"
    program, command, *flags = one["ExecStart"].split()
    assert program.endswith("/ddpq") and command == "serve" and not flags
    # The shipped config file is one ddpq reads, with the unit's state folder, so that
    # `ddpq admin` run from a shell finds the daemon's database.
    settings = load_settings({}, ROOT / "packaging" / "ddpq.toml")
    assert settings.home == Path("/var/lib") / one["StateDirectory"]
    assert settings.auth  # a root daemon without --auth refuses to start
    # The socket every user's `ddpq` looks for, in the folder the unit has systemd make.
    assert settings.socket_file == Path(SYSTEM_SOCKET)
    assert Path(f"/run/{one['RuntimeDirectory']}") == Path(SYSTEM_SOCKET).parent
    assert one["RuntimeDirectoryMode"] == "0755"  # others must pass through to the socket


def systemd_analyze() -> str:
    found = shutil.which("systemd-analyze")
    if found is None:
        pytest.skip("systemd-analyze not installed (Debian's systemd package; `make systemd`)")
    return found


def verify(unit: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """`systemd-analyze verify` on the unit, its ExecStart pointed at this ddpq (verify
    checks that the program exists; the unit names where docs/admin.md installs it)."""
    lines = [
        f"ExecStart={sys.executable} -m ddpq serve" if line.startswith("ExecStart=") else line
        for line in unit.splitlines()
    ]
    path = tmp_path / "ddpq.service"
    path.write_text("\n".join(lines) + "\n")
    return subprocess.run(
        [systemd_analyze(), "verify", str(path)], capture_output=True, text=True, timeout=60
    )


def test_systemd_analyze_verify_accepts_the_unit(tmp_path: Path) -> None:
    r = verify(UNIT.read_text(), tmp_path)
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "")


def test_systemd_analyze_verify_would_tell_a_mistake(tmp_path: Path) -> None:
    r = verify(UNIT.read_text().replace("KillMode=process", "KilMode=process"), tmp_path)
    assert "Unknown key" in r.stderr and "KilMode" in r.stderr
