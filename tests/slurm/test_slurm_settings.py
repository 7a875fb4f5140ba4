"""The Slurm settings from each source, and a daemon that cannot use Slurm: one line, exit 2."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from ddpq.config import ConfigError
from ddpq.core.slurm import DEFAULT_USER_OPTIONS
from ddpq.daemon import settings as daemon_settings
from ddpq.daemon.settings import load_settings
from ddpq.schemas import JobSubmit
from tests.helpers import Daemon, free_port, root_flags
from tests.slurm.cluster import SlurmCluster


@pytest.fixture(autouse=True)
def _no_outside_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in daemon_settings.PUBLIC_NAMES:
        monkeypatch.delenv(f"DDPQ_{name.upper()}", raising=False)
    monkeypatch.setattr(daemon_settings, "DEFAULT_CONFIG_FILE", tmp_path / "absent.toml")


def test_slurm_settings_from_a_flag_a_variable_and_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    flags = {"executor": "slurm", "slurm_options": "--qos=high --constraint='a100|h100'"}
    settings = load_settings(flags)
    assert settings.executor == "slurm"
    assert settings.slurm_options == ("--qos=high", "--constraint=a100|h100")
    monkeypatch.setenv("DDPQ_SLURM_OPTIONS", "--mem-per-gpu=32G")
    monkeypatch.setenv("DDPQ_SLURM_PARTITION", "gpu")
    assert load_settings({}).slurm_options == ("--mem-per-gpu=32G",)
    config = tmp_path / "ddpq.toml"
    config.write_text(
        'slurm_options = ["--cpus-per-gpu=8"]\nslurm_account = "lab"\nslurm_gpus = 16\n'
    )
    from_file = load_settings({}, config)
    assert from_file.slurm_options == ("--mem-per-gpu=32G",)  # the variable wins
    assert (from_file.slurm_partition, from_file.slurm_account) == ("gpu", "lab")
    assert from_file.slurm_gpus == 16
    monkeypatch.delenv("DDPQ_SLURM_OPTIONS")
    assert load_settings({}, config).slurm_options == ("--cpus-per-gpu=8",)
    assert load_settings({}).executor == "local"


def test_the_options_users_may_set_from_each_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert load_settings({}).slurm_user_options == DEFAULT_USER_OPTIONS
    # Long names with or without dashes, an alias as its option, a plugin's option in full.
    flags = {"slurm_user_options": "--exclusive, qos tasks-per,container-image"}
    with pytest.raises(ConfigError, match="name sbatch options in full"):
        load_settings(flags)  # a prefix of --tasks-per-node is sbatch's, not a plugin's
    flags = {"slurm_user_options": "--exclusive, qos container-image,qos"}
    assert load_settings(flags).slurm_user_options == ("exclusive", "qos", "container-image")
    monkeypatch.setenv("DDPQ_SLURM_USER_OPTIONS", "none")
    assert load_settings({}).slurm_user_options == ()
    config = tmp_path / "ddpq.toml"
    config.write_text('slurm_user_options = ["constraint", "--mem"]\n')
    monkeypatch.delenv("DDPQ_SLURM_USER_OPTIONS")
    assert load_settings({}, config).slurm_user_options == ("constraint", "mem")
    # The admin's own options are kept as sbatch will read them: one spelling each.
    flags = {"slurm_options": "-q high --mem-per-g 32G -C a100"}
    assert load_settings(flags).slurm_options == (
        "--qos=high",
        "--mem-per-gpu=32G",
        "--constraint=a100",
    )


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        ({"executor": "kubernetes"}, "--executor: must be 'local' or 'slurm'"),
        ({"slurm_options": "--output=/tmp/x"}, "--output=/tmp/x is --output to sbatch, which ddpq"),
        ({"slurm_options": "--nodes=4"}, "--nodes=4 is --nodes to sbatch, which ddpq sets"),
        ({"slurm_options": "-N4"}, "-N is --nodes to sbatch, which ddpq sets"),
        ({"slurm_options": "--qos high --gre gpu:8"}, "--gre is ambiguous to sbatch"),
        ({"slurm_options": "--qos=high -G 8"}, "-G is --gpus to sbatch, which ddpq sets"),
        ({"slurm_options": "-q"}, "-q (--qos) needs a value"),
        ({"slurm_options": "high"}, "'high' is not an option"),
        ({"slurm_options": "--comment='a#b'"}, "may hold no quote, '\\' or '#'"),
        ({"slurm_user_options": "qos,gres"}, "--slurm-user-options: --gres is ddpq's own"),
        ({"slurm_user_options": "cons"}, "--slurm-user-options: 'cons': name sbatch options in"),
        ({"slurm_user_options": "q;s"}, "'q;s' is not the long name of an sbatch option"),
        ({"slurm_options": "--qos='high"}, "cannot split into options"),
        ({"slurm_partition": "gpu; rm -rf /"}, "--slurm-partition: must be a Slurm name"),
        ({"slurm_gpus": -1}, "--slurm-gpus: must be between 0"),
    ],
)
def test_a_bad_slurm_setting_is_one_line_naming_it(flags: dict[str, object], says: str) -> None:
    with pytest.raises(ConfigError, match=r"^[^\n]*$") as refused:
        load_settings(flags)
    assert says in str(refused.value)


def test_a_bad_option_in_a_variable_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DDPQ_SLURM_OPTIONS", "--hold")
    with pytest.raises(ConfigError, match="DDPQ_SLURM_OPTIONS='--hold': --hold is --hold to sb"):
        load_settings({})


def serve(tmp_path: Path, *args: str, path: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DDPQ_")}
    if path is not None:
        env["PATH"] = path
    argv = ["serve", "--home", str(tmp_path / "home"), "--port", str(free_port()), *args]
    return subprocess.run(
        [sys.executable, "-m", "ddpq", *argv, *root_flags(list(args))],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


def assert_one_line(r: subprocess.CompletedProcess[str], *words: str) -> None:
    assert r.returncode == 2, r
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    for word in words:
        assert word in r.stderr, r.stderr


def test_no_sbatch_here_is_one_line(tmp_path: Path) -> None:
    r = serve(tmp_path, "--executor", "slurm", path=str(tmp_path / "no-slurm-here"))
    assert_one_line(r, "--executor slurm needs Slurm's commands on PATH", "sbatch")


def test_fake_gpus_mean_nothing_to_slurm(tmp_path: Path) -> None:
    r = serve(tmp_path, "--executor", "slurm", "--fake-gpus", "2")
    assert_one_line(r, "--fake-gpus is for the local executor", "--slurm-gpus")


def test_a_budget_of_gpus_smaller_than_the_cluster(
    slurm: SlurmCluster, slurm_daemons: Callable[..., Daemon]
) -> None:
    d = slurm_daemons("--slurm-gpus", "3")
    c = d.client()
    assert [g.name for g in c.devices().items] == ["Slurm GPU (default partition)"] * 3
    r = d.cli("submit", "--gpus", "4", "--", "true", check=False)
    assert r.returncode != 0 and "3" in r.stderr, r.stderr
    job = c.submit(JobSubmit(command=["true"], gpus=3, cwd="/"))
    assert job.gpus == 3
