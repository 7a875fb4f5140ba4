"""`ddpq gpus --topology`: how the GPUs are linked, drawn as `nvidia-smi topo -m` does,
from what the API says of each GPU (``links``, ``numa``, ``cpus``), and the MIG instances
each is split into."""

from __future__ import annotations

from typing import Any

from ddpq.client.format import sanitize
from ddpq.core.topology import Hardware, matrix

LEGEND = """
Legend:
  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes
  NODE = Connection traversing PCIe and the interconnect between host bridges in a NUMA node
  PHB  = Connection traversing PCIe and a PCIe host bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without the PCIe host bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  NV#  = Connection traversing a bonded set of # NVLinks
  ?    = not known (the daemon did not report it)"""


def topology_text(items: list[dict[str, Any]]) -> str:
    """The matrix of the whole GPUs, their MIG instances, and the legend."""
    whole = [d for d in items if d.get("parent") is None]
    indices = [int(d["index"]) for d in whole]
    links = {}
    for d in whole:
        for other, word in (d.get("links") or {}).items():
            a, b = int(d["index"]), int(other)
            links[(min(a, b), max(a, b))] = sanitize(str(word))
    numa = {int(d["index"]): int(d["numa"]) for d in whole if d.get("numa") is not None}
    cpus = {int(d["index"]): sanitize(str(d["cpus"])) for d in whole if d.get("cpus")}
    rows = matrix(indices, Hardware(links, "?", {}, numa), cpus)
    width = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(row, width, strict=True)).rstrip()
        for row in rows
    ]
    instances = [d for d in items if d.get("parent") is not None]
    if instances:
        lines.append("")
        lines.append("MIG instances (each a GPU of its own):")
        for d in instances:
            lines.append(
                f"  GPU{d['index']}  on GPU{d['parent']}  {sanitize(str(d.get('mig_profile')))}"
                f"  {sanitize(str(d['uuid']))}"
            )
    if not whole:
        lines = ["no GPUs", *lines]
    return "\n".join(lines) + "\n" + LEGEND
