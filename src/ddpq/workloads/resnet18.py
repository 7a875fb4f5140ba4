"""DDP ResNet18 on CIFAR-10: ddpq's built-in training workload.

Run it with ``torchrun --nproc-per-node N -m ddpq.workloads.resnet18 [args]`` (one process per
device; ddpq sets MASTER_ADDR/MASTER_PORT and CUDA_VISIBLE_DEVICES) or with
``python -m ddpq.workloads.resnet18`` (world size 1, no process group).

Its contract with ddpq is argv, environment and files:

* ``$DDPQ_JOB_DIR/metrics.jsonl`` -- rank 0 appends one JSON object per line (flushed):
  ``phase`` "train" (about every 2 s of training, cumulative over the epoch so far), "epoch"
  (after each epoch and its evaluation) or "eval" (``--eval-only``), with ``epoch``, ``epochs``,
  ``step``, ``steps`` (per epoch), ``train_loss``, ``train_acc``, ``test_loss``, ``test_acc``
  (null where not measured), ``images_per_s``, ``eta_s`` and ``time`` (unix seconds). Every
  loss and accuracy is global: summed over all ranks, not one rank's last batch. Without
  ``$DDPQ_JOB_DIR`` no metrics file is written (stdout still gets a line per epoch).
  With ``$DDPQ_ATTEMPT`` set every record carries ``attempt``; the record of the step a
  preemption saved has ``"preempted": true``, and the next attempt's records continue from it
  (same epoch, next step, cumulative numbers over the whole epoch).
* ``checkpoint.pt`` in ``--checkpoint-dir`` or ``$DDPQ_JOB_DIR``: written by rank 0 after
  every ``--checkpoint-every`` epochs, and when preempted (temp file, fsync, rename); when
  present at start-up every rank loads it and training resumes where it was saved: at the next
  epoch, or at the next step of a preempted epoch (format 2, see ``checkpoint_state``), on
  any number of ranks: the global batch of the first attempt is kept, the per-rank batch
  rescaled (``resize.py``, docs/elastic.md; an elastic job's next attempt may have more or
  fewer GPUs).
* Preemption (docs/preemption.md): with ``$DDPQ_PREEMPT_SIGNAL`` set (``USR1``...), that
  signal makes the ranks agree, at their next meeting, on the step to save; rank 0 saves it
  and every rank exits ``$DDPQ_REQUEUE_EXIT`` (75). A signal during set-up (before the first
  step) exits 75 without saving (nothing was trained; the checkpoint on disk stands); during
  evaluation, at the end of that epoch with the epoch's checkpoint; after the last epoch's
  training the run just finishes (exit 0).
* Exit status: 0 done; 1 crashed; 2 unusable arguments, data or environment (one line on
  stderr); 75 preempted and saved; 143 stopped by SIGTERM (at the next point where all ranks
  agree, so none is left waiting).

Same seed, same result: the data order and the crops/flips of an epoch are a function of
(seed, epoch, rank) alone (``plan_epoch``), so a resumed epoch redraws its plan and skips the
steps already done; everything else that evolves (weights, optimizer, each rank's BatchNorm
statistics and metric sums, the RNGs) is in the checkpoint. On the CPU with a fixed thread
count a preempted and resumed run ends bit-identical to an uninterrupted one (tested, with and
without ``--deterministic``) when it resumes on as many ranks; on another number it trains on
the same images in the same global batches, with other crops and flips. On GPUs it ends as
close as two uninterrupted runs do: cuDNN's autotuning and atomic additions make those differ
in the last bits; ``--deterministic`` removes the autotuning and cuDNN's nondeterministic
kernels (the GPU path is not tested here).
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import os
import random
import signal
import sys
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO, Any, Literal

if __name__ == "__main__":
    # Run as the workload (torchrun starts each rank with -m): catch the preemption signal
    # before `import torch` takes its ~3 s. A rank inherits that signal ignored from torchrun,
    # so one sent in those seconds would be lost and the job killed after its grace period.
    from ddpq.workloads import preemption as _preemption

    _preemption.catch_early()

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ddpq.workloads import cifar, preemption, resize
from ddpq.workloads.resize import EpochSpan, Recipe, Split
from ddpq.workloads.resnet18_cli import PRETRAINED_FILENAME, PUBLISHED_WIDTH, build_parser

CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR_STD = (0.2470, 0.2435, 0.2616)
PAD = 4  # random-crop padding, as in the usual CIFAR recipe (RandomCrop(32, padding=4))
SIZE = 32
SYNC_PERIOD_S = 2.0  # how often ranks meet to reduce metrics and check for signals
CHECKPOINT_NAME = "checkpoint.pt"
CHECKPOINT_FORMAT = 2  # 2: also mid-epoch (step, per-rank state); 1 (epochs only) still read
READABLE_FORMATS = (1, 2)

EXIT_OK = 0
EXIT_CRASH = 1
EXIT_USAGE = 2
EXIT_REQUEUE = preemption.REQUEUE_EXIT  # unless $DDPQ_REQUEUE_EXIT says otherwise
EXIT_TERMINATED = 128 + signal.SIGTERM


class WorkloadError(Exception):
    """A problem the user can fix; reported as one line, exit status 2."""


class Terminated(Exception):
    """SIGTERM arrived while setting up, before the ranks could agree on stopping."""


# --------------------------------------------------------------------------- process setup


@dataclass(frozen=True)
class Cluster:
    """Where this process sits in the job."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    device: torch.device
    distributed: bool

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value not in (None, "") else default


def pick_device(choice: str, local_rank: int) -> torch.device:
    use_cuda = choice == "cuda" or (choice == "auto" and torch.cuda.is_available())
    if not use_cuda:
        return torch.device("cpu")
    count = torch.cuda.device_count()
    if count == 0:
        raise WorkloadError("--device cuda: no CUDA device is visible (CUDA_VISIBLE_DEVICES?)")
    if local_rank >= count:
        raise WorkloadError(
            f"local rank {local_rank} has no GPU: only {count} visible "
            f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')})"
        )
    return torch.device("cuda", local_rank)


def cpu_threads(requested: int, local_world_size: int) -> int:
    """Threads per rank so that the ranks on one host do not oversubscribe its cores."""
    if requested > 0:
        return requested
    omp = os.environ.get("OMP_NUM_THREADS", "")
    if omp.isdigit() and int(omp) > 0:
        return int(omp)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, (cores or 1) // max(1, local_world_size))


def start_cluster(args: argparse.Namespace) -> Cluster:
    """Join torchrun's process group (env://), or run alone when not under torchrun."""
    under_torchrun = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    rank = _env_int("RANK", 0)
    world = _env_int("WORLD_SIZE", 1)
    local_rank = _env_int("LOCAL_RANK", 0)
    local_world = _env_int("LOCAL_WORLD_SIZE", world)
    device = pick_device(args.device, local_rank)
    torch.set_num_threads(cpu_threads(args.workers, local_world))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if under_torchrun:
        backend = "nccl" if device.type == "cuda" else "gloo"
        # device_id binds the NCCL communicator to this rank's GPU up front.
        dist.init_process_group(
            backend=backend,
            init_method="env://",
            device_id=device if device.type == "cuda" else None,
        )
        rank, world = dist.get_rank(), dist.get_world_size()
    return Cluster(rank, local_rank, world, local_world, device, under_torchrun)


class StopRequest:
    """Signal handling. SIGTERM: before training it aborts set-up; during training it only
    raises a flag that the ranks reduce at their next meeting, so that all stop after the same
    step instead of one leaving the others blocked in a collective.

    The preemption signal never interrupts anything, set-up included: it raises ``preempt``,
    which the ranks reduce at their next agreement point (the first one right after set-up,
    then every meeting, then after each epoch's evaluation), so that all save the same step.
    Raising during set-up instead would let one rank leave while another already waits in a
    collective for it (DDP's first broadcast), which ends the job as a crash. When the
    preemption signal is SIGTERM itself, SIGTERM means preemption.
    """

    def __init__(self) -> None:
        self.requested = False
        self.preempt = False
        self.deferred = False
        self._previous: dict[signal.Signals, Any] = {}

    def install(self) -> None:
        self._catch(signal.SIGTERM, self._handle)

    def catch_preemption(self, sig: signal.Signals) -> None:
        # A signal noted before torch was imported (preemption.catch_early) counts too.
        self.preempt = self.preempt or preemption.came_early()
        self._catch(sig, self._handle_preempt)

    def uninstall(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _catch(self, sig: signal.Signals, handler: Any) -> None:
        previous = signal.signal(sig, handler)
        self._previous.setdefault(sig, previous)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True
        if not self.deferred:
            raise Terminated()

    def _handle_preempt(self, signum: int, frame: FrameType | None) -> None:
        self.preempt = True


# --------------------------------------------------------------------------- data

Batch = tuple[torch.Tensor, torch.Tensor]  # normalised images [B, 3, 32, 32], labels [B]


@dataclass
class DeviceData:
    """The whole dataset on the training device as uint8, augmented there batch by batch.

    Training images are stored zero-padded by PAD pixels in NHWC order, so that a random crop
    plus a horizontal flip of a whole batch is ONE gather (advanced indexing with per-image
    row and column index vectors); normalisation is one multiply-add. No per-sample Python.
    """

    train_padded: torch.Tensor  # uint8 [N, 32+2*PAD, 32+2*PAD, 3]
    train_y: torch.Tensor  # int64 [N]
    test_x: torch.Tensor  # uint8 [M, 32, 32, 3]
    test_y: torch.Tensor  # int64 [M]
    scale: torch.Tensor  # float32 [1, 3, 1, 1]: 1 / (255 * std)
    shift: torch.Tensor  # float32 [1, 3, 1, 1]: -mean / std
    channels_last: bool

    @classmethod
    def build(cls, data: cifar.Cifar10, device: torch.device, channels_last: bool) -> DeviceData:
        train = torch.from_numpy(data.train_x).to(device).permute(0, 2, 3, 1)
        padded = F.pad(train, (0, 0, PAD, PAD, PAD, PAD)).contiguous()
        test = torch.from_numpy(data.test_x).to(device).permute(0, 2, 3, 1).contiguous()
        mean = torch.tensor(CIFAR_MEAN, device=device).view(1, 3, 1, 1)
        std = torch.tensor(CIFAR_STD, device=device).view(1, 3, 1, 1)
        return cls(
            train_padded=padded,
            train_y=torch.from_numpy(data.train_y).to(device),
            test_x=test,
            test_y=torch.from_numpy(data.test_y).to(device),
            scale=1.0 / (255.0 * std),
            shift=-mean / std,
            channels_last=channels_last,
        )

    @property
    def train_size(self) -> int:
        return int(self.train_padded.shape[0])

    @property
    def test_size(self) -> int:
        return int(self.test_x.shape[0])

    def _normalise(self, nhwc: torch.Tensor) -> torch.Tensor:
        # permute() of NHWC is an NCHW tensor in channels_last layout: no copy needed for it.
        x = nhwc.permute(0, 3, 1, 2).float().mul_(self.scale).add_(self.shift)
        return x if self.channels_last else x.contiguous()

    def train_batch(self, idx: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> Batch:
        pixels = self.train_padded[idx[:, None, None], rows[:, :, None], cols[:, None, :]]
        return self._normalise(pixels), self.train_y[idx]

    def test_batch(self, idx: torch.Tensor) -> Batch:
        return self._normalise(self.test_x[idx]), self.test_y[idx]


@dataclass
class EpochPlan:
    """One rank's share of an epoch: image indices and crop/flip choices, drawn up front."""

    idx: torch.Tensor  # int64 [steps * batch]
    rows: torch.Tensor  # int64 [steps * batch, 32]
    cols: torch.Tensor  # int64 [steps * batch, 32]
    batch: int
    steps: int

    def step(self, s: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        sl = slice(s * self.batch, (s + 1) * self.batch)
        return self.idx[sl], self.rows[sl], self.cols[sl]


def epoch_images(n: int, seed: int, epoch: int, positions: range) -> torch.Tensor:
    """The images at ``positions`` of the epoch's order: one permutation on every rank
    (seeded by seed+epoch, which is what set_epoch does), wrapping past its end (resize.py)."""
    g = torch.Generator().manual_seed(seed + epoch)
    perm = torch.randperm(n, generator=g)
    where = torch.arange(positions.start, positions.stop, positions.step, dtype=torch.int64)
    return perm[where % n]


def epoch_shard(n: int, seed: int, epoch: int, rank: int, world: int) -> torch.Tensor:
    """DistributedSampler's split: padded by wrapping to a multiple of world, then strided."""
    return epoch_images(n, seed, epoch, range(rank, math.ceil(n / world) * world, world))


def plan_epoch(
    data: DeviceData, cl: Cluster, seed: int, epoch: int, split: Split, span: EpochSpan
) -> EpochPlan:
    device = data.train_padded.device
    positions = resize.rank_positions(span, split, cl.rank)
    idx = epoch_images(data.train_size, seed, epoch, positions).to(device)
    batch, steps = split.batch, span.steps
    count = idx.numel()
    g = torch.Generator(device=device).manual_seed((seed * 1_000_003 + epoch) * 1_009 + cl.rank)
    oy = torch.randint(0, 2 * PAD + 1, (count, 1), generator=g, device=device)
    ox = torch.randint(0, 2 * PAD + 1, (count, 1), generator=g, device=device)
    flip = torch.rand((count, 1), generator=g, device=device) < 0.5
    ar = torch.arange(SIZE, device=device)
    rows = oy + ar
    cols = torch.where(flip, ox + (SIZE - 1 - ar), ox + ar)
    return EpochPlan(idx, rows, cols, batch, steps)


def load_data(args: argparse.Namespace) -> tuple[cifar.Cifar10, str]:
    if args.synthetic is not None:
        data = cifar.synthetic(args.synthetic, args.seed)
        if len(data.test_x) == 0:
            raise WorkloadError(f"--synthetic {args.synthetic}: need >= 5 images for a test split")
        return data, f"synthetic ({len(data.train_x)} train / {len(data.test_x)} test)"
    data = cifar.load_cifar10(args.data_dir)
    folder = cifar.resolve_root(args.data_dir)
    return data, f"{folder} ({len(data.train_x)} train / {len(data.test_x)} test)"


# --------------------------------------------------------------------------- model


@dataclass(frozen=True)
class Architecture:
    """What a checkpoint's weights fit: the stem and the width (``--stem``, ``--width``)."""

    stem: str
    width: int

    @classmethod
    def of_checkpoint(cls, state: dict[str, Any]) -> Architecture:
        # Checkpoints from before --width were all of the published width.
        return cls(str(state["stem"]), int(state.get("width", PUBLISHED_WIDTH)))

    def describe(self) -> str:
        width = f", width {self.width}" if self.width != PUBLISHED_WIDTH else ""
        return f"stem {self.stem}{width}"


def build_model(arch: Architecture) -> nn.Module:
    # Not torchvision's: importing it costs each rank ~2 s of CPU (resnet_model's docstring).
    from ddpq.workloads.resnet_model import ResNet18

    model = ResNet18(num_classes=cifar.NUM_CLASSES, width=arch.width)
    if arch.stem == "cifar":
        # 32x32 inputs: keep full resolution into layer1 instead of dividing it by 4.
        model.conv1 = nn.Conv2d(3, arch.width, kernel_size=3, stride=1, padding=1, bias=False)
        model.maxpool = nn.Identity()
    return model


def pretrained_path(arg: str) -> Path:
    if arg:
        return Path(arg).expanduser()
    return Path(torch.hub.get_dir()) / "checkpoints" / PRETRAINED_FILENAME


def load_pretrained(model: nn.Module, arg: str) -> list[str]:
    """Copy ImageNet weights from a local file; returns the parameters left as initialised
    (the 1000-class head, and conv1 with --stem cifar). Never downloads."""
    path = pretrained_path(arg)
    if not path.is_file():
        raise WorkloadError(
            f"--pretrained: no weights file at {path}; ddpq never downloads, so copy "
            f"{PRETRAINED_FILENAME} there (or pass --pretrained PATH), or drop --pretrained"
        )
    state = torch.load(path, map_location="cpu", weights_only=True)
    own = model.state_dict()
    usable = {k: v for k, v in state.items() if k in own and own[k].shape == v.shape}
    model.load_state_dict(usable, strict=False)
    return sorted(k for k in own if k not in usable)


def param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Weight decay on conv and linear weights only: decaying BatchNorm scales and biases
    only hurts."""
    decay = [p for p in model.parameters() if p.ndim > 1]
    rest = [p for p in model.parameters() if p.ndim <= 1]
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": rest, "weight_decay": 0.0},
    ]


@dataclass(frozen=True)
class Schedule:
    """Linear warm-up to the peak LR, then cosine decay to zero at the last step."""

    peak_lr: float
    warmup_epochs: float
    epochs: int

    def lr(self, epoch: int, step: int, steps: int) -> float:
        progress = epoch + (step + 1) / steps  # in epochs, at the end of this step
        if progress <= self.warmup_epochs:
            return self.peak_lr * progress / self.warmup_epochs
        span = max(self.epochs - self.warmup_epochs, 1e-9)
        t = min(1.0, (progress - self.warmup_epochs) / span)
        return self.peak_lr * 0.5 * (1.0 + math.cos(math.pi * t))

    def state_dict(self) -> dict[str, Any]:
        return {
            "kind": "warmup_cosine",
            "peak_lr": self.peak_lr,
            "warmup_epochs": self.warmup_epochs,
            "epochs": self.epochs,
        }


def peak_lr(base_lr: float, world: int, batch: int) -> float:
    return base_lr * world * batch / 256.0


def average_bn_buffers(model: nn.Module, cl: Cluster) -> None:
    """Ranks train BatchNorm statistics on their own shards (no per-step buffer broadcast);
    averaging them before evaluating or saving makes every rank hold the same model."""
    if not cl.distributed or cl.world_size == 1:
        return
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.running_mean is not None:
            assert m.running_var is not None
            for buf in (m.running_mean, m.running_var):
                dist.all_reduce(buf)
                buf.div_(cl.world_size)


# --------------------------------------------------------------------------- metrics


class MetricsLog:
    """Rank 0's JSON-lines progress file; a no-op on other ranks or without a job dir.
    Appended to, so the records of a job's attempts follow one another."""

    def __init__(self, path: Path | None, attempt: int | None = None) -> None:
        self._file: IO[str] | None = None
        self._attempt = attempt
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = path.open("a", encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        if self._file is None:
            return
        if self._attempt is not None:
            record = {**record, "attempt": self._attempt}
        self._file.write(json.dumps(record, allow_nan=False) + "\n")
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


def record(phase: str, **values: Any) -> dict[str, Any]:
    keys = ("epoch", "epochs", "step", "steps", "train_loss", "train_acc", "test_loss")
    rec: dict[str, Any] = {"phase": phase, "time": round(time.time(), 3)}
    for k in (*keys, "test_acc", "images_per_s", "eta_s"):
        rec[k] = values.pop(k, None)
    rec.update(values)
    # A diverged run (NaN/inf loss) is reported as null: JSON has no NaN.
    return {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in rec.items()}


def log(cl: Cluster, text: str) -> None:
    if cl.is_main:
        print(text, flush=True)


# --------------------------------------------------------------------------- checkpoints


def checkpoint_path(args: argparse.Namespace) -> Path | None:
    folder = args.checkpoint_dir or os.environ.get("DDPQ_JOB_DIR")
    return Path(folder).expanduser() / CHECKPOINT_NAME if folder else None


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    """Atomic: a reader (or a resume after a crash mid-write) sees the old file or the new."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)  # make the rename itself durable
    finally:
        os.close(fd)


def load_checkpoint(path: Path) -> dict[str, Any]:
    """The checkpoint as format 2, whichever readable format the file has."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise WorkloadError(f"cannot read checkpoint {path}: {exc}") from exc
    if not isinstance(state, dict) or state.get("format") not in READABLE_FORMATS:
        formats = " or ".join(map(str, READABLE_FORMATS))
        raise WorkloadError(f"{path} is not a ddpq resnet18 checkpoint (format {formats})")
    out: dict[str, Any] = dict(state)
    if out["format"] == 1:  # saved at epoch ends only, by rank 0, with torch's RNG states
        out.update(format=2, step=0, ranks=None, data=None)
    return out


def rng_state(device: torch.device) -> dict[str, Any]:
    """Every random generator a rank has. Training itself draws from none of them (the data
    plan has its own seeded generators), but whatever does, now or later, resumes in step."""
    np_state = np.random.get_state(legacy=False)
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
        "python": random.getstate(),
        # As plain values: torch.load(weights_only=True) refuses numpy arrays.
        "numpy": {
            "key": torch.from_numpy(np_state["state"]["key"].astype(np.int64)),
            "pos": int(np_state["state"]["pos"]),
            "has_gauss": int(np_state["has_gauss"]),
            "gauss": float(np_state["gauss"]),
        },
    }


def restore_rng(state: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and state.get("cuda") is not None:
        torch.cuda.set_rng_state(state["cuda"], device)
    if state.get("python") is not None:  # format 1 had torch's only
        version, internal, gauss = state["python"]
        random.setstate((version, tuple(internal), gauss))
    if state.get("numpy") is not None:
        n = state["numpy"]
        np.random.set_state(
            {
                "bit_generator": "MT19937",
                "state": {"key": n["key"].numpy().astype(np.uint32), "pos": n["pos"]},
                "has_gauss": n["has_gauss"],
                "gauss": n["gauss"],
            }
        )


# --------------------------------------------------------------------------- training


@dataclass(frozen=True)
class Meeting:
    """What the ranks agreed on at a meeting point (global numbers)."""

    train_loss: float
    train_acc: float
    images: float  # images trained this epoch so far, all ranks
    stop: bool  # SIGTERM on some rank
    preempt: bool  # the preemption signal on some rank
    next_in: int  # steps to the next meeting


@dataclass
class Interrupted:
    """An epoch cut short at a meeting: by SIGTERM, or by preemption at step ``step``."""

    reason: Literal["terminated", "preempted"]
    step: int  # steps of the epoch done
    steps: int  # of the epoch (a resumed epoch's may differ from a whole one's)
    sums: torch.Tensor  # this rank's own metric sums so far (not reduced)
    record: dict[str, Any]  # the progress record of that step


class EpochClock:
    """Wall time of an epoch's meeting points, for step times and throughput."""

    def __init__(self, done: int = 0, images: float = 0.0) -> None:
        """``done`` steps (``images`` over all ranks) of the epoch were trained before: by the
        attempt a resumed epoch began in."""
        self.start = self.last = time.perf_counter()
        self.last_step = done
        self.base = (self.start, images)
        self.first: tuple[float, float] | None = None  # (time, images) after the first meeting
        self.end: tuple[float, float] = self.base

    def lap(self, done: int) -> tuple[int, float]:
        """Steps and seconds since the last meeting."""
        return done - self.last_step, time.perf_counter() - self.last

    def met(self, done: int, images: float) -> None:
        self.last, self.last_step = time.perf_counter(), done
        if self.first is None:
            self.first = (self.last, images)
        self.end = (self.last, images)

    def steady_rate(self) -> float:
        """Images/s over the epoch, not counting its first step (start-up, warm-up, cuDNN
        autotuning), unless that was the only one; only this attempt's steps count."""
        (t0, n0), (t1, n1) = self.first or self.base, self.end
        if n1 <= n0:
            t0, n0 = self.base
        return (n1 - n0) / max(t1 - t0, 1e-9)


@dataclass
class Trainer:
    args: argparse.Namespace
    cl: Cluster
    data: DeviceData
    model: nn.Module  # the DDP wrapper when distributed
    net: nn.Module  # the plain model (evaluation, checkpoints)
    optimizer: torch.optim.Optimizer
    schedule: Schedule
    amp: bool
    stop: StopRequest
    metrics: MetricsLog
    recipe: Recipe
    split: Split  # the recipe on these ranks: per-rank batch, steps of a whole epoch
    preempt_cfg: preemption.PreemptConfig
    start_epoch: int = 0
    resumed: EpochSpan | None = None  # the rest of a preempted epoch start_epoch
    resume: dict[str, Any] | None = None  # this rank's own state where resumed (sums...)
    resume_note: str = ""  # why a mid-epoch checkpoint could not be resumed mid-epoch
    resize_note: str = ""  # how a checkpoint of another world size was resumed
    sync_period: float = SYNC_PERIOD_S
    step_time: float = 0.0  # rank 0's estimate, seconds per step
    eval_time: float = 0.0
    last: dict[str, Any] = field(default_factory=dict)
    span: EpochSpan | None = None  # the epoch in progress

    @property
    def batch(self) -> int:
        return self.split.batch

    @property
    def steps(self) -> int:
        return self.split.steps

    def autocast(self) -> AbstractContextManager[Any]:
        if not self.amp:
            return nullcontext()
        return torch.autocast(self.cl.device.type, dtype=torch.bfloat16)

    def reduce(self, values: torch.Tensor) -> torch.Tensor:
        if self.cl.distributed:
            dist.all_reduce(values)
        return values

    def agree(self, flag: bool) -> bool:
        """True on every rank if ``flag`` is True on any: one all-reduce."""
        t = torch.tensor([float(flag)], dtype=torch.float64, device=self.cl.device)
        return bool(self.reduce(t).item() > 0)

    def gather(self, mine: dict[str, Any]) -> list[dict[str, Any]]:
        """Every rank's ``mine``, in rank order, on every rank."""
        if not self.cl.distributed:
            return [mine]
        out: list[Any] = [None] * self.cl.world_size
        dist.all_gather_object(out, mine)
        return out

    @property
    def preemptible(self) -> bool:
        return self.preempt_cfg.signal is not None

    def eta(self, epoch: int, step: int, steps: int, evaluated: bool = False) -> float:
        """Seconds left after ``step`` of ``epoch`` (of ``steps``; and its evaluation if
        ``evaluated``)."""
        left_steps = (self.args.epochs - epoch - 1) * self.steps + (steps - step - 1)
        left_evals = self.args.epochs - epoch - int(evaluated) if self.args.eval else 0
        return round(float(left_steps * self.step_time + left_evals * self.eval_time), 1)

    def train_step(self, plan: EpochPlan, epoch: int, s: int, sums: torch.Tensor) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = self.schedule.lr(epoch, s, plan.steps)
        x, y = self.data.train_batch(*plan.step(s))
        with self.autocast():
            logits = self.model(x)
            loss = F.cross_entropy(logits, y)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        self.optimizer.step()
        with torch.no_grad():  # stays on the device: no host sync per step
            sums[0].add_(loss.detach().double(), alpha=plan.batch)
            sums[1].add_((logits.argmax(dim=1) == y).sum())

    def meet(self, sums: torch.Tensor, images: int, lap: tuple[int, float]) -> Meeting:
        """The ranks' meeting point, the loop's only host sync: one all-reduce of the metric
        sums, the signal flags and the next meeting's distance. Rank 0 alone proposes that
        distance from its step time (the others add 0, so every rank gets the same exact
        number); any rank's SIGTERM stops all, any rank's preemption signal preempts all."""
        steps, seconds = lap
        proposal = 0
        if self.cl.is_main:
            self.step_time = seconds / steps
            proposal = max(1, round(self.sync_period / max(self.step_time, 1e-6)))
        meta = [images, float(self.stop.requested), float(self.stop.preempt), proposal]
        extra = torch.tensor(meta, dtype=torch.float64, device=self.cl.device)
        reduced = self.reduce(torch.cat([sums, extra])).tolist()
        loss_sum, correct, total, stops, preempts, agreed = reduced
        return Meeting(
            loss_sum / total, correct / total, total, stops > 0, preempts > 0, int(agreed)
        )

    def train_epoch(self, epoch: int, span: EpochSpan) -> dict[str, Any] | Interrupted:
        """The steps of ``span`` from its first on; returns the epoch's global train metrics,
        or how it was cut short. A preemption agreed at the epoch's last step is left to the
        epoch's end (run()), where the checkpoint is an ordinary epoch boundary."""
        self.span, first = span, span.first
        plan = plan_epoch(self.data, self.cl, self.args.seed, epoch, self.split, span)
        self.model.train()
        sums = torch.zeros(2, dtype=torch.float64, device=self.cl.device)  # loss*n, correct
        if first and self.resume is not None:
            sums.copy_(self.resume["sums"])  # this rank's own sums: the totals add up exactly
        clock = EpochClock(first, float(span.consumed(self.split, first)))
        # Rank 0 adds the images an earlier attempt consumed beyond this split's own count.
        behind = span.origin if self.cl.is_main else 0
        next_meeting = first + 1  # after the first step (warm-up), then about every sync_period
        for s in range(first, plan.steps):
            self.train_step(plan, epoch, s, sums)
            done = s + 1
            if done != next_meeting and done != plan.steps:
                continue
            lap = clock.lap(done)
            m = self.meet(sums, done * plan.batch + behind, lap)
            clock.met(done, m.images)
            # SIGTERM too (the grace period is over, or a cancel): preempted still saves, as
            # the file is replaced atomically even if a SIGKILL cuts the save short.
            if m.stop and not m.preempt:
                return Interrupted("terminated", done, plan.steps, sums, {})
            next_meeting = done + m.next_in
            train = {"train_loss": m.train_loss, "train_acc": m.train_acc}
            if done == plan.steps:
                return {**train, "images_per_s": clock.steady_rate(), "steps": plan.steps}
            lap_rate = self.split.global_batch * lap[0] / max(lap[1], 1e-9)
            rec = record(
                "train",
                epoch=epoch + 1,
                epochs=self.args.epochs,
                step=done,
                steps=plan.steps,
                images_per_s=round(lap_rate, 1),
                eta_s=self.eta(epoch, s, plan.steps),
                lr=self.optimizer.param_groups[0]["lr"],
                **train,
            )
            if m.preempt:
                return Interrupted("preempted", done, plan.steps, sums, rec)
            self.metrics.write(rec)
        raise AssertionError("unreachable: the ranks always meet after the last step")

    @torch.no_grad()
    def evaluate(self) -> dict[str, Any]:
        """Loss and accuracy over exactly the test set: rank r takes images r, r+W, r+2W...
        (no padding, unlike DistributedSampler), and the sums are reduced over ranks."""
        t0 = time.perf_counter()
        cl, dev = self.cl, self.cl.device
        self.net.eval()
        mine = torch.arange(cl.rank, self.data.test_size, cl.world_size, device=dev)
        sums = torch.zeros(3, dtype=torch.float64, device=dev)
        eval_batch = max(2 * self.args.batch_size, 256)
        for chunk in mine.split(eval_batch):  # type: ignore[no-untyped-call]
            x, y = self.data.test_batch(chunk)
            with self.autocast():
                logits = self.net(x)
            sums[0] += F.cross_entropy(logits.float(), y, reduction="sum").double()
            sums[1] += (logits.argmax(dim=1) == y).sum()
            sums[2] += y.numel()
        loss_sum, correct, count = self.reduce(sums).tolist()
        self.eval_time = time.perf_counter() - t0
        return {
            "test_loss": loss_sum / max(count, 1.0),
            "test_acc": correct / max(count, 1.0),
            "test_samples": int(count),
        }

    def data_position(self, epochs_done: int, step: int) -> dict[str, Any]:
        """Where in the data order training stands. The order and the augmentation of an
        epoch are drawn from (seed, epoch, rank) alone (plan_epoch), so this is all of the
        sampler's state: the epoch's images consumed, and the recipe that a resume on any
        number of ranks keeps (resize.py)."""
        consumed = self.span.consumed(self.split, step) if step and self.span else 0
        return {
            "sampler": "distributed",
            "seed": self.args.seed,
            "epoch": epochs_done,
            "step": step,
            "consumed": consumed,
            "world_size": self.cl.world_size,
            "batch": self.batch,
            "steps": self.steps,
            "train_size": self.data.train_size,
            "recipe_world": self.recipe.world,
            "global_batch": self.recipe.global_batch,
            "epoch_samples": self.recipe.epoch_samples,
        }

    def local_state(self, step: int, sums: torch.Tensor) -> dict[str, Any]:
        """What differs between ranks mid-epoch: BatchNorm statistics (averaged only at an
        epoch's end), the metric sums, and (in principle) the RNGs."""
        return {
            "rank": self.cl.rank,
            "step": step,
            "sums": sums.detach().cpu().clone(),
            "buffers": {k: b.detach().cpu().clone() for k, b in self.net.named_buffers()},
            "rng": rng_state(self.cl.device),
        }

    def checkpoint_state(
        self,
        epochs_done: int,
        step: int = 0,
        ranks: list[dict[str, Any]] | None = None,
        reason: str = "epoch",
    ) -> dict[str, Any]:
        """Format 2. ``epoch``: epochs done; ``step``: steps done of the next one (0 at an
        epoch's end). ``model`` is always one usable model (mid-epoch its BatchNorm statistics
        are the ranks' average, as at an epoch's end); ``ranks`` holds each rank's own state
        for an exact resume (None at an epoch's end, where all ranks hold the same)."""
        model = self.net.state_dict()
        if ranks is not None:
            if {r["step"] for r in ranks} != {step}:
                raise AssertionError(f"ranks disagree on the step to save: {ranks}")
            model = dict(model)
            for name, first in ranks[0]["buffers"].items():
                if first.is_floating_point():
                    model[name] = torch.stack([r["buffers"][name] for r in ranks]).mean(0)
        return {
            "format": CHECKPOINT_FORMAT,
            "epoch": epochs_done,
            "step": step,
            "steps": self.span.steps if step and self.span else self.steps,
            "reason": reason,
            "attempt": self.preempt_cfg.attempt,
            "model": model,
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.schedule.state_dict(),
            "scaler": None,  # bf16 autocast needs no GradScaler (no fp16 loss scaling)
            "rng": rng_state(self.cl.device),
            "data": self.data_position(epochs_done, step),
            "ranks": ranks,
            "stem": self.args.stem,
            "width": self.args.width,
            "world_size": self.cl.world_size,
            "batch_size": self.args.batch_size,
            "metrics": self.last,
        }

    def requeue(
        self,
        ckpt: Path | None,
        epochs_done: int,
        cut: Interrupted | None,
        saved: bool,
    ) -> int:
        """Save where the ranks agreed to stop (mid-epoch: ``cut``; else the end of epoch
        ``epochs_done``, already saved if ``saved``) and return the exit status, the same on
        every rank: $DDPQ_REQUEUE_EXIT once the file is durable, 1 if it could not be saved."""
        cl, cfg, epochs = self.cl, self.preempt_cfg, self.args.epochs
        step = cut.step if cut is not None else 0
        where = (
            f"epoch {epochs_done + 1}/{epochs} step {step}/{cut.steps if cut else self.steps}"
            if step
            else f"the end of epoch {epochs_done}/{epochs}"
        )
        # The record of the point saved. At an epoch's end it is that epoch's record, which
        # run() holds back so that it is written once, saying whether it was saved: the worker
        # reads a checkpoint from it (torchrun's exit status 1 does not say 75).
        boundary = self.last if cut is None else None
        if ckpt is None:
            log(
                cl,
                f"preempted ({cfg.name}) at {where}: nowhere to save (no --checkpoint-dir "
                "or $DDPQ_JOB_DIR), so a rerun starts over",
            )
            if boundary is not None:
                self.metrics.write(boundary)
            return cfg.requeue_exit
        ranks = self.gather(self.local_state(step, cut.sums)) if cut is not None else None
        ok = False
        if cl.is_main:
            ok = saved
            if not saved:
                try:
                    state = self.checkpoint_state(epochs_done, step, ranks, "preempted")
                    save_checkpoint(ckpt, state)
                    ok = True
                except OSError as exc:
                    log(cl, f"preempted ({cfg.name}) at {where}: cannot save {ckpt}: {exc}")
            if ok:
                self.metrics.write({**(cut.record if cut else boundary or {}), "preempted": True})
                log(
                    cl,
                    f"preempted ({cfg.name}): saved {where} to {ckpt}; "
                    f"exit {cfg.requeue_exit} to be requeued",
                )
            elif boundary is not None:
                self.metrics.write(boundary)
        # Every rank waits for rank 0's file (and its last words): torchrun stops the others
        # as soon as one rank exits, and the requeue status must mean "saved" on every rank.
        return cfg.requeue_exit if self.agree(ok) else EXIT_CRASH

    def run(self, ckpt: Path | None) -> int:
        args, cl = self.args, self.cl
        for epoch in range(self.start_epoch, args.epochs):
            t0 = time.perf_counter()
            resumed = self.resumed if epoch == self.start_epoch else None
            train = self.train_epoch(epoch, resumed or resize.whole_epoch(self.split))
            self.resume = None  # this rank's saved sums belonged to that epoch only
            if isinstance(train, Interrupted):
                if train.reason == "preempted":
                    return self.requeue(ckpt, epoch, train, saved=False)
                log(cl, f"SIGTERM: stopping during epoch {epoch + 1}/{args.epochs}")
                return EXIT_TERMINATED
            average_bn_buffers(self.net, cl)
            test = self.evaluate() if args.eval else {}
            self.last = record(
                "epoch",
                epoch=epoch + 1,
                epochs=args.epochs,
                step=train["steps"],
                steps=train["steps"],
                train_loss=train["train_loss"],
                train_acc=train["train_acc"],
                test_loss=test.get("test_loss"),
                test_acc=test.get("test_acc"),
                images_per_s=round(train["images_per_s"], 1),
                eta_s=self.eta(epoch, train["steps"] - 1, train["steps"], evaluated=True),
                lr=self.optimizer.param_groups[0]["lr"],
                epoch_s=round(time.perf_counter() - t0, 3),
            )
            log(cl, format_epoch(self.last))
            due = bool(args.checkpoint_every) and (
                (epoch + 1) % args.checkpoint_every == 0 or epoch + 1 == args.epochs
            )
            if due and ckpt is not None and cl.is_main:
                save_checkpoint(ckpt, self.checkpoint_state(epoch + 1))
            # A signal during this epoch's last steps or its evaluation: save this boundary
            # (requeue writes the epoch's record, marked once saved).
            last = epoch + 1 == args.epochs
            if self.preemptible and not last and self.agree(self.stop.preempt):
                return self.requeue(ckpt, epoch + 1, None, saved=due)
            self.metrics.write(self.last)
            if self.preemptible and last and self.stop.preempt:
                log(
                    cl,
                    f"preemption signal ({self.preempt_cfg.name}) after the last "
                    "epoch's training: finishing instead",
                )
        return EXIT_OK


def _num(value: Any, spec: str = ".4f") -> str:
    return "nan" if value is None else format(value, spec)


def format_epoch(r: dict[str, Any]) -> str:
    text = (
        f"epoch {r['epoch']}/{r['epochs']}  train_loss {_num(r['train_loss'])}  "
        f"train_acc {_num(r['train_acc'])}"
    )
    if r.get("test_acc") is not None:
        text += f"  test_loss {_num(r['test_loss'])}  test_acc {_num(r['test_acc'])}"
    return text + (
        f"  lr {_num(r['lr'], '.4g')}  {_num(r['images_per_s'], '.1f')} img/s"
        f"  {_num(r['epoch_s'], '.1f')} s  eta {_num(r['eta_s'], '.0f')} s"
    )


# --------------------------------------------------------------------------- main


def wrap_ddp(net: nn.Module, cl: Cluster) -> nn.Module:
    if not cl.distributed:
        return net
    # BatchNorm statistics are averaged once per epoch (average_bn_buffers) instead of being
    # broadcast from rank 0 before every forward. torch >= 2.14 names the switch
    # forward_sync_buffers and deprecates broadcast_buffers.
    params = inspect.signature(DistributedDataParallel.__init__).parameters
    no_sync: dict[str, Any] = (
        {"forward_sync_buffers": False}
        if "forward_sync_buffers" in params
        else {"broadcast_buffers": False}
    )
    return DistributedDataParallel(
        net,
        device_ids=[cl.device.index] if cl.device.type == "cuda" else None,
        # Gradients live in the communication buckets: one copy less per step.
        gradient_as_bucket_view=True,
        **no_sync,
    )


def make_optimizer(net: nn.Module, args: argparse.Namespace, lr: float) -> torch.optim.SGD:
    def sgd(fused: bool | None) -> torch.optim.SGD:
        return torch.optim.SGD(
            param_groups(net, args.weight_decay),
            lr=lr,
            momentum=args.momentum,
            nesterov=args.momentum > 0,
            fused=fused,
        )

    try:
        # One kernel over all parameters: about 25 % faster than the per-tensor loop on the
        # CPU (measured: 13 vs 18 ms a step for ResNet18), and fewer launches on CUDA.
        return sgd(True)
    except RuntimeError:  # an older torch without fused SGD for this device
        return sgd(None)


def setup_backends(cuda: bool, deterministic: bool) -> None:
    if deterministic and cuda:
        # Fewer run-to-run differences at some speed: deterministic cuDNN convolutions and no
        # autotuning (its pick may differ between runs). Not use_deterministic_algorithms:
        # on CUDA it raises for two ops ResNet18 needs (AdaptiveAvgPool2d's backward,
        # NLLLoss), which have no deterministic version. cuBLAS reads the variable when it
        # creates its first handle, which is still to come.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.deterministic = True
    elif deterministic:
        torch.use_deterministic_algorithms(True)
    elif cuda:
        torch.backends.cudnn.benchmark = True  # fixed shapes: pick the fastest kernels once
    if cuda:
        torch.set_float32_matmul_precision("high")  # TF32 where fp32 remains (no --amp)


def find_checkpoint(
    args: argparse.Namespace,
) -> tuple[Path | None, dict[str, Any] | None, Architecture]:
    """The checkpoint path, its contents if it exists, and the network to build."""
    ckpt = checkpoint_path(args)
    state = load_checkpoint(ckpt) if ckpt is not None and ckpt.is_file() else None
    if args.eval_only and state is None:
        where = ckpt or "(set --checkpoint-dir or $DDPQ_JOB_DIR)"
        raise WorkloadError(f"--eval-only: no checkpoint at {where}")
    asked = Architecture(args.stem, args.width)
    if state is None:
        return ckpt, state, asked
    trained = Architecture.of_checkpoint(state)
    if trained == asked or args.eval_only:  # --eval-only evaluates what was trained
        return ckpt, state, trained
    raise WorkloadError(
        f"checkpoint {ckpt} was trained with --stem {trained.stem} --width {trained.width}, "
        f"not --stem {asked.stem} --width {asked.width}"
    )


def resume_geometry(
    args: argparse.Namespace, cl: Cluster, n: int, state: dict[str, Any] | None
) -> resize.Resumption:
    """The recipe, its split over these ranks and the rest of a preempted epoch, for a
    checkpoint saved on any number of ranks (resize.py); none: this run's own."""

    def recipe_for(world: int) -> Recipe:
        return Recipe.fresh(n, world, args.batch_size, args.max_steps_per_epoch)

    data = state.get("data") if state is not None and not args.eval_only else None
    step = int(state.get("step") or 0) if data is not None and state is not None else 0
    try:
        return resize.resume_plan(data, step, recipe_for, args.seed, n, cl.world_size)
    except resize.ResizeError as exc:
        raise WorkloadError(str(exc)) from None


def rank_resume_state(state: dict[str, Any], cl: Cluster) -> dict[str, Any]:
    """This rank's state at a mid-epoch checkpoint. On as many ranks as saved it: its own
    (BatchNorm statistics, metric sums, RNGs), so the run goes on exactly as if never
    stopped. On another number: the saved model's BatchNorm statistics (the ranks' average,
    loaded already), the epoch's metric sums totalled on rank 0 and zero elsewhere (they are
    summed over ranks, so the totals still add up), and the saved RNGs of its rank if any."""
    ranks: list[dict[str, Any]] = state["ranks"]
    if len(ranks) == cl.world_size:
        return ranks[cl.rank]
    total = torch.stack([r["sums"] for r in ranks]).sum(0)
    return {
        "sums": total if cl.is_main else torch.zeros_like(total),
        "buffers": {},
        "rng": ranks[cl.rank]["rng"] if cl.rank < len(ranks) else None,
    }


def apply_resume(
    trainer: Trainer, state: dict[str, Any], plan: resize.Resumption, base_lr: float
) -> None:
    """Put a checkpoint's mid-epoch position and this rank's own state into ``trainer`` (its
    model and optimizer are loaded, DDP has broadcast rank 0's parameters and buffers)."""
    trainer.resume_note = plan.note
    before = plan.resized_from
    if before is not None:
        was = peak_lr(base_lr, before.world, before.batch)
        now = trainer.schedule.peak_lr
        trainer.resize_note = resize.resize_line(before, plan.split, plan.recipe, was, now)
    if plan.span is None:
        return
    mine = rank_resume_state(state, trainer.cl)
    buffers = dict(trainer.net.named_buffers())
    with torch.no_grad():
        for name, saved in mine["buffers"].items():
            buffers[name].copy_(saved)
    if mine["rng"] is not None:
        restore_rng(mine["rng"], trainer.cl.device)
    trainer.resumed, trainer.resume = plan.span, mine


def build_trainer(
    args: argparse.Namespace,
    cl: Cluster,
    data_np: cifar.Cifar10,
    state: dict[str, Any] | None,
    arch: Architecture,
    stop: StopRequest,
    preempt_cfg: preemption.PreemptConfig,
) -> Trainer:
    cuda = cl.device.type == "cuda"
    # channels_last suits cuDNN's tensor-core kernels; on the CPU it measured no faster
    # (191 vs 193 ms a step, 1 thread, batch 64), so the plain layout is kept there.
    channels_last = cuda
    torch.manual_seed(args.seed)
    net = build_model(arch)
    if args.pretrained is not None and state is None:
        skipped = load_pretrained(net, args.pretrained)
        log(cl, f"pretrained weights from {pretrained_path(args.pretrained)}; new: {skipped}")
    net = net.to(cl.device)
    if channels_last:
        net = net.to(memory_format=torch.channels_last)
    data = DeviceData.build(data_np, cl.device, channels_last)
    plan = resume_geometry(args, cl, data.train_size, state)
    lr = peak_lr(args.lr, cl.world_size, plan.split.batch)
    optimizer = make_optimizer(net, args, lr)
    if state is not None:
        net.load_state_dict(state["model"])
        if not args.eval_only:
            optimizer.load_state_dict(state["optimizer"])
            restore_rng(state["rng"], cl.device)
    job_dir = os.environ.get("DDPQ_JOB_DIR")
    metrics_path = Path(job_dir) / "metrics.jsonl" if job_dir and cl.is_main else None
    # Meet often enough that a preemption is agreed on well inside its grace period.
    grace = preempt_cfg.grace_s if preempt_cfg.signal is not None else None
    trainer = Trainer(
        args=args,
        cl=cl,
        data=data,
        model=wrap_ddp(net, cl),  # broadcasts rank 0's parameters and buffers to all
        net=net,
        optimizer=optimizer,
        schedule=Schedule(lr, args.warmup_epochs, args.epochs),
        amp=args.amp if args.amp is not None else cuda,
        stop=stop,
        metrics=MetricsLog(metrics_path, preempt_cfg.attempt),
        recipe=plan.recipe,
        split=plan.split,
        preempt_cfg=preempt_cfg,
        start_epoch=int(state["epoch"]) if state is not None else 0,
        sync_period=SYNC_PERIOD_S if grace is None else min(SYNC_PERIOD_S, grace / 4),
    )
    if state is not None and not args.eval_only:
        apply_resume(trainer, state, plan, args.lr)
    return trainer


def resume_line(trainer: Trainer, ckpt: Path | None, state: dict[str, Any]) -> str:
    epoch, epochs, steps = trainer.start_epoch, trainer.args.epochs, trainer.steps
    if trainer.resumed is not None:
        step, steps = trainer.resumed.first, trainer.resumed.steps
        by = f", saved by attempt {state['attempt']}" if state.get("attempt") else ""
        return (
            f"resuming from checkpoint {ckpt} (epoch {epoch} done and step {step}/{steps} of "
            f"epoch {epoch + 1}{by}): continuing at epoch {epoch + 1}/{epochs} "
            f"step {step + 1}/{steps}"
        )
    note = f"; {trainer.resume_note}" if trainer.resume_note else ""
    return (
        f"resuming from checkpoint {ckpt} (epoch {epoch} done{note}): "
        f"continuing at epoch {epoch + 1}/{epochs}"
    )


def train_main(
    args: argparse.Namespace, stop: StopRequest, preempt_cfg: preemption.PreemptConfig
) -> int:
    t_begin = time.perf_counter()
    data_np, data_desc = load_data(args)  # before joining: a data error fails fast everywhere
    ckpt, state, arch = find_checkpoint(args)
    cl = start_cluster(args)
    setup_backends(cl.device.type == "cuda", args.deterministic)
    trainer = build_trainer(args, cl, data_np, state, arch, stop, preempt_cfg)
    del data_np  # the device copy is what trains
    backend = "nccl" if cl.device.type == "cuda" else "gloo"
    log(
        cl,
        f"resnet18: world_size {cl.world_size} on {cl.device.type} "
        f"({backend}{'' if cl.distributed else ', no process group'}), "
        f"{torch.get_num_threads()} threads/rank, {arch.describe()}, "
        f"amp {'on' if trainer.amp else 'off'}, "
        f"batch {trainer.batch}/rank x {trainer.steps} steps/epoch, "
        f"peak lr {trainer.schedule.peak_lr:.4g}; data {data_desc}",
    )
    try:
        # A preemption signal during set-up: all ranks leave here together. Nothing was
        # trained in this attempt, so there is nothing to save: the checkpoint on disk (or
        # none, and the next attempt starts afresh) is exactly where to resume.
        if trainer.preemptible:
            stop.deferred = True  # leaving together: a SIGTERM now must not cut one rank short
            if trainer.agree(stop.preempt):
                where = f"checkpoint {ckpt} stands" if state is not None else "none saved yet"
                log(
                    cl,
                    f"preempted ({preempt_cfg.name}) during set-up, before any step: nothing "
                    f"to save ({where}); exit {preempt_cfg.requeue_exit} to be requeued",
                )
                return preempt_cfg.requeue_exit
            stop.deferred = False
            if stop.requested:  # SIGTERM came during that agreement: still set-up
                raise Terminated()
        if args.eval_only:
            return eval_only(trainer, state, t_begin)
        if state is not None:
            log(cl, resume_line(trainer, ckpt, state))
            if trainer.resize_note:
                log(cl, trainer.resize_note)
        stop.deferred = True  # from here on SIGTERM is handled at the ranks' meeting points
        code = trainer.run(ckpt)
        if code == EXIT_OK:
            summary(trainer, t_begin)
        return code
    finally:
        trainer.metrics.close()


def eval_only(trainer: Trainer, state: dict[str, Any] | None, t_begin: float) -> int:
    """Evaluate the checkpoint's model (a preemption signal now is ignored: the evaluation is
    short and rerunning it is all a requeue would do)."""
    test = trainer.evaluate()
    epoch = int(state["epoch"]) if state else 0
    step = int(state.get("step") or 0) if state else 0
    at = f"epoch {epoch}" + (f" and step {step}/{state['steps']}" if state and step else "")
    trainer.metrics.write(record("eval", epoch=epoch, epochs=trainer.args.epochs, **test))
    log(
        trainer.cl,
        f"eval: checkpoint after {at}: test_loss {test['test_loss']:.6f} "
        f"test_acc {test['test_acc']:.4f} over {test['test_samples']} images "
        f"({time.perf_counter() - t_begin:.1f} s)",
    )
    return EXIT_OK


def summary(trainer: Trainer, t_begin: float) -> None:
    last = trainer.last
    if not last:
        done = trainer.start_epoch
        log(trainer.cl, f"done: nothing to train (checkpoint already at epoch {done})")
        return
    parts = [f"epochs {last['epoch']}/{last['epochs']}"]
    if last.get("test_acc") is not None:
        parts.append(f"final test_acc {_num(last['test_acc'])} test_loss {_num(last['test_loss'])}")
    parts.append(f"train_acc {_num(last['train_acc'])}")
    parts.append(f"{_num(last['images_per_s'], '.1f')} img/s")
    parts.append(f"{time.perf_counter() - t_begin:.1f} s total")
    log(trainer.cl, "done: " + ", ".join(parts))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    stop = StopRequest()
    stop.install()
    prog = "resnet18"
    try:
        preempt_cfg = preemption.from_environ(os.environ)
        if preempt_cfg.signal is not None:
            stop.catch_preemption(preempt_cfg.signal)
        return train_main(args, stop, preempt_cfg)
    except (WorkloadError, cifar.CifarError, preemption.PreemptEnvError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    except (Terminated, KeyboardInterrupt):
        print(f"{prog}: stopped by a signal", file=sys.stderr, flush=True)
        return EXIT_TERMINATED
    finally:
        # The status is decided: from here a signal only raises a flag. Our handlers stay
        # until the group is gone: a peer that has exited already makes torchrun SIGTERM this
        # rank, which must not kill it while it tears down.
        stop.deferred = True
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception as exc:  # a peer may already be gone; nothing left to clean
                print(f"{prog}: destroy_process_group: {exc}", file=sys.stderr, flush=True)
        stop.uninstall()


if __name__ == "__main__":
    status = main()
    # Leave now, not after finalising torch (a second or so): torchrun SIGTERMs the other
    # ranks as soon as one exits non-zero (75 included), and with the handlers uninstalled a
    # rank still finalising would die of that signal instead of exiting with its status.
    # Everything written is flushed or closed by now.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
