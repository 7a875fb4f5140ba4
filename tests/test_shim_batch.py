"""How the shim starts a batch job (``executors.local.shim_batch.fork_job``): started by
``subprocess`` or forked, a command that cannot run is said the same, to the log and to
the shim that records the job's end."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from ddpq.executors.local import shim_batch

# Forked where a launcher must ignore the preemption signal; started by subprocess else.
STARTS = {"subprocess": (None, False), "fork": (signal.SIGUSR1, True)}


@pytest.fixture
def output() -> Iterator[tuple[int, int]]:
    out_r, out_w = os.pipe()
    yield out_r, out_w
    os.close(out_r)
    shim_batch.STARTED.clear()


def finish(pid: int, out: tuple[int, int]) -> tuple[int, bytes]:
    """The job's exit code, and what it wrote."""
    os.close(out[1])
    _, status = os.waitpid(pid, 0)
    chunks = []
    while chunk := os.read(out[0], 65536):
        chunks.append(chunk)
    return os.waitstatus_to_exitcode(status), b"".join(chunks)


@pytest.mark.parametrize("start", sorted(STARTS))
@pytest.mark.parametrize(
    ("program", "why"),
    [
        ("/no/such/program", "No such file or directory"),
        ("no-such-command-on-path", "No such file or directory"),
        ("{script}", "Permission denied"),
        ("/etc", "Permission denied"),
    ],
)
def test_a_command_that_cannot_run_is_said_however_it_was_started(
    output: tuple[int, int], start: str, program: str, why: str, tmp_path: Path
) -> None:
    preempt_with, shield = STARTS[start]
    script = tmp_path / "train.sh"  # no execute bit: refused to root too
    script.write_text("#!/bin/sh\necho hi\n")
    program = program.format(script=script)
    pid, said = shim_batch.fork_job([program, "--x"], output[1], preempt_with, shield)
    code, log = finish(pid, output)
    assert said == f"cannot run {program!r}: {why}"
    assert code == shim_batch.NOT_RUN_EXIT
    assert f"ddpq: {said}\n".encode() in log


@pytest.mark.parametrize("start", sorted(STARTS))
def test_a_command_that_runs_has_nothing_said(output: tuple[int, int], start: str) -> None:
    preempt_with, shield = STARTS[start]
    pid, said = shim_batch.fork_job(["sh", "-c", "echo ran"], output[1], preempt_with, shield)
    code, log = finish(pid, output)
    assert (said, code, log) == (None, 0, b"ran\n")
