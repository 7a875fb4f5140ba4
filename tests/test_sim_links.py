"""``python -m ddpq.sim.links``: placements compared on a modelled 8-GPU box (issue 24)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddpq.core.policy import Policy
from ddpq.core.topology import parse_fake
from ddpq.sim import links
from ddpq.sim.trace import TraceJob

BOX = Path(__file__).resolve().parents[1] / "bench" / "topologies" / "pairs8.json"


def test_topology_placement_gets_pairs_first_free_does_not() -> None:
    hw = parse_fake(BOX.read_text(), 8).hardware()
    # A 1-GPU job on GPU 0 first; first-free then gives the 2-GPU job 1,2 (no NVLink).
    jobs = [
        TraceJob(0, 1, 0.0, 100.0),
        TraceJob(1, 2, 1.0, 50.0),
        TraceJob(2, 4, 2.0, 50.0),
    ]
    row = links.compare(jobs, 8, Policy.FIFO, hw)
    assert row["first_free"]["by_size"]["2"] == {"starts": 1, "nvlink": 0, "one_node": 1}
    assert row["topology"]["by_size"]["2"] == {"starts": 1, "nvlink": 1, "one_node": 1}
    assert row["topology"]["by_size"]["4"] == {"starts": 1, "nvlink": 1, "one_node": 1}
    assert row["first_free"]["by_size"]["4"]["one_node"] == 0  # 3,4,5,6 crosses sockets


def test_command_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("job_id,num_gpu,submit_time,duration\n0,2,0,10\n")
    assert links.main(["--trace", str(trace), "--topology", str(BOX), "--policy", "fifo"]) == 0
    assert "| topology | 2 | 1 | 1 | 1 |" in capsys.readouterr().out
    bad = tmp_path / "bad.json"
    bad.write_text('{"gpus": [{"index": 0}], "links": {"0-1": "NV1"}}')
    assert links.main(["--trace", str(trace), "--topology", str(bad)]) == 2
    assert "two different GPUs below 1" in capsys.readouterr().err
