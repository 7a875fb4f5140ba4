"""``python -m ddpq.sim.links --trace FILE --topology FILE``: how well linked the GPU sets
that multi-GPU jobs got are, placed first-free versus by the topology (issue 24).

    python -m ddpq.sim.links --trace ../shared/traces/tiresias_60_job.csv \\
        --topology bench/topologies/pairs8.json --policy fifo

The same trace is replayed twice through the real planner: once placing the first free
GPUs (what ddpq did before it knew links), once with the box's links known to the placer
(``core.scheduler.placers.BestConnected``). Each start of a job on 2 or more GPUs counts:
``nvlink``: every GPU of its set has an NVLink partner in the set (a 2-GPU job on an NVLink
pair); ``one_node``: no link in the set crosses sockets (all within a NUMA node).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ddpq.core.policy import DEFAULT_POLICY, Policy
from ddpq.core.topology import CLASSES, NO_HARDWARE, Hardware, TopologyError, parse_fake
from ddpq.sim import report, trace
from ddpq.sim.replay import replay


def linked(hw: Hardware, gpus: Sequence[int]) -> bool:
    """Every GPU of the set has an NVLink partner in it."""
    return all(any(b != a and hw.link_rank(a, b) == 0 for b in gpus) for a in gpus)


def count(starts: list[tuple[int, ...]], hw: Hardware) -> dict[str, Any]:
    """Of the starts of multi-GPU jobs that are not the whole box: how many got a linked
    set and how many stayed within one NUMA node, by job size."""
    by_size: dict[int, dict[str, int]] = {}
    for gpus in starts:
        row = by_size.setdefault(len(gpus), {"starts": 0, "nvlink": 0, "one_node": 0})
        row["starts"] += 1
        row["nvlink"] += linked(hw, gpus)
        row["one_node"] += hw.worst(gpus) <= CLASSES.index("NODE")
    return {str(k): v for k, v in sorted(by_size.items())}


def compare(jobs: list[trace.TraceJob], gpus: int, policy: Policy, hw: Hardware) -> dict[str, Any]:
    out: dict[str, Any] = {"policy": policy.value, "gpus": gpus}
    for name, placer_sees in (("first_free", NO_HARDWARE), ("topology", hw)):
        result = replay(jobs, gpus, policy, hardware=placer_sees)
        starts = [g for j in result.jobs for g in j.placed if 2 <= len(g) < gpus]
        fig = report.figures(result)
        out[name] = {
            "by_size": count(starts, hw),
            "mean_jct": fig["mean_jct"],
            "makespan": fig["makespan"],
        }
    return out


def table(row: dict[str, Any]) -> str:
    lines = [
        f"policy {row['policy']}, {row['gpus']} GPUs",
        "| placement | GPUs/job | starts | NVLink-paired set | within one NUMA node | mean JCT |",
        "|---|---|---|---|---|---|",
    ]
    for name in ("first_free", "topology"):
        part = row[name]
        for size, c in part["by_size"].items():
            lines.append(
                f"| {name} | {size} | {c['starts']} | {c['nvlink']} | {c['one_node']} | "
                f"{part['mean_jct']:.0f} s |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m ddpq.sim.links", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--trace", type=Path, required=True)
    ap.add_argument("--topology", type=Path, required=True, help="a --fake-topology JSON file")
    names = [p.value for p in Policy] + ["default"]
    ap.add_argument("--policy", choices=names, default="default")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    try:
        jobs = trace.read(args.trace)
        text = args.topology.read_text()
        # The trace's jobs never ask more than the box has; the file names its GPUs.
        fake = parse_fake(text, len(json.loads(text).get("gpus", [])))
    except (trace.TraceError, TopologyError, OSError, ValueError, AttributeError) as exc:
        print(f"ddpq.sim.links: {exc}", file=sys.stderr)
        return 2
    policy = DEFAULT_POLICY if args.policy == "default" else Policy(args.policy)
    row = compare(jobs, len(fake.gpus), policy, fake.hardware())
    print(json.dumps(row, indent=2) if args.json else table(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
