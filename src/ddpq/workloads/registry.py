"""Built-in workloads by name: how a submission's arguments become a command.

Torch-free on purpose: the daemon validates a workload's arguments with the
workload's own argument parser without importing torch.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # `ddpq submit` reads WORKLOADS' names: no argparse, no dataclasses
    import argparse


class BadWorkload(ValueError):
    pass


# A plain class: a dataclass imports ``inspect`` (~5 ms), a NamedTuple compiles each
# (string) annotation; `ddpq submit` and `ddpq ls` are typed in shell loops.
class Workload:
    __slots__ = ("module", "name", "parser", "summary")

    def __init__(
        self,
        name: str,
        module: str,
        parser: Callable[[], argparse.ArgumentParser],
        summary: str,
    ) -> None:
        self.name = name
        self.module = module
        self.parser = parser
        self.summary = summary


def _resnet18_parser() -> argparse.ArgumentParser:
    from ddpq.workloads.resnet18_cli import build_parser

    return build_parser()


WORKLOADS = {
    "resnet18": Workload(
        "resnet18",
        "ddpq.workloads.resnet18",
        _resnet18_parser,
        "DDP ResNet18 on CIFAR-10 (synthetic data with --synthetic N)",
    ),
}


def resolve(name: str, args: list[str]) -> list[str]:
    """The torchrun command (after torchrun's own options) for workload ``name``."""
    workload = WORKLOADS.get(name)
    if workload is None:
        known = ", ".join(sorted(WORKLOADS))
        raise BadWorkload(f"no workload {name!r}; the built-in workloads are: {known}")
    parser = workload.parser()
    parser.prog = f"ddpq submit {name}"
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            parser.parse_args(args)
    except SystemExit:
        lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
        message = lines[-1] if lines else "invalid arguments"
        raise BadWorkload(message.split(": error: ", 1)[-1]) from None
    return ["-m", workload.module, *args]
