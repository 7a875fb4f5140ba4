"""What an executor supports is said by its capabilities (``executors.capabilities``), never
by comparing its name: the API's refusals read the record, word for word as before."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

from ddpq.core.spec import JobSpec
from ddpq.executors.capabilities import LOCAL, SLURM, capabilities
from tests.inprocess import client_with_gpus

SRC = Path(__file__).resolve().parents[1] / "src" / "ddpq"
EXECUTOR_NAMES = {"local", "slurm"}
# Where an executor may be named: its own package, and the setting that chooses one.
NAMED_IN = (SRC / "executors", SRC / "config.py")

# Today's 422 texts, as users have seen them since each refusal was added.
NOT_ON_THIS_HOST = (
    "{field}: this daemon runs jobs on this host, not on Slurm "
    "(only --executor slurm takes nodes, partitions and #SBATCH options)"
)
NO_SHARES = (
    "gpu_mem: this daemon runs jobs on Slurm, which gives jobs whole GPUs; "
    "sharing GPUs by memory needs the local executor"
)
NO_SESSIONS = (
    "interactive: this daemon runs jobs on Slurm, where ddpq cannot relay a "
    "session's terminal yet (use salloc/srun --pty, or a daemon with --executor local)"
)


def here(field: str) -> str:
    return NOT_ON_THIS_HOST.format(field=field)


def executor_name_compares(source: str) -> list[int]:
    """Lines of ``source`` that compare something with an executor's name."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        consts = [
            c.value
            for operand in operands
            for c in ast.walk(operand)
            if isinstance(c, ast.Constant) and isinstance(c.value, str)
        ]
        if EXECUTOR_NAMES & set(consts):
            lines.append(node.lineno)
    return lines


def test_no_executor_is_named_in_a_compare_outside_its_package() -> None:
    found = [
        f"{path.relative_to(SRC)}:{line}"
        for path in sorted(SRC.rglob("*.py"))
        if not any(path == top or top in path.parents for top in NAMED_IN)
        for line in executor_name_compares(path.read_text())
    ]
    assert not found, f"executors named by string: {found}"


@pytest.mark.parametrize(
    "source",
    [
        'if settings.executor == "slurm":\n    pass\n',
        'local = settings.executor != "local"\n',
        'ok = kind in ("local", "slurm")\n',
        'x = "slurm" == settings.executor\n',
    ],
)
def test_the_check_finds_each_form_of_compare(source: str) -> None:
    assert executor_name_compares(source) == [1]


def test_the_check_leaves_other_strings_alone() -> None:
    assert executor_name_compares('if launcher == "torchrun":\n    pass\n') == []
    assert executor_name_compares('name = "slurm"\n') == []  # not a compare


def a_spec(**kw: Any) -> JobSpec:
    return JobSpec(**{"name": "j", "owner": "a", "command": ["true"], "cwd": "/", "gpus": 1, **kw})


@pytest.mark.parametrize(
    ("kind", "fields", "why"),
    [
        ("local", {"nodes": 2, "gpus_per_node": 1}, here("nodes")),
        ("local", {"gpus_per_node": 1}, here("gpus_per_node")),
        ("local", {"partition": "gpu"}, here("partition")),
        (
            "local",
            {"slurm_options": ("--qos=high",)},
            here("slurm_options"),
        ),
        ("slurm", {"gpu_mem_bytes": 1 << 30}, NO_SHARES),
        ("slurm", {"gpu_mem_auto": True}, NO_SHARES),
        ("slurm", {"interactive": True}, NO_SESSIONS),
        ("local", {"gpu_mem_bytes": 1 << 30, "interactive": True}, None),
        ("local", {}, None),
        ("slurm", {"nodes": 2, "gpus_per_node": 1, "partition": "gpu"}, None),
        ("slurm", {}, None),
    ],
)
def test_each_executor_refuses_what_it_cannot_run(
    kind: str, fields: dict[str, Any], why: str | None
) -> None:
    assert capabilities(kind).refuses(a_spec(**fields)) == why


def test_the_kinds_are_the_settings_choices() -> None:
    from ddpq.config import EXECUTORS

    assert {capabilities(kind).kind for kind in EXECUTORS} == set(EXECUTORS)
    assert (LOCAL.on_this_host, SLURM.on_this_host) == (True, False)


@pytest.mark.parametrize(
    ("kind", "fields", "why"),
    [
        (
            "local",
            {"nodes": 2, "gpus": 2, "gpus_per_node": 1},
            here("nodes"),
        ),
        ("local", {"partition": "gpu"}, here("partition")),
        (
            "local",
            {"slurm_options": ["--qos=high"]},
            here("slurm_options"),
        ),
        ("slurm", {"gpu_mem": "1G"}, NO_SHARES),
        ("slurm", {"gpu_mem": "auto"}, NO_SHARES),
        ("slurm", {"interactive": True}, NO_SESSIONS),
    ],
)
def test_the_api_refuses_in_the_same_words(
    tmp_path: Path, kind: str, fields: dict[str, Any], why: str
) -> None:
    for api in client_with_gpus(tmp_path / "home", executor=kind):
        body = {"command": ["true"], "hold": True, **fields}
        r = api.post("/v1/jobs", json=body)
        assert (r.status_code, r.json()["detail"]) == (422, why), r.text
