"""The environment rules without a daemon: ``core.jobenv`` and the job contract built on it."""

from __future__ import annotations

import os
import pwd
from dataclasses import replace
from pathlib import Path

import pytest

from ddpq.core import jobenv
from ddpq.executors.base import Launch
from ddpq.executors.contract import job_argv, job_env
from tests import launches


@pytest.mark.parametrize(
    ("spec", "names"),
    [("ALL", None), ("all", None), (" NONE ", ()), ("A", ("A",)), ("A,_B2, C", ("A", "_B2", "C"))],
)
def test_parse_export(spec: str, names: tuple[str, ...] | None) -> None:
    assert jobenv.parse_export(spec) == names


@pytest.mark.parametrize("spec", ["", "A,", "1A", "A-B", "A=1", "ÄB", "A B"])
def test_parse_export_refuses_what_is_not_a_list_of_names(spec: str) -> None:
    with pytest.raises(ValueError, match="not a variable name"):
        jobenv.parse_export(spec)


def test_exported_leaves_out_terminal_and_ddpq_variables_and_keeps_the_rest() -> None:
    shell = {
        "PATH": "/venv/bin:/usr/bin",
        "MYVAR": "x",
        "BASH_FUNC_module%%": "() { :; }",
        "DISPLAY": ":0",
        "TERM": "xterm",
        "_": "/usr/bin/ddpq",
        "DDPQ_TOKEN": "ddpq_x",
        "DDPQ_URL": "http://x",
        "MASTER_PORT": "29500",
        "LOCAL_RANK": "0",
        "BROKEN": "caf\udce9",  # a byte that is not UTF-8, as os.environ holds it
    }
    sent, undecodable = jobenv.exported(shell, None)
    assert sent == {"PATH": "/venv/bin:/usr/bin", "MYVAR": "x", "BASH_FUNC_module%%": "() { :; }"}
    assert undecodable == ["BROKEN"]


def test_exported_none_and_a_list_keep_lang_and_only_what_is_listed() -> None:
    shell = {"LANG": "de_DE.UTF-8", "A": "1", "B": "2", "DISPLAY": ":0"}
    assert jobenv.exported(shell, ()) == ({"LANG": "de_DE.UTF-8"}, [])
    assert jobenv.exported(shell, ("A", "DISPLAY", "MISSING")) == (
        {"LANG": "de_DE.UTF-8", "A": "1"},
        [],
    )


def test_pack_and_unpack() -> None:
    assert jobenv.pack(None, {"A": "1"}) == {"A": "1"}
    assert jobenv.unpack({"A": "1"}) == (False, {"A": "1"})
    packed = jobenv.pack({"A": "shell", "B": "2"}, {"A": "explicit"})
    assert jobenv.unpack(packed) == (True, {"A": "explicit", "B": "2"})
    assert jobenv.unpack(jobenv.pack({}, {})) == (True, {})
    # The mark can be no variable's name: '=' ends a name in an environment.
    assert not jobenv.is_exportable_name(jobenv.EXPORTED_MARK)


def launch(env: dict[str, str], gpus: tuple[int, ...] = (1,), port: int | None = 29601) -> Launch:
    return launches.a_launch(
        job_id=5,
        attempt=2,
        job_dir=Path("/state/jobs/5"),
        command=["python", "x.py"],
        launcher="plain",
        gpus=gpus,
        port=port,
        cwd="/work",
        env=env,
        owner="alice",
        unix_account=None,
    )


DAEMON = {"PATH": "/daemon/bin", "HOME": "/daemon-home", "DDPQ_HOME": "/state", "D": "1"}


def test_a_job_without_an_exported_environment_starts_from_the_daemons() -> None:
    env = job_env(launch({"A": "1"}), DAEMON, omp_threads=4)
    assert env["PATH"] == "/daemon/bin" and env["D"] == "1" and env["A"] == "1"
    assert "DDPQ_HOME" not in env  # the daemon's own
    assert env["OMP_NUM_THREADS"] == "4"


def test_a_job_with_an_exported_environment_starts_from_it_and_the_contract_wins() -> None:
    exported = {"PATH": "/venv/bin", "OMP_NUM_THREADS": "2", "CONDA_PREFIX": "/c"}
    env = job_env(launch(jobenv.pack(exported, {"A": "1"})), DAEMON, omp_threads=4)
    assert "D" not in env and env["PATH"] == "/venv/bin" and env["CONDA_PREFIX"] == "/c"
    assert env["OMP_NUM_THREADS"] == "2"  # the user's choice stands
    assert env["A"] == "1" and jobenv.EXPORTED_MARK not in env
    assert (env["CUDA_VISIBLE_DEVICES"], env["MASTER_PORT"]) == ("1", "29601")
    assert (env["DDPQ_JOB_ID"], env["DDPQ_ATTEMPT"], env["MASTER_ADDR"]) == ("5", "2", "127.0.0.1")


def test_an_empty_exported_environment_gets_the_minimal_one() -> None:
    env = job_env(launch(jobenv.pack({}, {})), DAEMON, omp_threads=4)
    me = pwd.getpwuid(os.geteuid())
    assert env["PATH"] == jobenv.MINIMAL_PATH
    assert (env["HOME"], env["USER"], env["LOGNAME"]) == (me.pw_dir, me.pw_name, me.pw_name)


def test_stored_rows_with_left_out_variables_still_leave_them_out() -> None:
    # A row stored by a client the API trusted more before: the contract drops them again.
    stored = {jobenv.EXPORTED_MARK: "1", "DISPLAY": ":0", "MASTER_PORT": "1", "K": "v"}
    env = job_env(launch(stored, gpus=(), port=None), DAEMON, omp_threads=1)
    assert "DISPLAY" not in env and "MASTER_PORT" not in env and env["K"] == "v"


def test_a_sweep_members_variables_survive_an_exported_environment() -> None:
    # The server writes them into each member's stored environment (core.sweeps.member_env);
    # every other DDPQ_* variable in a stored row is still dropped.
    member = {"DDPQ_SWEEP_ID": "3", "DDPQ_SWEEP_INDEX": "7", "DDPQ_SWEEP_PARAMS": '{"lr":"0.1"}'}
    stored = {**jobenv.pack({"PATH": "/venv/bin", "DDPQ_TOKEN": "ddpq_x"}, {}), **member}
    env = job_env(launch(stored), DAEMON, omp_threads=1)
    assert {k: env[k] for k in member} == member
    assert "DDPQ_TOKEN" not in env
    assert job_env(launch({**member}), DAEMON, omp_threads=1)["DDPQ_SWEEP_INDEX"] == "7"


def test_each_attempt_of_an_elastic_job_says_the_size_of_its_lease() -> None:
    """``DDPQ_GPUS`` and torchrun's ranks follow the attempt's GPUs, not the spec's least."""
    for gpus in ((0, 1), (0, 1, 2, 3)):
        grown = launches.a_launch(
            Path("/state/jobs/5"), gpus=gpus, port=29601, launcher="torchrun", gpus_max=4
        )
        grown = replace(grown, spec=replace(grown.spec, gpus=2))
        env = job_env(grown, DAEMON, omp_threads=1)
        assert env["DDPQ_GPUS"] == str(len(gpus))
        assert env["CUDA_VISIBLE_DEVICES"] == ",".join(map(str, gpus))
        argv = job_argv(grown, "python")
        assert argv[argv.index("--nproc-per-node") + 1] == str(len(gpus))
    assert job_env(launch({}, gpus=()), DAEMON, omp_threads=1)["DDPQ_GPUS"] == "0"
