"""What an in-process API request costs the test suite, on Starlette's transport and on the
one the suite's clients use (tests/asgi_transport.py), measured in one run.

    python bench/inprocess_requests.py [--requests 300] [--rounds 2]

Each round, each transport in turn: a client on an app as the suite lends it
(tests/inprocess.py) with two fake GPUs, then ``--requests`` times a ``/healthz``, a job
submission and that job's detail. Prints this process's CPU (all its threads: the test's and
the app's) per request of each kind.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

from machine import ROOT, machine_line, python_c_pass_ms

sys.path.insert(0, str(ROOT))

from fastapi.testclient import TestClient
from tests.inprocess import BASE, lend, lent_client, publish_fake_gpus
from tests.template_db import migrated, remove_template

from ddpq.config import Settings

KINDS = ("healthz", "submission", "a job's detail")


def starlettes_client(home: Path) -> TestClient:
    """The same lent app behind Starlette's own transport."""
    config = Settings(home=home, fake_gpus=2)
    migrated(config.db_path)
    return TestClient(lend(config), base_url=BASE, raise_server_exceptions=False)


def measure(client: TestClient, home: Path, requests: int) -> list[float]:
    with client as c:
        publish_fake_gpus(home / "ddpq.db", 2, memory_mb=1000)
        job = {"command": ["true"], "gpus": 1}
        for _ in range(10):  # the app's first requests build its routes' validators
            c.get("/healthz")
            c.post("/v1/jobs", json=job)
        costs = []
        began = time.process_time()
        for _ in range(requests):
            c.get("/healthz")
        costs.append(time.process_time() - began)
        began = time.process_time()
        ids = [c.post("/v1/jobs", json=job).json()["id"] for _ in range(requests)]
        costs.append(time.process_time() - began)
        began = time.process_time()
        for job_id in ids:
            c.get(f"/v1/jobs/{job_id}")
        costs.append(time.process_time() - began)
    return [1000 * cost / requests for cost in costs]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    print(machine_line())
    print(f"python -c pass: {python_c_pass_ms():.1f} ms")
    options = f"--requests {args.requests} --rounds {args.rounds}"
    print(f"command: python bench/inprocess_requests.py {options}\n")
    print("| round | transport | " + " | ".join(f"{kind} (ms of CPU)" for kind in KINDS) + " |")
    print("|---|---|" + "---|" * len(KINDS))
    for round_ in range(1, args.rounds + 1):
        for name in ("Starlette's", "one crossing"):
            home = Path(tempfile.mkdtemp(prefix="ddpq-inprocess-"))
            if name == "Starlette's":
                client = starlettes_client(home)
            else:
                client = lent_client(home, fake_gpus=2)
            try:
                costs = measure(client, home, args.requests)
            finally:
                shutil.rmtree(home, ignore_errors=True)
            print(f"| {round_} | {name} | " + " | ".join(f"{ms:.2f}" for ms in costs) + " |")
    remove_template()


if __name__ == "__main__":
    main()
