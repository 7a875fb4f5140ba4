"""The client package's shape (issue 22): no import cycle among its modules, small modules
and functions.

A cycle is counted on every import statement, at module level or inside a function (a
lazy import is a dependency all the same: ``cli`` imported ``sessions`` at the top and
``sessions`` imported ``cli`` inside its commands). What the commands share is
``client.common``, which imports no command module; ``client.cli`` alone puts the commands
together.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

import pytest

from tests.test_import_rules import Import, all_imports, imports_of, modules

PACKAGE = "ddpq.client"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 80


def client_modules() -> dict[str, Path]:
    return {m: p for m, p in modules() if m.startswith(PACKAGE + ".")}


def graph(imports: Iterable[Import], names: Iterable[str]) -> dict[str, set[str]]:
    """Module -> the modules among ``names`` it imports (``from a.b import c`` is an import
    of ``a.b.c`` if that is a module, else of ``a.b``); a module's imports of itself and of
    the package above it are left out."""
    known = set(names)
    edges: dict[str, set[str]] = {name: set() for name in known}
    for imp in imports:
        if imp.module not in known:
            continue
        parts = imp.name.split(".")
        target = next(
            (".".join(parts[:n]) for n in range(len(parts), 0, -1) if ".".join(parts[:n]) in known),
            None,
        )
        if target is not None and target != imp.module:
            edges[imp.module].add(target)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Each group of modules that import each other, directly or through others (Tarjan's
    strongly connected components of more than one module), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return sorted(found)


# ---- the package ----------------------------------------------------------------------------


def test_the_client_has_no_import_cycle() -> None:
    found = cycles(graph(all_imports(), client_modules()))
    assert not found, f"modules of ddpq.client that import each other: {found}"


def test_the_shared_helpers_import_no_command() -> None:
    edges = graph(all_imports(), client_modules())
    assert "ddpq.client.cli" not in edges["ddpq.client.common"]
    assert not any("ddpq.client.cli" in targets for targets in edges.values())


@pytest.mark.parametrize("module", sorted(client_modules()))
def test_every_client_module_is_small(module: str) -> None:
    lines = len(client_modules()[module].read_text().splitlines())
    assert lines <= MAX_MODULE_LINES, f"{module}: {lines} lines (split it)"


def test_every_client_function_is_short() -> None:
    long = []
    for module, path in client_modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    long.append(f"{module}.{node.name}: {length} lines")
    assert not long, long


def test_the_command_line_is_the_one_entry_mounts_in_the_order_help_lists() -> None:
    from ddpq import entry
    from ddpq.client import cli, common

    assert cli.app is common.app
    assert list(entry.command_line(["ls"]).commands) == [
        "submit",
        "ls",
        "show",
        "logs",
        "cancel",
        "hold",
        "release",
        "preempt",
        "gpus",
        "watch",
        "usage",
        "history",
        "shell",
        "attach",
        "login",
        "whoami",
        "version",
        "reservations",
        "update",
        "restart",
        "token",
    ]


# ---- the checker itself -----------------------------------------------------------------


def edges_of(sources: dict[str, str]) -> dict[str, set[str]]:
    imports = [i for m, s in sources.items() for i in imports_of(s, m)]
    return graph(imports, sources)


def test_a_cycle_through_a_lazy_import_is_found() -> None:
    sources = {
        "ddpq.client.cli": "from ddpq.client import sessions\n",
        "ddpq.client.sessions": "def shell():\n    from ddpq.client import cli\n",
        "ddpq.client.format": "import json\n",
    }
    assert cycles(edges_of(sources)) == [["ddpq.client.cli", "ddpq.client.sessions"]]


def test_a_cycle_through_a_name_imported_from_a_module_is_found() -> None:
    sources = {
        "ddpq.client.draw": "def table():\n    from ddpq.client.sharing import mem_text\n",
        "ddpq.client.sharing": "from ddpq.client.draw import new_table as t\n",
    }
    assert cycles(edges_of(sources)) == [["ddpq.client.draw", "ddpq.client.sharing"]]


def test_a_longer_cycle_is_one_group_and_a_chain_is_none() -> None:
    sources = {
        "ddpq.client.a": "from ddpq.client import b\n",
        "ddpq.client.b": "import ddpq.client.c\n",
        "ddpq.client.c": "from . import a\n",
        "ddpq.client.d": "from ddpq.client import a\nimport ddpq.client\n",
    }
    assert cycles(edges_of(sources)) == [["ddpq.client.a", "ddpq.client.b", "ddpq.client.c"]]
    chain = {k: v for k, v in sources.items() if k != "ddpq.client.c"}
    assert cycles(edges_of(chain)) == []
