"""The shim's stderr is its job's log (``spawn``); a rewrite of the log under its cap
(``CappedLog.compact``) moves that stderr to the new file, and leaves any other alone."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

# Run in a process of its own: it moves descriptor 2, which pytest's capture holds here.
SHIM_LIKE = """
import os, sys
from ddpq.executors.local.shim_log import CappedLog
path, stderr_is_log = sys.argv[1], sys.argv[2] == "1"
if stderr_is_log:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(fd, 2)
    os.close(fd)
log = CappedLog(path, 4096)
os.write(2, b"before the rewrite\\n")
for i in range(400):
    log.write(b"line %d of the job's output\\n" % i)
os.write(2, b"after the rewrite\\n")
log.close()
"""


@pytest.mark.parametrize("stderr_is_log", [True, False])
def test_what_the_shim_says_after_a_rewrite_is_in_the_new_log(
    tmp_path: Path, stderr_is_log: bool
) -> None:
    log = tmp_path / "output.log"
    run = subprocess.run(
        [sys.executable, "-c", SHIM_LIKE, str(log), "1" if stderr_is_log else "0"],
        capture_output=True,
        timeout=60,
        check=True,
    )
    text = log.read_text()
    assert "log over its cap" in text  # it was rewritten (more than once)
    if stderr_is_log:
        assert "after the rewrite" in text and run.stderr == b""
    else:  # a shim started by hand: its stderr stays its own
        assert "the rewrite" not in text
        assert run.stderr == b"before the rewrite\nafter the rewrite\n"
