"""The architecture's seams, checked on every import of every module (docs/architecture.md).

RULES below is the table: which modules each rule applies to, and what they may never import
or the only things they may import. Every import statement counts, at module level, inside
functions and under ``if TYPE_CHECKING`` alike: a lazy import is still a dependency (what
``importlib`` loads is not seen). Names are matched as packages: ``ddpq.store`` covers
``ddpq.store.users``; ``from a import b`` is the import of ``a.b``. To add a rule, add a row;
to accept a violation for a while, add it to KNOWN_EXCEPTIONS with the reason (a test fails
once it is no longer needed).
"""

from __future__ import annotations

import ast
import fnmatch
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STDLIB = "<stdlib>"  # in an `only` list: the standard library (sys.stdlib_module_names)
THIRD_PARTY = "<third-party>"  # in an `only` list: anything neither stdlib nor ddpq


@dataclass(frozen=True)
class Rule:
    seam: str  # the failure message's reason
    applies_to: tuple[str, ...]  # packages (each covers its submodules), or globs: "*.shim"
    never: tuple[str, ...] = ()  # what those modules may not import
    only: tuple[str, ...] = ()  # if given, the only things they may import
    spares: tuple[str, ...] = ()  # modules within applies_to that the rule leaves alone
    allows: tuple[str, ...] = ()  # imports within ``never`` that the rule lets through


# The shim and the modules beside it (executors/local/shim*.py).
SHIM_PARTS = (
    "clone_into",
    "shim",
    "shim_batch",
    "shim_libc",
    "shim_log",
    "shim_procs",
    "shim_pty",
    "shim_record",
    "shim_shm",
    "shim_signals",
    "shim_tmp",
    "shim_wire",
)

RULES = [
    Rule(
        "only the store speaks SQL",
        applies_to=("ddpq",),
        never=("sqlalchemy", "alembic"),
        spares=("ddpq.store", "ddpq.migrations"),
    ),
    Rule(
        "only the server speaks HTTP",
        applies_to=("ddpq",),
        never=("fastapi", "starlette"),
        spares=("ddpq.server",),
    ),
    Rule(
        "only the server, and the daemon that starts it, run uvicorn",
        applies_to=("ddpq",),
        never=("uvicorn",),
        spares=("ddpq.server", "ddpq.daemon"),
    ),
    Rule(
        "only the workloads need torch (a laptop that submits jobs has none)",
        applies_to=("ddpq",),
        never=("torch", "torchvision"),
        spares=("ddpq.workloads",),
    ),
    Rule(
        "the core is pure decisions",
        applies_to=("ddpq.core",),
        only=(STDLIB, "pydantic", "ddpq.core"),
    ),
    Rule(
        "the client holds only the client",
        applies_to=("ddpq.client",),
        only=(
            STDLIB,
            "typer",
            "rich",
            "pydantic",
            "ddpq.__version__",
            "ddpq.client",
            "ddpq.schemas",
            "ddpq.core",
            "ddpq.workloads.registry",
        ),
    ),
    Rule(
        "the server starts no process",
        applies_to=("ddpq.server",),
        never=("ddpq.worker", "ddpq.executors", "ddpq.daemon"),
        # What each executor supports, a table of plain data (standard library and core):
        # the API refuses what the daemon's executor cannot run without naming it.
        allows=("ddpq.executors.capabilities",),
    ),
    Rule(
        "the store knows nothing above it",
        applies_to=("ddpq.store",),
        never=("ddpq.server", "ddpq.worker", "ddpq.client", "ddpq.daemon", "ddpq.executors"),
    ),
    Rule(
        "the worker speaks no HTTP",
        applies_to=("ddpq.worker",),
        never=("ddpq.server", "ddpq.client", "fastapi"),
    ),
    Rule(
        "an executor knows jobs' folders and the settings, not the store, server or client",
        applies_to=("ddpq.executors",),
        only=(STDLIB, THIRD_PARTY, "ddpq.core", "ddpq.jobdir", "ddpq.config", "ddpq.executors"),
    ),
    Rule(
        "a replay runs the real planner and nothing else",
        applies_to=("ddpq.sim",),
        only=(STDLIB, "ddpq.core", "ddpq.sim"),
    ),
    Rule(
        "the shim starts in milliseconds: standard library only",
        # The shim, the modules beside it, and the fork server that runs it: each is
        # found as a top-level module when run by its path with python -S.
        applies_to=(*(f"*.{part}" for part in SHIM_PARTS), "*.forkserver"),
        only=(
            STDLIB,
            *SHIM_PARTS,
            *(f"ddpq.executors.local.{part}" for part in SHIM_PARTS if part != "shim"),
        ),
    ),
]

# (module, import) -> why it is accepted for now.
KNOWN_EXCEPTIONS: dict[tuple[str, str], str] = {}

# Packages the rules name before they exist.
NOT_YET: dict[str, str] = {}


# ---- the checker ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Import:
    module: str  # the importing module
    name: str  # what it imports: "a.b" for `import a.b` and for `from a import b`
    where: str  # file:line


@dataclass(frozen=True)
class Violation:
    imp: Import
    rule: Rule

    def __str__(self) -> str:
        return f"{self.imp.where}: {self.imp.module} imports {self.imp.name}: {describe(self.rule)}"


def imports_of(
    source: str, module: str, *, is_package: bool = False, path: str = ""
) -> list[Import]:
    """Every import in ``source``, wherever it stands, with relative ones made absolute."""
    package = module if is_package else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # `from ..store import db` in ddpq.client.cli: ddpq.store
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, *([base] if base else [])])
            names = [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        found += [Import(module, name, f"{path or module}:{node.lineno}") for name in names]
    return found


def covers(pattern: str, module: str) -> bool:
    if "*" in pattern:
        return fnmatch.fnmatchcase(module, pattern)
    return module == pattern or module.startswith(pattern + ".")


def allowed_by(entry: str, name: str) -> bool:
    top = name.partition(".")[0]
    if entry == STDLIB:
        return top in sys.stdlib_module_names
    if entry == THIRD_PARTY:
        return top != "ddpq" and top not in sys.stdlib_module_names
    return covers(entry, name)


def violations(imports: list[Import], rules: list[Rule]) -> Iterator[Violation]:
    for imp in imports:
        for rule in rules:
            if not any(covers(p, imp.module) for p in rule.applies_to):
                continue
            if any(covers(p, imp.module) for p in rule.spares):
                continue
            forbidden = any(covers(entry, imp.name) for entry in rule.never) and not any(
                covers(entry, imp.name) for entry in rule.allows
            )
            if forbidden or (
                rule.only and not any(allowed_by(entry, imp.name) for entry in rule.only)
            ):
                yield Violation(imp, rule)


def describe(rule: Rule) -> str:
    who = ", ".join(rule.applies_to)
    if rule.spares:
        who += f" (but {', '.join(rule.spares)})"
    allowed = f"imports only {', '.join(rule.only)}" if rule.only else ""
    never = f"never imports {', '.join(rule.never)}" if rule.never else ""
    if rule.allows:
        never += f" (but {', '.join(rule.allows)})"
    return f"rule {rule.seam!r}: {who} " + "; ".join(filter(None, (allowed, never)))


def modules() -> Iterator[tuple[str, Path]]:
    """Every module of the package, and the migrations (the wheel carries them as
    ``ddpq.migrations``)."""
    for top, name in ((ROOT / "src" / "ddpq", "ddpq"), (ROOT / "migrations", "ddpq.migrations")):
        for path in sorted(top.rglob("*.py")):
            parts = [name, *path.relative_to(top).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            yield ".".join(parts), path


def all_imports() -> list[Import]:
    found = []
    for module, path in modules():
        found += imports_of(
            path.read_text(),
            module,
            is_package=path.name == "__init__.py",
            path=str(path.relative_to(ROOT)),
        )
    return found


# ---- the codebase against the table ---------------------------------------------------------


def test_every_module_keeps_to_the_seams() -> None:
    broken = [
        str(v)
        for v in violations(all_imports(), RULES)
        if (v.imp.module, v.imp.name) not in KNOWN_EXCEPTIONS
    ]
    assert not broken, "imports across a seam:\n" + "\n".join(broken)


def test_every_known_exception_still_happens() -> None:
    happening = {(v.imp.module, v.imp.name) for v in violations(all_imports(), RULES)}
    stale = set(KNOWN_EXCEPTIONS) - happening
    assert not stale, f"no longer needed, remove from KNOWN_EXCEPTIONS: {sorted(stale)}"


def test_the_rules_name_modules_that_exist() -> None:
    """A typo in the table (``ddpq.sever``) would make a rule check nothing."""
    names = {module for module, _ in modules()}
    for rule in RULES:
        for pattern in (*rule.applies_to, *rule.spares, *rule.never, *rule.allows, *rule.only):
            internal = pattern.startswith(("ddpq", "*"))
            if not internal or pattern in NOT_YET or pattern == "ddpq.__version__":
                continue
            assert any(covers(pattern, name) for name in names), (rule.seam, pattern)


def test_the_command_line_loads_nothing_of_the_daemon() -> None:
    """What `ddpq ls` pays for before it runs: the client and the daemon's command
    definitions, not the settings (pydantic-settings), the server, the worker or SQL."""
    heavy = [
        "sqlalchemy",
        "alembic",
        "fastapi",
        "starlette",
        "uvicorn",
        "torch",
        "pydantic_settings",
        "ddpq.config",
        "ddpq.store",
        "ddpq.server",
        "ddpq.worker",
        "ddpq.daemon.run",
        "ddpq.daemon.settings",
    ]
    probe = (
        "import sys, ddpq.entry, ddpq.client.format, ddpq.client.watchview\n"
        "ddpq.entry.command_line()\n"
        f"print(sorted(m for m in sys.modules if any(m == h or m.startswith(h + '.') "
        f"for h in {heavy!r})))"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True
    ).stdout
    assert out.strip() == "[]", out


def test_the_shims_modules_import_by_path_without_site_packages() -> None:
    """The shim and the fork server run as ``python -S FILE``: every module the shim's rule
    covers imports so, as a top-level module found beside it, with no ddpq package."""
    folder = ROOT / "src" / "ddpq" / "executors" / "local"
    rule = next(r for r in RULES if r.seam.startswith("the shim starts"))
    names = [
        path.stem
        for path in sorted(folder.glob("*.py"))
        if any(covers(pattern, f"ddpq.executors.local.{path.stem}") for pattern in rule.applies_to)
    ]
    assert {"shim", "shim_batch", "shim_pty", "shim_wire", "forkserver"} <= set(names)
    probe = (
        "import importlib, sys\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "for name in sys.argv[2:]:\n"
        "    importlib.import_module(name)\n"
        "print(sorted(m for m in sys.modules if m == 'ddpq' or m.startswith('ddpq.')))"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run = subprocess.run(
        [sys.executable, "-S", "-c", probe, str(folder), *names],
        capture_output=True,
        text=True,
        env=env,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == "[]", run.stdout


# ---- the checker itself ---------------------------------------------------------------------

CLIENT_RULE = next(r for r in RULES if r.seam == "the client holds only the client")


def check(source: str, module: str, *, is_package: bool = False) -> list[str]:
    return [str(v) for v in violations(imports_of(source, module, is_package=is_package), RULES)]


def test_a_lazy_import_inside_a_function_is_caught_and_named() -> None:
    source = "import json\n\ndef add_user():\n    from ddpq.store import users\n"
    (message,) = check(source, "ddpq.client.admin")
    assert message.startswith("ddpq.client.admin:4: ddpq.client.admin imports ddpq.store.users")
    assert "'the client holds only the client'" in message and "imports only" in message


def test_an_import_for_type_checking_counts_too() -> None:
    source = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ddpq.config import X\n"
    assert [m.split(": ")[1] for m in check(source, "ddpq.client.cli")] == [
        "ddpq.client.cli imports ddpq.config.X"
    ]


def test_relative_imports_are_made_absolute() -> None:
    found = imports_of("from . import api\nfrom ..store import db\n", "ddpq.client.cli")
    assert [i.name for i in found] == ["ddpq.client.api", "ddpq.store.db"]
    in_package = imports_of("from .api import x\n", "ddpq.client", is_package=True)
    assert [i.name for i in in_package] == ["ddpq.client.api.x"]


def test_never_and_spares() -> None:
    assert check("import sqlalchemy.orm\n", "ddpq.store.jobs") == []
    assert check("import sqlalchemy as sa\n", "ddpq.migrations.versions.0001_initial") == []
    (message,) = check("from sqlalchemy import select\n", "ddpq.worker.loop")
    assert "ddpq.worker.loop imports sqlalchemy.select" in message
    assert "'only the store speaks SQL'" in message and "(but ddpq.store" in message
    assert check("import uvicorn\n", "ddpq.daemon.run") == []
    assert len(check("import uvicorn\n", "ddpq.client.cli")) == 2  # two rules say no


def test_allows_lets_one_module_of_a_forbidden_package_through() -> None:
    """The server may ask what an executor supports, and nothing else of the executors."""
    assert check("from ddpq.executors.capabilities import capabilities\n", "ddpq.server.x") == []
    (message,) = check("from ddpq.executors.slurm import SlurmExecutor\n", "ddpq.server.x")
    assert "never imports ddpq.worker, ddpq.executors, ddpq.daemon" in message
    assert "(but ddpq.executors.capabilities)" in message


def test_only_lists_take_the_standard_library_and_nothing_else() -> None:
    assert check("import os, signal\nfrom pathlib import Path\n", "ddpq.worker.shim") == []
    (message,) = check("import os\nimport psutil\n", "ddpq.executors.local.shim")
    assert "imports psutil" in message and "standard library only" in message
    assert check("import pydantic\nfrom ddpq.core import plan\n", "ddpq.core.units") == []
    (message,) = check("from ddpq.schemas import JobOut\n", "ddpq.core.units")
    assert "'the core is pure decisions'" in message


def test_third_party_in_an_only_list_does_not_let_ddpq_modules_in() -> None:
    assert check("import psutil\nfrom ddpq.jobdir import JobDir\n", "ddpq.executors.base") == []
    (message,) = check("from ddpq.store import jobs\n", "ddpq.executors.base")
    assert "ddpq.store.jobs" in message and "an executor" in message


def test_the_rule_table_is_the_one_the_checker_reads() -> None:
    imports = imports_of("import rich\n", "ddpq.client.x")
    strict = Rule("no rich", applies_to=("ddpq.client",), only=(STDLIB,))
    assert list(violations(imports, [CLIENT_RULE])) == []
    assert [v.rule for v in violations(imports, [strict])] == [strict]


@pytest.mark.parametrize(
    ("pattern", "module", "covered"),
    [
        ("ddpq.store", "ddpq.store", True),
        ("ddpq.store", "ddpq.store.users", True),
        ("ddpq.store", "ddpq.storehouse", False),
        ("*.shim", "ddpq.worker.shim", True),
        ("*.shim", "ddpq.executors.local.shim", True),
        ("*.shim", "ddpq.worker.shimmer", False),
    ],
)
def test_covers(pattern: str, module: str, covered: bool) -> None:
    assert covers(pattern, module) is covered
