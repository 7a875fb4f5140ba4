"""A job's folder: every file ddpq reads or writes there, and the only code that opens them.

Each job has a folder of its own (``<home>/jobs/<id>``, 0700, its owner's), which the job
may write anything into: a link where its log was, a FIFO, a forged exit record, a
progress line nested 5,000 deep. So every file here is opened without following links,
must be a regular file, and is read with a bound; what the worker stores from it passes
through ``core.untrusted``. The worker, the executors and the API's log reader all go
through this module, so a file's name and the rules for opening it are written once.

The shim is started by file path with the standard library only; it is handed these
files' paths as flags (see ``executors.local.launch.shim_argv``), never their names.

What ddpq calls a job's *checkpoints* is everything in its folder but the records above
(``is_checkpoint``): whatever the job wrote to resume from, and anything else it left.
Retention removes them first, the records (the log above all) only when that is not
enough or the job is old enough; ``ddpq.daemon.sweep`` measures and removes.
"""

from __future__ import annotations

import json
import math
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from ddpq.core.rules import ExitRecord
from ddpq.core.untrusted import clean_text, nesting_depth, parse_progress

# The job's stdout and stderr, as the shim writes them (head + newest part under a cap).
LOG = "output.log"
# How the attempt ended, written atomically by the shim once the job's processes are gone.
EXIT_RECORD = "exit.json"
# Progress lines the job itself appends (the job contract): the newest good one is shown.
METRICS = "metrics.jsonl"
# The shim's own complaints (it cannot write the log, say), for an admin to read.
SHIM_ERRORS = "shim.err"
# The Slurm executor's batch script for the latest attempt, as ddpq rendered and submitted it.
SBATCH_SCRIPT = "job.sbatch"
# What Slurm itself writes for the batch step (its own notices, the shim's complaints): the
# job's output goes to LOG through the shim, which rewrites LOG under its cap.
SLURM_OUTPUT = "slurm.out"

# The records: ddpq's and the job's account of what happened. All else is checkpoints.
RECORDS = frozenset({LOG, EXIT_RECORD, METRICS, SHIM_ERRORS})

EXIT_RECORD_MAX = 64 * 1024
PROGRESS_TAIL = 16 * 1024
# How much of a log's end is read to tell a rendezvous port clash from another failure.
LOG_TAIL = 64 * 1024


@dataclass(frozen=True)
class JobDir:
    """The folder of one job and the paths of the files in it."""

    path: Path

    @property
    def log(self) -> Path:
        return self.path / LOG

    @property
    def exit_record(self) -> Path:
        return self.path / EXIT_RECORD

    @property
    def metrics(self) -> Path:
        return self.path / METRICS

    @property
    def shim_errors(self) -> Path:
        return self.path / SHIM_ERRORS

    @property
    def sbatch_script(self) -> Path:
        return self.path / SBATCH_SCRIPT

    @property
    def slurm_output(self) -> Path:
        return self.path / SLURM_OUTPUT

    def read_exit_record(self, attempt: int) -> ExitRecord | None:
        return read_exit_record(self.path, attempt)

    def read_progress(self) -> dict[str, Any] | None:
        return read_progress(self.path)

    def log_tail(self, size: int = LOG_TAIL) -> str:
        return read_regular(self.log, size, tail=True).decode(errors="replace")


def read_regular(path: Path, size: int, tail: bool = False) -> bytes:
    """Up to ``size`` bytes of ``path`` (its end with ``tail``), only if it is a regular file.

    O_NOFOLLOW and the file-type check: a job that swaps a file of its folder for a link
    must not get a root daemon to read something else; O_NONBLOCK so a FIFO cannot hang it.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return b""
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return b""
        if tail:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - size))
        return f.read(size)


def read_range(path: Path, offset: int, limit: int) -> tuple[bytes, int]:
    """``limit`` bytes of ``path`` from ``offset`` and the file's size; (b"", 0) unless it is a
    regular file (the same rules as ``read_regular``: a link in place of a log serves nothing)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return b"", 0
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return b"", 0
        if offset >= info.st_size:
            return b"", info.st_size
        f.seek(offset)
        return f.read(limit), info.st_size


def open_for_append(path: Path, owner: tuple[int, int] | None) -> BinaryIO:
    """Open a file of the job's folder for appending, handed to the job's account.

    The job owns its folder and may have put a link where its log was: O_NOFOLLOW and
    fchown on the opened file keep a root worker from writing to or giving away whatever
    such a link points at.
    """
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path} is not a regular file")
        if owner is not None:
            os.fchown(fd, *owner)
    except OSError:
        os.close(fd)
        raise
    return os.fdopen(fd, "ab")


def read_exit_record(job_dir: Path, attempt: int) -> ExitRecord | None:
    """The shim's record of how ``attempt`` ended; None if there is none (yet).

    The job can write its own folder, so the record is checked like any input: a
    record of the wrong shape counts as none (the job is then lost), never as a crash
    of the worker.
    """
    # The shim pads its record with blanks (it writes over space reserved at its start).
    raw = read_regular(job_dir / EXIT_RECORD, EXIT_RECORD_MAX).decode(errors="replace").strip()
    if not raw or nesting_depth(raw) > 2:  # the shim writes one flat object
        return None
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or str(data.get("attempt")) != str(attempt):
        return None  # missing, malformed, or left over from an earlier attempt
    code, sig, error = data.get("exit_code"), data.get("signal"), data.get("error")
    started, ended = data.get("started_at"), data.get("ended_at")
    if not all(v is None or (isinstance(v, int) and not isinstance(v, bool)) for v in (code, sig)):
        return None
    times = [v for v in (started, ended) if isinstance(v, int | float) and not isinstance(v, bool)]
    if len(times) != 2 or (error is not None and not isinstance(error, str)):
        return None
    launched = data.get("launched", True)
    if not isinstance(launched, bool):
        return None
    if not all(math.isfinite(t) for t in times) or not all(
        v is None or abs(v) < 2**31 for v in (code, sig)
    ):
        return None
    text = clean_text(error, 500) if error else None
    return ExitRecord(code, sig, float(times[0]), float(times[1]), text, launched)


def read_progress(job_dir: Path) -> dict[str, Any] | None:
    """The newest well-formed record of the job's metrics.jsonl, cleaned; None if none.

    Only the file's end is read, and each line goes through ``core.untrusted.parse_progress``:
    a job writes this file, so a hostile line is skipped, never raised.
    """
    text = read_regular(job_dir / METRICS, PROGRESS_TAIL, tail=True).decode(errors="replace")
    for line in reversed(text.splitlines()):
        record = parse_progress(line)
        if record is not None:
            return record
    return None


def is_checkpoint(name: str) -> bool:
    """An entry at the top of a job's folder that is not one of the records."""
    return name not in RECORDS
