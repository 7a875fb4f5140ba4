"""The web page's script (issue 26, item 14), its own functions run by Node where it is
installed: the sweep plot's ticks at round numbers (0.1/0.2/0.3, 4/6/8), not the range cut
in equal parts (0.0952/0.3214, 4.4/7.8); links to a job's log and to a sweep (#job-12,
#sweep-3)."""

from __future__ import annotations

import itertools
import json
import math
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from ddpq.server.routes.meta import STATIC

NODE = shutil.which("node")
pytestmark = pytest.mark.skipif(NODE is None, reason="needs node to run the page's script")


def page_function(name: str) -> str:
    source = (Path(STATIC) / "sweeps.js").read_text()
    found = re.search(rf"^function {name}\(.*?^}}\n", source, re.S | re.M)
    assert found, name
    return found.group(0)


def run_node(script: str) -> str:
    """What ``script`` prints, run by Node (a script that never ends fails the test)."""
    assert NODE is not None
    out = subprocess.run(
        [NODE, "-e", script], capture_output=True, text=True, check=True, timeout=30
    )
    return out.stdout


def ticks(lo: float, hi: float, count: int) -> dict[str, object]:
    script = (
        page_function("niceTicks")
        + page_function("tickText")
        + f"const a = niceTicks({lo!r}, {hi!r}, {count});"
        + "console.log(JSON.stringify({...a, text: a.ticks.map((t) => tickText(t, a.digits))}));"
    )
    result: dict[str, object] = json.loads(run_node(script))
    return result


@pytest.mark.parametrize(
    ("lo", "hi", "count", "text"),
    [
        (0.0952, 0.3214, 4, ["0.0", "0.1", "0.2", "0.3", "0.4"]),
        (4.4, 7.8, 5, ["4", "5", "6", "7", "8"]),
        (1, 10, 5, ["0", "2", "4", "6", "8", "10"]),
        (0.1, 0.9, 4, ["0.0", "0.2", "0.4", "0.6", "0.8", "1.0"]),
        (-1.3, 2.2, 4, ["-2", "-1", "0", "1", "2", "3"]),
        (0.981, 0.9983333333333333, 4, ["0.980", "0.985", "0.990", "0.995", "1.000"]),
        (1200, 98000, 4, ["0", "50000", "100000"]),
    ],
)
def test_ticks_are_round_numbers_around_the_data(
    lo: float, hi: float, count: int, text: list[str]
) -> None:
    axis = ticks(lo, hi, count)
    assert axis["text"] == text
    values = axis["ticks"]
    assert isinstance(values, list)
    assert values[0] <= lo and values[-1] >= hi  # the data is inside the axis
    steps = {round(b - a, 9) for a, b in itertools.pairwise(values)}
    assert len(steps) == 1  # evenly spaced
    step = steps.pop()
    mantissa = step / 10 ** math.floor(math.log10(step))
    assert round(mantissa, 6) in (1, 2, 5)


@pytest.mark.parametrize(
    ("lo", "hi"),
    [
        (0, 1e-120),
        (1e-300, 2e-300),
        (-1e308, 1e308),
        (5, 5),
        (1e15, 1e15 + 1),
        (2.0**54, 2.0**54 + 4),  # past 2^53 a step no longer moves the count: it never ended
        (1e17, 1e17 + 16),
    ],
)
def test_ticks_of_any_range_a_job_can_write_never_throw(lo: float, hi: float) -> None:
    """A member writes {"loss": 0} then {"loss": 1e-120}: the axis is drawn (toFixed takes
    at most 100 digits, and its RangeError stopped the page's refresh for whoever looked)."""
    axis = ticks(lo, hi, 4)
    values, text = axis["ticks"], axis["text"]
    assert isinstance(values, list) and len(values) >= 2
    assert isinstance(text, list) and all(isinstance(t, str) and t for t in text)


def test_the_extent_of_hundreds_of_thousands_of_points() -> None:
    """Five thousand records of 60 members: one pass, where Math.min(...points) overflowed
    the stack."""
    script = page_function("extent") + (
        "const v = Array.from({length: 300000}, (_, i) => (i * 7919) % 100003 - 5);"
        "console.log(JSON.stringify(extent(v)));"
    )
    assert json.loads(run_node(script)) == [-5, 99997]


def app_source() -> str:
    return (Path(STATIC) / "app.js").read_text()


def app_function(name: str) -> str:
    found = re.search(rf"^function {name}\(.*?^}}\n", app_source(), re.S | re.M)
    assert found, name
    return found.group(0)


@pytest.mark.parametrize(
    ("address", "opened"),
    [
        ("#job-12", ["log", 12]),
        ("#sweep-3", ["sweep", 3]),
        ("#job-", None),
        ("#job-12x", None),
        ("#job--1", None),
        ("#sweep-1e3", None),
        ("#job-99999999999999999999", None),
        ("#jobs-1", None),
        ("", None),
    ],
)
def test_an_address_opens_a_jobs_log_or_a_sweep(address: str, opened: list[object] | None) -> None:
    """The page links what is open (#job-12, #sweep-3); opening such a link opens it, and
    anything else in the address opens nothing."""
    link = re.search(r"^const LINK = .*;$", app_source(), re.M)
    assert link
    script = (
        link.group(0)
        + f"const location = {{ hash: {json.dumps(address)} }}; let got = null;"
        + "const openLog = (id) => { got = ['log', id]; };"
        + "const openSweep = (id) => { got = ['sweep', id]; };"
        + app_function("followAddress")
        + "followAddress(); console.log(JSON.stringify(got));"
    )
    assert NODE is not None
    out = subprocess.run([NODE, "-e", script], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == opened


def test_opening_and_closing_put_the_link_in_the_address_and_take_it_out() -> None:
    for name in ("app.js", "sweeps.js"):
        source = (Path(STATIC) / name).read_text()
        assert source.count("showInAddress(`#") == 1 and source.count("leaveAddress(`#") == 1
