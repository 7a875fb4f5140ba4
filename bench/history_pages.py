"""`GET /v1/history` over a long history: a page's time with and without its indexes.

    PYTHONPATH=src python bench/history_pages.py [--jobs 100000] [--runs 20]

Writes N finished jobs (an attempt each, 20 owners, the four finished states, one ending
every 30 s) into a migrated database, then asks the in-process API (``create_app`` behind
Starlette's TestClient: the route, its SQL and the JSON, not the network) for pages of 100:
everyone's newest, one owner's, one state's, and a page 50,000 rows deep by its cursor.
Then drops migration 0023h's indexes and asks again. Prints one markdown row per question.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from ddpq.config import Settings
from ddpq.server.app import create_app
from ddpq.store.db import migrate

STATES = ("succeeded", "failed", "cancelled", "timed_out")
HEADERS = {"X-Ddpq-User": "user3"}


def fill(path: Path, jobs: int) -> None:
    now = time.time()
    with sqlite3.connect(path) as conn:
        conn.executemany(
            "INSERT INTO jobs (id, name, owner, command, cwd, env, launcher, gpus, priority,"
            " max_retries, attempt, port_retries, preemptible, preempt_signal, preemptions,"
            " nodes, relaunches, user_hold, state, reason, submitted_at, started_at, ended_at,"
            " gpu_mem_auto, oom_requeues, interactive, exit_code)"
            " VALUES (?, ?, ?, '[\"true\"]', '/', '{}', 'plain', 1, 0, 0, 1, 0, 0, 'USR1', 0,"
            " 1, 0, 0, ?, 'ended', ?, ?, ?, 0, 0, 0, 0)",
            [
                (i, f"job{i % 50}", f"user{i % 20}", STATES[i % 4], e - 100, e - 60, e)
                for i in range(1, jobs + 1)
                for e in [now - (jobs - i) * 30]
            ],
        )
        conn.executemany(
            "INSERT INTO attempts (job_id, number, gpus, started_at, ended_at, state, reason,"
            " peak_ram_bytes) VALUES (?, 1, '[0]', ?, ?, ?, '', ?)",
            [(i, 0.0, 40.0, STATES[i % 4], i << 10) for i in range(1, jobs + 1)],
        )


def timed(api: TestClient, params: dict[str, Any], runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        r = api.get("/v1/history", params=params, headers=HEADERS)
        times.append((time.perf_counter() - start) * 1000)
        assert r.status_code == 200 and len(r.json()["items"]) == 100, r.text
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as home:
        settings = Settings(home=Path(home))
        migrate(settings.db_path)
        fill(settings.db_path, args.jobs)
        with TestClient(create_app(settings), base_url="http://127.0.0.1:8765") as api:
            deep = {"limit": 100}
            for _ in range(500):  # 50,000 rows down, page by page
                deep["after"] = api.get("/v1/history", params=deep, headers=HEADERS).json()["next"]
            questions = {
                "everyone's newest": {"limit": 100},
                "one owner's (--user)": {"limit": 100, "user": "user3"},
                "one state's (--state failed)": {"limit": 100, "state": "failed"},
                "50,000 rows deep (cursor)": deep,
            }
            print("| indexes | question | runs | p50 | min | max |\n|---|---|---|---|---|---|")
            for label in ("0023h's", "none (before)"):
                if label != "0023h's":
                    with sqlite3.connect(settings.db_path) as conn:
                        conn.execute("DROP INDEX ix_jobs_ended")
                        conn.execute("DROP INDEX ix_jobs_owner_ended")
                for what, params in questions.items():
                    t = timed(api, params, args.runs)
                    print(
                        f"| {label} | {what} | {len(t)} | {statistics.median(t):.1f} ms "
                        f"| {min(t):.1f} ms | {max(t):.1f} ms |"
                    )
    print(json.dumps({"jobs": args.jobs}))


if __name__ == "__main__":
    main()
