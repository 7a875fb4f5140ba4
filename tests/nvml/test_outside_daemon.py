"""Outside GPU use end to end: a daemon on the fake NVML library, where a process of this
test's (its PID listed on GPU 0) holds a GPU outside the queue. The real worker loop
discovers it, reads its owner from /proc, and `ddpq gpus`, /metrics and `ddpq usage` name
that account and count its GPU time."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers import Daemon, wait_for


@pytest.fixture
def holder() -> Iterator[int]:
    """A process of this test's account, as the "notebook" NVML reports on GPU 0."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    yield proc.pid
    proc.kill()
    proc.wait()


def outside_seconds(d: Daemon, account: str) -> float:
    text = httpx.get(d.url + "/metrics", timeout=10).text
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "ddpq_outside_gpu_seconds_total" and s.labels["account"] == account:
                return float(s.value)
    return 0.0


def test_an_outside_process_is_named_and_its_gpu_time_counted(
    make_daemon: Callable[..., Daemon], fake_nvml_dir: Path, holder: int
) -> None:
    me = pwd.getpwuid(os.getuid()).pw_name
    d = make_daemon(
        LD_LIBRARY_PATH=str(fake_nvml_dir), FAKE_NVML_GPUS="2", FAKE_NVML_PROCS=f"0:{holder}:1024"
    )
    devices = json.loads(d.cli("gpus", "--json").stdout)["items"]
    (proc,) = devices[0]["external_processes"]
    assert devices[0]["status"] == "external"
    assert (proc["pid"], proc["uid"], proc["account"]) == (holder, os.getuid(), me)
    # Without --auth an account is the ddpq user of its name.
    assert proc["user"] == me
    assert f"{me}: pid {holder}" in d.cli("gpus", COLUMNS="200").stdout
    # The first look is a sample (5 s); each later one (every 5 s) adds to it.
    first = outside_seconds(d, me)
    assert first >= 5.0
    wait_for(lambda: outside_seconds(d, me) > first, 30, "a second sample of outside use")
    report = json.loads(d.cli("usage", "--json").stdout)
    mine = next(r for r in report["rows"] if r["key"] == me)
    assert mine["kind"] == "user" and mine["gpu_hours_outside"] > 0
    assert mine["gpu_hours_jobs"] == 0 and report["outside_use"] == "count"
