"""The web page in a real headless Chromium, against a real daemon.

Needs Debian's chromium (/usr/bin/chromium) and the `playwright` Python package; Playwright's
own browser download is not used (`playwright install` is never run).
"""

from __future__ import annotations

import getpass
import json
import os
import pwd
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from ddpq.schemas import JobSubmit
from ddpq.store import users as user_store
from ddpq.store.db import Database
from tests.helpers import Daemon

CHROMIUM = Path("/usr/bin/chromium")
try:
    from playwright.sync_api import Browser, Page, expect, sync_playwright
except ImportError:  # pragma: no cover - CI installs it; this keeps the reason readable
    sync_playwright = None  # type: ignore[assignment]

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        sync_playwright is None, reason="the playwright package is not installed (pip install)"
    ),
    pytest.mark.skipif(
        not CHROMIUM.exists(), reason="no /usr/bin/chromium (apt-get install chromium)"
    ),
]

ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
# The page polls every second and the machine may be slow: generous, but still a bound.
WAIT_MS = 20_000


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """One Chromium for the module (a launch is about a second of CPU); each test's page
    has a context of its own: no storage, cookies or cache shared between tests."""
    assert sync_playwright is not None
    with sync_playwright() as pw:
        launched = pw.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    try:
        pg = context.new_page()
        pg.set_default_timeout(WAIT_MS)
        expect.set_options(timeout=WAIT_MS)
        errors: list[str] = []
        pg.on("pageerror", lambda exc: errors.append(str(exc)))
        yield pg
        assert not errors, f"JavaScript errors on the page: {errors}"
    finally:
        context.close()


def test_page_shows_queue_gpus_progress_and_log(daemon: Daemon, page: Page, tmp_path: Path) -> None:
    page.goto(daemon.url)
    expect(page.locator("#gpus .gpu")).to_have_count(4)
    expect(page.locator('#gpus .gpu[data-status="free"]')).to_have_count(4)

    # The page groups job states as the daemon does (GET /v1/meta/states), with no lists of
    # its own: a held job is listed, as waiting.
    served = httpx.get(daemon.url + "/v1/meta/states").json()
    groups = page.evaluate(
        "() => ({active: [...ui.states.active], waiting: [...ui.states.waiting],"
        " terminal: [...ui.states.terminal]})"
    )
    assert groups == {g: served[g] for g in ("active", "waiting", "terminal")}
    with daemon.client() as c:
        held = c.submit(JobSubmit(command=["true"], hold=True, name="held"))
    held_row = page.locator(f'#queue-body tr[data-job-id="{held.id}"]')
    expect(held_row).to_have_attribute("data-state", "held")
    expect(held_row.locator("td").nth(7)).to_contain_text("waiting")

    # The job prints, reports training progress the way the resnet18 workload does, and then
    # runs until the test says so (a file appears), so "running" lasts as long as the test needs.
    go = tmp_path / "go"
    progress = {
        "phase": "train",
        "epoch": 2,
        "epochs": 4,
        "step": 20,
        "steps": 100,
        "train_loss": 1.234,
        "test_acc": 0.5,
        "images_per_s": 2345.6,
        "eta_s": 95,
    }
    script = (
        "echo hello-from-job; echo '<b>not bold</b>'; "
        f'echo {shlex.quote(json.dumps(progress))} >> "$DDPQ_JOB_DIR/metrics.jsonl"; '
        f"while [ ! -e {shlex.quote(str(go))} ]; do sleep 0.05; done # <img src=x onerror=boom()>"
    )
    with daemon.client() as c:
        job = c.submit(JobSubmit(command=["sh", "-c", script], gpus=2, name="web"))

    row = page.locator(f'#queue-body tr[data-job-id="{job.id}"]')
    expect(row).to_have_attribute("data-state", "running")
    expect(row.locator("td").nth(2)).to_have_text(getpass.getuser())
    leased = page.locator('#gpus .gpu[data-status="leased"]')
    expect(leased).to_have_count(2)
    for i in range(2):
        expect(leased.nth(i)).to_have_attribute("data-job-id", str(job.id))
    with daemon.client() as c:
        port = c.show(job.id).leases.port
    assert port is not None
    expect(row.locator("td").nth(5)).to_have_text(str(port))
    expect(leased.first).to_contain_text(f"port {port}")
    # Epoch 2 of 4, step 20 of 100: 1.2 of 4 epochs done.
    expect(row.locator(".bar")).to_have_attribute("aria-valuenow", "30")
    expect(row.locator(".progress-text")).to_have_text(
        "epoch 2/4 · loss 1.234 · acc 50.0% · 2346 img/s · ETA 1m35s"
    )

    row.click()
    log = page.locator("#log")
    expect(log).to_contain_text("hello-from-job")
    # Job output and job text are shown as text, never parsed as HTML.
    expect(log).to_contain_text("<b>not bold</b>")
    expect(page.locator("#log b")).to_have_count(0)
    expect(page.locator("#log-meta")).to_contain_text("<img src=x onerror=boom()>")
    expect(page.locator("#log-meta img")).to_have_count(0)
    expect(page.locator("#log-state")).to_have_text("running")
    page.screenshot(path=tmp_path / "page.png", full_page=True)  # for a look: pytest keeps it

    go.touch()
    expect(row).to_have_attribute("data-state", "succeeded")
    expect(page.locator("#log-state")).to_have_text("succeeded")
    expect(page.locator('#gpus .gpu[data-status="free"]')).to_have_count(4)
    expect(log).to_contain_text("hello-from-job")  # the pane keeps the output after the end


def test_page_asks_for_a_token_and_keeps_it(make_daemon: Callable[..., Daemon], page: Page) -> None:
    d = make_daemon("--fake-gpus", "4", "--auth")
    db = Database(d.home / "ddpq.db")
    try:
        with db.write() as s:
            _, token = user_store.add_user(
                s, "alice", admin=False, unix_user=getpass.getuser(), now=time.time()
            )
    finally:
        db.dispose()

    page.goto(d.url)
    banner = page.locator("#banner")
    expect(banner).to_be_visible()
    expect(banner).to_contain_text("needs a token")
    expect(page.locator("#gpus .gpu")).to_have_count(0)

    page.fill("#token-input", "ddpq_wrong")
    page.click("#token-save")
    expect(banner).to_contain_text("rejected this token")

    page.fill("#token-input", token)
    page.click("#token-save")
    expect(banner).to_be_hidden()
    expect(page.locator("#whoami")).to_have_text("signed in as alice")
    expect(page.locator("#gpus .gpu")).to_have_count(4)

    with d.client(token) as c:
        job = c.submit(JobSubmit(command=["true"]))
    row = page.locator(f'#queue-body tr[data-job-id="{job.id}"]')
    expect(row).to_have_attribute("data-state", "succeeded")

    # The token survives a reload (localStorage) and is never echoed into the page.
    page.reload()
    expect(page.locator(f'#queue-body tr[data-job-id="{job.id}"]')).to_be_visible()
    expect(banner).to_be_hidden()
    assert token not in page.content()

    page.click("#token-forget")
    expect(banner).to_contain_text("needs a token")


def test_page_shows_a_sweep_as_a_table_and_a_plot_that_follows_its_members(
    make_daemon: Callable[..., Daemon], page: Page, tmp_path: Path
) -> None:
    # Its three members run at once, each holding one CPU core: three, whatever the host.
    daemon = make_daemon("--fake-gpus", "4", "--grace", "1s", "--cpu-capacity", "3")
    # Each member writes two epochs of metrics, waits for the test, then writes a third.
    go = shlex.quote(str(tmp_path / "go"))
    line = '{"epoch": %s, "test_acc": 0.{k}%s, "loss": %s.5}'
    script = (
        f"echo '{{tag}}'; for e in 1 2; do echo \"$(printf '{line}' $e $e $e)\" "
        '>> "$DDPQ_JOB_DIR/metrics.jsonl"; done; '
        f"while [ ! -e {go} ]; do sleep 0.05; done; "
        f'echo "$(printf \'{line}\' 3 3 3)" >> "$DDPQ_JOB_DIR/metrics.jsonl"'
    )
    body = {
        "template": {"command": ["sh", "-c", script], "name": "web-sweep"},
        "params": {"k": ["1", "2", "3"], "tag": ["<img src=x onerror=boom()>"]},
    }
    r = httpx.post(daemon.url + "/v1/sweeps", json=body)
    assert r.status_code == 201, r.text
    sweep_id = r.json()["id"]
    members = [m["id"] for m in httpx.get(f"{daemon.url}/v1/sweeps/{sweep_id}").json()["members"]]

    page.goto(daemon.url)
    # The queue folds the sweep into one row; the sweeps list names it.
    folded = page.locator(f'#queue-body tr[data-sweep-id="{sweep_id}"]')
    expect(folded).to_have_count(1)
    expect(folded).to_contain_text("web-sweep (3)")
    for job_id in members:
        expect(page.locator(f'#queue-body tr[data-job-id="{job_id}"]')).to_have_count(0)
    expect(page.locator(f'#sweeps-body tr[data-sweep-id="{sweep_id}"]')).to_contain_text("3")

    folded.click()
    expect(page.locator("#sweep-section")).to_be_visible()
    expect(page.locator("#sweep-title")).to_have_text(f"Sweep {sweep_id} · web-sweep")
    rows = page.locator("#sweep-body tr")
    expect(rows).to_have_count(3)
    for i, job_id in enumerate(members):
        expect(rows.nth(i)).to_have_attribute("data-job-id", str(job_id))
        expect(rows.nth(i).locator("td.params")).to_contain_text(f"k={i + 1}")
    # What a user chose is shown as text, never parsed as markup.
    expect(rows.first.locator("td.params")).to_contain_text("<img src=x onerror=boom()>")
    expect(page.locator("#sweep-section img")).to_have_count(0)

    # One line per member, two epochs each so far; test_acc is plotted first.
    expect(page.locator("#sweep-metric")).to_have_value("test_acc")
    lines = page.locator("#sweep-plot path.series")
    expect(lines).to_have_count(3)
    expect(page.locator('#sweep-plot path.series[data-points="2"]')).to_have_count(3)
    for job_id in members:
        expect(page.locator(f'#sweep-plot path.series[data-job-id="{job_id}"]')).to_have_count(1)
    expect(rows.nth(2).locator("td.metric")).to_have_text("0.3200")

    # Highest accuracy first, then the other metric, as the page lets one choose.
    page.click("#sweep-sort")
    expect(rows.first.locator("td.params")).to_contain_text("k=3")
    expect(page.locator("#sweep-sort")).to_contain_text("▼")
    page.select_option("#sweep-metric", "loss")
    expect(page.locator('#sweep-plot path.series[data-points="2"]')).to_have_count(3)
    page.select_option("#sweep-metric", "test_acc")

    # Each member writes a new line: the plot follows, live.
    (tmp_path / "go").touch()
    expect(page.locator('#sweep-plot path.series[data-points="3"]')).to_have_count(3)
    expect(page.locator('#sweep-body tr[data-state="succeeded"]')).to_have_count(3)
    expect(folded).to_have_attribute("data-state", "succeeded")
    page.screenshot(path=tmp_path / "sweep.png", full_page=True)  # for a look: pytest keeps it


def test_page_names_whose_outside_processes_they_are(
    make_daemon: Callable[..., Daemon], page: Page, tmp_path: Path
) -> None:
    from tests.nvml.conftest import _compile

    lib = _compile(tmp_path / "nvml")
    notebook = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        d = make_daemon(
            LD_LIBRARY_PATH=str(lib), FAKE_NVML_GPUS="2", FAKE_NVML_PROCS=f"1:{notebook.pid}:512"
        )
        page.goto(d.url)
        card = page.locator('#gpus .gpu[data-status="external"]')
        expect(card).to_have_count(1)
        me = pwd.getpwuid(os.getuid()).pw_name
        expect(card.locator(".gpu-outside")).to_have_text(f"not ddpq: {me} pid {notebook.pid}")
    finally:
        notebook.kill()
        notebook.wait()
