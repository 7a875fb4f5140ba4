"""A stop asked for while the daemon is still starting is a stop, not lost.

Between the line that says where the API listens and uvicorn taking the signals over, the
daemon builds its app and freezes its start-up heap (daemon.heap): up to a second. A
SIGTERM there was swallowed, and the daemon served on until killed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import free_port


@pytest.mark.parametrize("command", ["serve", "server"])
def test_a_sigterm_as_the_api_comes_up_stops_the_daemon(tmp_path: Path, command: str) -> None:
    args = [sys.executable, "-m", "ddpq", command, "--home", str(tmp_path / "home")]
    args += ["--port", str(free_port()), "--fake-gpus", "1"]
    if os.geteuid() == 0:
        args.append("--allow-root")
    daemon = subprocess.Popen(
        args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
    )
    try:
        assert daemon.stderr is not None
        seen = []
        for line in daemon.stderr:  # ends if the daemon does: then the assert says why
            seen.append(line.decode(errors="replace"))
            if "API on http://" in seen[-1]:
                break
        assert "API on http://" in "".join(seen[-1:]), "".join(seen)
        daemon.send_signal(signal.SIGTERM)  # at once: inside the start-up window
        daemon.stderr.close()
        assert daemon.wait(30) == 0
    finally:
        if daemon.poll() is None:
            os.killpg(daemon.pid, signal.SIGKILL)
            daemon.wait()
