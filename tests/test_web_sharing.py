"""The web page's GPUs shared by memory and its reservations, in a real headless Chromium."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from playwright.sync_api import Page, expect

from ddpq.schemas import JobSubmit
from tests.helpers import Daemon, wait_state
from tests.test_web import browser, page, pytestmark  # noqa: F401 - the fixtures and the skips

G = 1 << 30


def test_page_shows_shared_gpus_and_reservations(
    make_daemon: Callable[..., Daemon],
    page: Page,  # noqa: F811 - the fixture from test_web
    tmp_path: Path,
) -> None:
    d = make_daemon("--fake-gpus", "2", "--grace", "1s")
    page.goto(d.url)
    expect(page.locator("#gpus .gpu")).to_have_count(2)
    expect(page.locator("#reservations-section")).to_be_hidden()
    go = tmp_path / "go"
    wait = ["sh", "-c", f"while [ ! -e {go} ]; do sleep 0.05; done"]
    with d.client() as c:
        a = c.submit(JobSubmit(command=wait, gpu_mem="5G", name="small")).id
        b = c.submit(JobSubmit(command=wait, gpu_mem="3G", name="smaller", owner="bob")).id
        wait_state(c, a, "running")
        wait_state(c, b, "running")
    shared = page.locator('#gpus .gpu[data-status="shared"]')
    expect(shared).to_have_count(1)
    expect(shared.locator(".gpu-share")).to_have_count(2)
    expect(shared.locator(f'.gpu-share[data-job-id="{b}"]')).to_have_text(f"job {b} · bob · 3G")
    expect(shared).to_contain_text("8G reserved")
    row = page.locator(f'#queue-body tr[data-job-id="{a}"]')
    expect(row.locator("td").nth(4)).to_have_text("1 [0] · -/5G")
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "ddpq",
            "admin",
            "reserve",
            "--gpus",
            "1",
            "--user",
            "alice",
            "--start",
            "+1h",
            "--end",
            "+2h",
            "--home",
            str(d.home),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    expect(page.locator("#reservations-section")).to_be_visible()
    rows = page.locator("#reservations-body tr")
    expect(rows).to_have_count(1)
    expect(rows.first.locator("td").nth(1)).to_have_text("alice")
    expect(rows.first.locator("td").nth(5)).to_have_text("to come")
    go.touch()
    expect(page.locator('#gpus .gpu[data-status="free"]')).to_have_count(2)
