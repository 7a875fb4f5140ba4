"""``python -m ddpq.sim --trace FILE --gpus N --policy NAME [--json]``: replay a trace.

    python -m ddpq.sim --trace ../shared/traces/tiresias_60_job.csv --gpus 8 --policy las
    python -m ddpq.sim --generate 500 --seed 1 --policy fifo --policy fairshare --policy las
    python -m ddpq.sim --generate 500 --seed 1 --write-trace heavy.csv   # the trace itself
    python -m ddpq.sim --lab 400 --reports-progress 0.7 --policy las --policy srpt-progress \
        --policy oracle
    python -m ddpq.sim --lab 400 --elastic-share 0.5 --policy las --policy srpt-progress

``--policy`` repeats to compare policies on the same trace; ``default`` is what the daemon
does out of the box, ``oracle`` SRPT on true remaining times (the bound). No policy sees a
job's duration: a job with ``reports_progress`` writes its fraction done every
``--progress-interval`` seconds. ``--predict``: each job's start as the daemon predicts it
at submission, against its actual start (jobs without a ``time_limit`` get one, as users
overstate them: ``trace.mark_limits``), with every estimate and from time limits alone.
``--elastic-share``: that share of multi-GPU jobs elastic (docs/elastic.md; ``sim.elastic``),
from the GPUs they ask for to twice as many, working (n/MIN)**``--speedup-exponent`` as
fast on n. Figures in seconds; ``--json`` for scripts.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ddpq.core.policy import DEFAULT_POLICY
from ddpq.core.preempt import Guards
from ddpq.sim import report, trace
from ddpq.sim.elastic import SPEEDUP_EXPONENT
from ddpq.sim.replay import POLICIES, PROGRESS_INTERVAL_S, replay


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m ddpq.sim", description=__doc__.split("\n")[0])
    source = ap.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--trace", type=Path, help="CSV: job_id,num_gpu,submit_time,duration[,user]"
    )
    source.add_argument("--generate", type=int, metavar="N", help="N jobs, heavy-tailed durations")
    source.add_argument("--lab", type=int, metavar="N", help="N jobs: users rerunning workloads")
    ap.add_argument("--seed", type=int, default=1, help="for --generate/--lab and the marks")
    ap.add_argument("--load", type=float, default=0.9, help="--generate/--lab: offered load")
    ap.add_argument("--write-trace", type=Path, help="write the (generated) trace here and stop")
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--policy", action="append", choices=[*POLICIES, "default"])
    ap.add_argument("--preemptible", type=float, default=1.0, metavar="FRACTION")
    ap.add_argument(
        "--reports-progress",
        type=float,
        metavar="FRACTION",
        help="this fraction of jobs report progress (replaces the trace's column)",
    )
    ap.add_argument("--progress-interval", type=float, default=PROGRESS_INTERVAL_S, metavar="S")
    ap.add_argument(
        "--progress-error",
        type=float,
        default=0.0,
        metavar="E",
        help="each job's progress is off by a factor in 1 +- E (a wrong step count)",
    )
    ap.add_argument("--restart-cost", type=float, default=Guards.restart_cost_s, metavar="S")
    ap.add_argument("--min-run", type=float, default=Guards.min_run_s, metavar="S")
    ap.add_argument("--max-preemptions", type=int, default=Guards.max_preemptions)
    ap.add_argument(
        "--elastic-share",
        type=float,
        metavar="FRACTION",
        help="this fraction of multi-GPU jobs elastic, MIN..2xMIN GPUs (or the gpus_max column)",
    )
    ap.add_argument(
        "--speedup-exponent",
        type=float,
        default=SPEEDUP_EXPONENT,
        metavar="A",
        help="an elastic job on n GPUs works (n/MIN)**A as fast (default: %(default)s)",
    )
    ap.add_argument(
        "--elastic-grow",
        choices=("empty-queue", "idle"),
        default="empty-queue",
        help="grow only when nobody waits, or into GPUs no queued job can start on now",
    )
    ap.add_argument("--predict", action="store_true", help="measure the predicted starts")
    ap.add_argument("--json", action="store_true")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    fractions = (
        args.preemptible,
        0.0 if args.reports_progress is None else args.reports_progress,
        0.0 if args.elastic_share is None else args.elastic_share,
    )
    if args.gpus < 1 or not all(0 <= f <= 1 for f in fractions):
        ap.error(
            "--gpus must be at least 1, --preemptible, --reports-progress and "
            "--elastic-share in 0..1"
        )
    if not 0 < args.speedup_exponent <= 1:
        ap.error("--speedup-exponent must be in (0, 1]: more GPUs never slow a job")
    if not 0 < args.progress_interval < float("inf"):
        ap.error("--progress-interval must be a positive number of seconds")
    if not 0 <= args.progress_error < 1:
        ap.error("--progress-error must be at least 0 and less than 1")
    try:
        if args.trace:
            jobs = trace.read(args.trace)
        elif args.lab is not None:
            jobs = trace.lab(args.lab, args.seed, gpus=args.gpus, load=args.load)
        else:
            jobs = trace.generate(args.generate, args.seed, gpus=args.gpus, load=args.load)
    except trace.TraceError as exc:
        print(f"ddpq.sim: {exc}", file=sys.stderr)
        return 2
    if args.reports_progress is not None:
        jobs = trace.mark_progress(jobs, args.reports_progress, args.seed)
    if args.elastic_share is not None:
        jobs = trace.mark_elastic(jobs, args.elastic_share, args.seed)
    if args.write_trace:
        trace.write(jobs, args.write_trace)
        return 0
    jobs = trace.mark_preemptible(jobs, args.preemptible, args.seed)
    jobs = trace.mark_limits(jobs, args.seed) if args.predict else jobs
    guards = Guards(args.min_run, args.max_preemptions, args.restart_cost)
    rows = []
    for name in args.policy or ["default"]:
        policy = DEFAULT_POLICY.value if name == "default" else name
        result = replay(
            jobs,
            args.gpus,
            policy,
            guards,
            progress_interval_s=args.progress_interval,
            progress_error=args.progress_error,
            predict=args.predict,
            speedup_exponent=args.speedup_exponent,
            grow_beside_queue=args.elastic_grow == "idle",
        )
        rows.append(report.figures(result))
    if args.json:
        print(json.dumps(rows if len(rows) > 1 else rows[0], indent=2))
    else:
        print(report.table(rows))
        if args.predict:
            print()
            print(report.start_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
