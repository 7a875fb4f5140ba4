"""A job that records what ddpq gave it: its env and when it ran (JSON, one file per job)."""

import json
import os
import sys
import time

start = time.time()
hold = float(sys.argv[1]) if len(sys.argv) > 1 else 0.2
out_dir = sys.argv[2] if len(sys.argv) > 2 else os.environ["DDPQ_JOB_DIR"]
deadline = start + hold
while time.time() < deadline:  # busy-free wait that still respects the deadline
    time.sleep(min(0.05, max(0.0, deadline - time.time())))
record = {
    "job": os.environ["DDPQ_JOB_ID"],
    "gpus": [g for g in os.environ["CUDA_VISIBLE_DEVICES"].split(",") if g],
    "port": os.environ.get("MASTER_PORT"),
    "order": os.environ.get("CUDA_DEVICE_ORDER"),
    "start": start,
    "end": time.time(),
}
path = os.path.join(out_dir, f"record-{record['job']}.json")
with open(path + ".tmp", "w") as f:
    json.dump(record, f)
os.replace(path + ".tmp", path)
print("recorded", path)
