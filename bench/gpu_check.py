"""`make gpu-check`: every CUDA path ddpq has, tried once on a machine with an NVIDIA GPU.

    python bench/gpu_check.py [--out gpu-check.json]

Writes ONE file (JSON) and prints a summary; under 8 minutes on one GPU; needs nothing from
the network (the training data is synthetic, written here). Steps, each recorded with
``ok`` and what was measured, or the error that stopped it (a failed step does not stop
the others):

1. ``discovery``: what NVML says through ddpq (``worker.devices.discover``): each GPU's
   model, memory, links, NUMA node and MIG instances;
2. ``resnet18``: the built-in ResNet18 workload under ddpq on one GPU (batch 64, ImageNet
   stem, synthetic CIFAR-format data) and its images/s, beside the seed tutorial's program
   (``bench/seed_baseline.py``) run as it launches itself (``mp.spawn``), same data;
3. ``sharing``: two jobs sharing one GPU by memory (``--gpu-mem``), both running at once,
   each holding GPU memory; the peaks the worker measured through NVML;
4. ``fence``: a job on one GPU cannot open another GPU's device file (char 195:N, made with
   mknod where none exists: the cgroup device program answers EPERM, a missing device
   ENXIO), and CUDA works under the renumbered ``CUDA_VISIBLE_DEVICES``;
5. ``outside``: a process started outside ddpq that holds GPU memory is seen by NVML and
   shown on the GPU (``ddpq gpus``).

Where there is no NVIDIA GPU (no driver, no NVML, no device) it says "no NVIDIA GPU here",
writes that to the file and exits 0.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "bench"))

from machine import free_port  # noqa: E402

from ddpq.client.api import JsonApi  # noqa: E402
from ddpq.worker.devices import DevicesUnavailable, discover  # noqa: E402

STEPS_IMAGES = 64 * 200  # 200 steps of 64 images
HOLD_MIB = 2048  # what each sharing job and the outside process hold on the GPU
NO_GPU = "no NVIDIA GPU here"


def no_gpu_reason() -> str | None:
    """Why this machine cannot be checked (None: it has an NVIDIA GPU NVML can see)."""
    try:
        gpus = discover(None)
    except DevicesUnavailable as exc:
        return str(exc)
    return None if gpus else "NVML sees no GPU"


def wait(check: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.2)


@contextlib.contextmanager
def daemon(work: Path) -> Iterator[JsonApi]:
    """``ddpq serve`` on this machine's real GPUs (NVML), sampled every second."""
    port = free_port()
    argv = [sys.executable, "-m", "ddpq", "serve", "--home", str(work / "home")]
    argv += ["--port", str(port), "--gpu-poll", "1s", "--grace", "2s"]
    if os.geteuid() == 0:
        argv.append("--allow-root")
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    log = open(work / "daemon.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
    api = JsonApi(f"http://127.0.0.1:{port}")
    try:
        wait(lambda: _healthy(api) or proc.poll() is not None, 60, "the daemon")
        if proc.poll() is not None:
            raise RuntimeError(f"ddpq serve ended: {(work / 'daemon.log').read_text()[-2000:]}")
        yield api
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(30)
        if proc.poll() is None:
            proc.kill()
        log.close()


def _healthy(api: JsonApi) -> bool:
    try:
        api.health()
    except Exception:  # not up yet (refused, reset, 503)
        return False
    return True


def run_job(api: JsonApi, body: dict[str, Any], timeout: float = 240) -> dict[str, Any]:
    job = api.submit(body)
    done: dict[str, Any] = wait(
        lambda: (j := api.show(job["id"]))["state"] in ("succeeded", "failed", "cancelled",
                                                        "timed_out") and j,
        timeout,
        f"job {job['id']}",
    )  # fmt: skip
    return done


def output_of(job: dict[str, Any]) -> str:
    return (Path(job["job_dir"]) / "output.log").read_text(errors="replace")


def step_discovery(_: Path, __: JsonApi) -> dict[str, Any]:
    gpus = discover(None)
    return {"ok": bool(gpus), "gpus": [asdict(g) for g in gpus]}


def step_resnet18(work: Path, api: JsonApi) -> dict[str, Any]:
    from ddpq.workloads.cifar import write_cifar10

    data = work / "cifar"
    write_cifar10(data, STEPS_IMAGES + 1000, 1000, seed=0)
    args = ["--data-dir", str(data), "--device", "cuda", "--epochs", "1", "--no-eval"]
    args += ["--checkpoint-every", "0", "--stem", "imagenet", "--batch-size", "64"]
    args += ["--max-steps-per-epoch", str(STEPS_IMAGES // 64)]
    job = run_job(api, {"workload": "resnet18", "args": args, "gpus": 1, "cwd": str(work)})
    metrics = Path(job["job_dir"]) / "metrics.jsonl"
    lines = metrics.read_text().splitlines() if metrics.exists() else []
    epochs = [r for r in map(json.loads, lines) if r.get("phase") == "epoch"]
    ddpq_ips = float(epochs[-1]["images_per_s"]) if epochs else None
    seed = [sys.executable, str(REPO / "bench" / "seed_baseline.py"), "--data-dir", str(data)]
    seed += ["--device", "cuda", "--world-size", "1", "--batch-size", "64"]
    seed += ["--max-steps", str(STEPS_IMAGES // 64)]
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "MASTER_PORT": str(free_port())}
    out = subprocess.run(seed, env=env, capture_output=True, text=True, timeout=300, check=False)
    seed_ips = None
    for line in out.stdout.splitlines():
        if line.startswith("seed_baseline: train images/s:"):
            seed_ips = float(line.split(":")[2].split()[0])
    return {
        "ok": job["state"] == "succeeded" and ddpq_ips is not None and seed_ips is not None,
        "ddpq_images_per_s": ddpq_ips,
        "seed_images_per_s": seed_ips,
        "ratio": ddpq_ips / seed_ips if ddpq_ips and seed_ips else None,
        "job": {k: job.get(k) for k in ("id", "state", "reason", "leases")},
        "seed_tail": (out.stdout + out.stderr)[-1500:] if seed_ips is None else None,
        "ddpq_tail": output_of(job)[-1500:] if ddpq_ips is None else None,
    }


HOLD = (
    "import os, time, torch\n"
    "x = torch.empty({mib} << 20, dtype=torch.uint8, device='cuda'); x.fill_(1)\n"
    "torch.cuda.synchronize(); print('holding', os.environ['CUDA_VISIBLE_DEVICES'], flush=True)\n"
    "time.sleep({hold_s})\n"
)


def step_sharing(work: Path, api: JsonApi) -> dict[str, Any]:
    code = HOLD.format(mib=HOLD_MIB, hold_s=15)
    body = {"command": [sys.executable, "-c", code], "gpus": 1, "gpu_mem": "6G"}
    ids = [api.submit({**body, "cwd": str(work), "name": f"share{i}"})["id"] for i in (1, 2)]
    both = wait(
        lambda: all(api.show(i)["state"] == "running" for i in ids), 120, "both to run at once"
    )
    jobs = [wait(lambda i=i: (j := api.show(i))["state"] == "succeeded" and j, 120, "end")
            for i in ids]  # fmt: skip
    gpus = [j["leases"]["gpus"] for j in jobs]
    peaks = [j.get("peak_mem") for j in jobs]
    return {
        "ok": bool(both) and gpus[0] == gpus[1] and all(p and p >= HOLD_MIB << 20 for p in peaks),
        "gpus": gpus,
        "held_mib_each": HOLD_MIB,
        "peak_mem_bytes": peaks,
    }


FENCE = """
import errno, glob, json, os, re, stat, tempfile, torch
def try_open(path):
    try:
        os.close(os.open(path, os.O_RDWR))
        return "opened"
    except OSError as exc:
        return errno.errorcode[exc.errno]
nodes = {int(re.sub("[^0-9]", "", p)): p for p in glob.glob("/dev/nvidia[0-9]*")}
# A GPU minor no GPU here has: the fence answers EPERM, the kernel alone ENXIO.
spare = os.path.join(tempfile.mkdtemp(), "nvidia63")
try:
    os.mknod(spare, stat.S_IFCHR | 0o600, os.makedev(195, 63))
    nodes[63] = spare
except OSError as exc:
    print("RESULT", json.dumps({"mknod_63": errno.errorcode[exc.errno]}))
x = torch.ones(4, device="cuda:0") * 2
print("RESULT", json.dumps({"open": {m: try_open(p) for m, p in sorted(nodes.items())},
      "cuda_count": torch.cuda.device_count(), "cuda_sum": float(x.sum()),
      "visible": os.environ.get("CUDA_VISIBLE_DEVICES")}))
"""


def step_fence(work: Path, api: JsonApi) -> dict[str, Any]:
    """The job may open its own GPU's device file and no other (EPERM); CUDA works."""
    blocker = None
    if len(discover(None)) > 1:  # a job on the second GPU shows the renumbering
        code = HOLD.format(mib=64, hold_s=40)
        blocker = api.submit({"command": [sys.executable, "-c", code], "gpus": 1,
                              "cwd": str(work)})["id"]  # fmt: skip
        wait(lambda: api.show(blocker)["state"] == "running", 60, "the blocker")
    body = {"command": [sys.executable, "-c", FENCE], "gpus": 1, "cwd": str(work)}
    done = run_job(api, body, 180)
    if blocker is not None:
        api.cancel(blocker)
    text = output_of(done)
    found: dict[str, Any] = {}
    for line in text.splitlines():
        if line.startswith("RESULT "):
            found.update(json.loads(line[len("RESULT ") :]))
    leased = done["leases"]["gpus"]
    fenced = "GPUs fenced per job" in (work / "daemon.log").read_text(errors="replace")
    opened = found.get("open", {})
    mine = all(opened.get(str(g)) == "opened" for g in leased)
    others = [v for m, v in opened.items() if int(m) not in leased]
    denied = bool(others) and all(v == "EPERM" for v in others)
    return {
        "ok": done["state"] == "succeeded"
        and mine
        and (denied or not fenced)
        and found.get("cuda_sum") == 8.0
        and found.get("cuda_count") == 1,
        "daemon_says_fenced": fenced,
        "leased": leased,
        "job": found,
        "tail": None if found else text[-1500:],
    }


def step_outside(work: Path, api: JsonApi) -> dict[str, Any]:
    code = HOLD.format(mib=512, hold_s=60)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "0"}
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, cwd=work)
    try:

        def seen() -> dict[str, Any] | None:
            for d in api.devices()["items"]:
                if any(p["pid"] == proc.pid for p in d.get("external_processes") or []):
                    return dict(d)
            return None

        gpu = wait(seen, 90, "NVML to show the outside process")
        return {"ok": True, "pid": proc.pid, "gpu": gpu["index"], "status": gpu["status"]}
    finally:
        proc.kill()
        proc.wait()


STEPS = {
    "discovery": step_discovery,
    "resnet18": step_resnet18,
    "sharing": step_sharing,
    "fence": step_fence,
    "outside": step_outside,
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path("gpu-check.json"))
    args = ap.parse_args(argv)
    report: dict[str, Any] = {
        "started": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "python": platform.python_version(),
    }
    why = no_gpu_reason()
    if why is not None:
        report.update(gpu=False, reason=why)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
        print(f"gpu-check: {NO_GPU} ({why}); nothing to check. Wrote {args.out}")
        return 0
    report["gpu"] = True
    with tempfile.TemporaryDirectory(prefix="ddpq-gpu-check-") as tmp:
        work = Path(tmp)
        try:
            with daemon(work) as api:
                for name, step in STEPS.items():
                    t = time.monotonic()
                    try:
                        report[name] = step(work, api)
                    except Exception as exc:
                        report[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
                    report[name]["seconds"] = round(time.monotonic() - t, 1)
                    print(f"gpu-check: {name}: {'ok' if report[name]['ok'] else 'FAILED'}")
        except Exception as exc:
            report["daemon"] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        log = work / "daemon.log"
        report["daemon_log_tail"] = log.read_text(errors="replace")[-4000:] if log.exists() else ""
    args.out.write_text(json.dumps(report, indent=2, default=str) + "\n")
    failed = [k for k, v in report.items() if isinstance(v, dict) and v.get("ok") is False]
    print(f"gpu-check: {'all passed' if not failed else 'FAILED: ' + ', '.join(failed)}; "
          f"wrote {args.out}")  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
