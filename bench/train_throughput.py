"""Training throughput: the seed tutorial's DDP program against ddpq's ResNet18 workload.

Both train ResNet18 (ImageNet stem, as the seed) with 2 ranks and 64 images per rank per step
on the same synthetic CIFAR-format files, written once to a temporary folder. The programs run
alternately, ``--repeats`` times each, so that a change in the machine's load hits all of
them; the table gives every run's training images/s (start-up and the first step not counted)
and the ratio of the medians.

    python bench/train_throughput.py                 # CPU, gloo: about 5 minutes on 2 cores
    python bench/train_throughput.py --device cuda   # GPUs, NCCL; adds a "best images/s" run
                                                     # (--stem cifar, bf16, --best-batch per GPU)

On the CPU each ddpq rank gets OMP_NUM_THREADS=1 (what ddpq's worker sets: cores / ranks),
while the seed keeps torch's defaults, as it has when run by hand: each of its ranks starts
one thread per core, so 2 ranks oversubscribe 2 cores. A third row, the seed with
OMP_NUM_THREADS=1, shows how much of the difference that alone accounts for.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from machine import cpu_model, free_port

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src"
sys.path.insert(0, str(SRC))

from ddpq.workloads.cifar import write_cifar10  # noqa: E402

RUN_TIMEOUT_S = 600


@dataclass
class Program:
    name: str
    argv: list[str]
    env: dict[str, str]
    data_dir: str
    results: list[float] = field(default_factory=list)

    def shown(self) -> str:
        env = " ".join(f"{k}={v}" for k, v in self.env.items() if k != "DDPQ_JOB_DIR")
        argv = ["python" if a == sys.executable else a for a in self.argv]
        text = shlex.join(argv).replace(self.data_dir, "$DATA").replace(f"{REPO}/", "")
        text = text.replace("'{port}'", "$PORT")
        return f"{env} {text}".strip()


def gpu_names() -> str:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return "none visible"
    names = [n.strip() for n in out.splitlines() if n.strip()]
    return f"{len(names)} x {names[0]}" if names else "none visible"


def base_env() -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_PORT", "OMP_NUM_THREADS")
    }
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SRC), env.get("PYTHONPATH")) if p)
    return env


def run_seed(prog: Program, work: Path) -> float:
    env = {**base_env(), **prog.env, "MASTER_PORT": str(free_port())}
    out = run(prog.argv, env)
    for line in out.splitlines():
        if line.startswith("seed_baseline: train images/s:"):
            return float(line.split(":")[2].split()[0])
    raise SystemExit(f"{prog.name}: no throughput line in its output:\n{out[-3000:]}")


def run_ddpq(prog: Program, work: Path) -> float:
    job_dir = Path(tempfile.mkdtemp(prefix="job-", dir=work))
    env = {**base_env(), **prog.env, "DDPQ_JOB_DIR": str(job_dir)}
    argv = [a if a != "{port}" else str(free_port()) for a in prog.argv]
    out = run(argv, env)
    metrics = job_dir / "metrics.jsonl"
    epochs = [json.loads(x) for x in metrics.read_text().splitlines()] if metrics.exists() else []
    epochs = [r for r in epochs if r.get("phase") == "epoch"]
    if not epochs:
        raise SystemExit(f"{prog.name}: no epoch record in {metrics}:\n{out[-3000:]}")
    return float(epochs[-1]["images_per_s"])


def run(argv: list[str], env: dict[str, str]) -> str:
    proc = subprocess.run(
        argv,
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    if proc.returncode != 0:
        raise SystemExit(f"failed ({proc.returncode}): {shlex.join(argv)}\n{proc.stdout[-3000:]}")
    return proc.stdout


def torchrun(nproc: int, workload_args: list[str]) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "1",
        "--nproc-per-node",
        str(nproc),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        "{port}",
        "-m",
        "ddpq.workloads.resnet18",
        *workload_args,
    ]


def programs(args: argparse.Namespace, data_dir: Path) -> list[Program]:
    """The seed, (on the CPU) the seed with one thread per rank, ddpq, (on CUDA) ddpq's best."""
    cpu = args.device == "cpu"
    seed = Program(
        "seed (bench/seed_baseline.py)",
        [
            sys.executable,
            str(REPO / "bench" / "seed_baseline.py"),
            "--data-dir",
            str(data_dir),
            "--device",
            args.device,
            "--world-size",
            str(args.nproc),
            "--batch-size",
            str(args.batch_size),
            "--max-steps",
            str(args.seed_steps),
        ],
        {},
        str(data_dir),
    )
    # Reference, not a target: how far thread placement alone takes the seed on the CPU.
    seed_one_thread = Program(
        "seed, OMP_NUM_THREADS=1 (reference)",
        [*seed.argv[:-1], str(args.steps)],
        {"OMP_NUM_THREADS": "1"},
        str(data_dir),
    )
    common = ["--data-dir", str(data_dir), "--device", args.device, "--epochs", "1"]
    common += ["--no-eval", "--checkpoint-every", "0"]
    ddpq = Program(
        "ddpq (ddpq.workloads.resnet18)",
        torchrun(
            args.nproc,
            [
                *common,
                *("--stem", "imagenet", "--batch-size", str(args.batch_size)),
                *("--max-steps-per-epoch", str(args.steps)),
            ],
        ),
        {"OMP_NUM_THREADS": "1"} if cpu else {},
        str(data_dir),
    )
    best = None
    if not cpu:
        best = Program(
            "ddpq best (--stem cifar, bf16)",
            torchrun(
                args.nproc,
                [
                    *common,
                    *("--stem", "cifar", "--batch-size", str(args.best_batch)),
                    *("--max-steps-per-epoch", str(args.best_steps)),
                ],
            ),
            {},
            str(data_dir),
        )
    return [seed, seed_one_thread, ddpq] if cpu else [seed, ddpq, *([best] if best else [])]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--repeats", type=int, default=3, help="runs of each program (default 3)")
    p.add_argument("--nproc", type=int, default=None, help="ranks (default: 2 on CPU, all GPUs)")
    p.add_argument("--batch-size", type=int, default=64, help="per rank, both programs")
    p.add_argument("--steps", type=int, default=None, help="ddpq steps per run")
    p.add_argument("--seed-steps", type=int, default=None, help="seed steps per run")
    p.add_argument("--best-batch", type=int, default=512, help="cuda: per-GPU batch, best run")
    p.add_argument("--best-steps", type=int, default=150, help="cuda: steps of the best run")
    p.add_argument("--train-images", type=int, default=None)
    args = p.parse_args()
    cuda = args.device == "cuda"
    if args.nproc is None:
        args.nproc = max(1, gpu_count()) if cuda else 2
    # CPU defaults bound the run: the seed is slow there, so it gets fewer (timed) steps.
    args.steps = args.steps or (300 if cuda else 25)
    args.seed_steps = args.seed_steps or (300 if cuda else 6)
    if args.train_images is None:
        need = args.nproc * max(args.batch_size * max(args.steps, args.seed_steps), 0)
        if cuda:
            need = max(need, args.nproc * args.best_batch * args.best_steps)
        args.train_images = need + 1000
    return args


def gpu_count() -> int:
    import torch

    return int(torch.cuda.device_count())


def main() -> int:
    args = parse_args()
    started = dt.datetime.now(dt.UTC).replace(microsecond=0)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="ddpq-bench-") as tmp:
        work = Path(tmp)
        t0 = time.perf_counter()
        write_cifar10(work / "cifar", args.train_images, 1000, seed=0)
        print(
            f"wrote {args.train_images} synthetic CIFAR-format images in "
            f"{time.perf_counter() - t0:.1f} s",
            file=sys.stderr,
        )
        data_dir = work / "cifar"
        progs = programs(args, data_dir)
        timed = [p for p in progs if not p.name.startswith("ddpq best")]
        for i in range(args.repeats):
            for prog in timed:
                t = time.perf_counter()
                runner = run_seed if prog.name.startswith("seed") else run_ddpq
                prog.results.append(runner(prog, work))
                print(
                    f"[{i + 1}/{args.repeats}] {prog.name}: {prog.results[-1]:.1f} images/s "
                    f"({time.perf_counter() - t:.0f} s wall)",
                    file=sys.stderr,
                )
        for prog in progs:
            if prog.name.startswith("ddpq best"):
                prog.results.append(run_ddpq(prog, work))
        report(args, started, load_before, progs)
    return 0


def report(
    args: argparse.Namespace,
    started: dt.datetime,
    load_before: tuple[float, float, float],
    progs: list[Program],
) -> None:
    import torch

    medians = {p.name: statistics.median(p.results) for p in progs}
    seed, ddpq = medians[progs[0].name], medians["ddpq (ddpq.workloads.resnet18)"]
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load_after = os.getloadavg()
    print("## ResNet18 training throughput: seed tutorial vs ddpq workload\n")
    print(f"- date: {started.isoformat()}")
    print(f"- machine: {cpu_model()}, {cores} cores; GPUs: {gpu_names()}")
    print(f"- torch {torch.__version__}, python {platform.python_version()}")
    print(
        f"- load average (1 min) before/after: {load_before[0]:.2f} / {load_after[0]:.2f} "
        "(other processes on the machine count against every program)"
    )
    print(
        f"- data: {args.train_images} synthetic CIFAR-format images ($DATA, a temp dir); "
        f"world size {args.nproc}, {args.batch_size} images/rank/step, ImageNet stem, "
        f"{'gloo on CPU' if args.device == 'cpu' else 'NCCL on GPU'}"
    )
    print(
        "- images/s = images of all ranks / wall time from the end of step 1 to the end of "
        "the last step; runs alternate between the programs"
    )
    command = shlex.join(["python", "bench/train_throughput.py", *sys.argv[1:]])
    print(f"- command: `{command}`")
    print()
    print("| program | command | images/s per run | median images/s |")
    print("|---|---|---|---|")
    for prog in progs:
        runs = ", ".join(f"{r:.1f}" for r in prog.results)
        print(f"| {prog.name} | `{prog.shown()}` | {runs} | {medians[prog.name]:.1f} |")
    print()
    print(f"**ddpq / seed (medians): {ddpq / seed:.2f}x**")
    for prog in progs[1:]:
        if prog.name.startswith("seed"):
            print(f"\nddpq / {prog.name}: {ddpq / medians[prog.name]:.2f}x")


if __name__ == "__main__":
    sys.exit(main())
