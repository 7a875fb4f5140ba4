"""What a training process pays before its first step: importing torch, and the
``torch._dynamo`` that ``torch.optim`` imports whether or not anything is compiled.

    python bench/torch_import.py [--runs 3]

Each run a new interpreter: the CPU (user + system) of ``import torch``, then of
``import torch._dynamo``, then whether building an SGD optimiser had imported it already.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

from machine import machine_line

PROBE = """
import json, time
t = time.process_time(); import torch; torch_s = time.process_time() - t
t = time.process_time(); import torch._dynamo; dynamo_s = time.process_time() - t
print(json.dumps([torch_s, dynamo_s]))
"""
BY_OPTIM = """
import sys, torch
torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1, momentum=0.9)
print("torch._dynamo" in sys.modules)
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    runs = ap.parse_args().runs
    probe = [sys.executable, "-c", PROBE]
    samples = [
        json.loads(subprocess.run(probe, capture_output=True, check=True).stdout)
        for _ in range(runs)
    ]
    by_optim = subprocess.run([sys.executable, "-c", BY_OPTIM], capture_output=True, text=True)
    print(machine_line())
    print(f"command: python bench/torch_import.py --runs {runs}\n")
    print(f"import torch: {statistics.median(s[0] for s in samples):.2f} s of CPU (median)")
    print(f"import torch._dynamo after it: {statistics.median(s[1] for s in samples):.2f} s")
    print(f"torch.optim.SGD(...) imports torch._dynamo: {by_optim.stdout.strip()}")


if __name__ == "__main__":
    main()
