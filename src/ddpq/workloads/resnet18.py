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
* ``checkpoint.pt`` in ``--checkpoint-dir`` or ``$DDPQ_JOB_DIR``: written by rank 0 after
  every ``--checkpoint-every`` epochs (temp file, fsync, rename); when present at start-up
  every rank loads it and training resumes at the next epoch.
* Exit status: 0 done; 1 crashed; 2 unusable arguments or data (one line on stderr);
  143 stopped by SIGTERM (at the next point where all ranks agree, so none is left waiting).
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import os
import signal
import sys
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO, Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ddpq.workloads import cifar
from ddpq.workloads.resnet18_cli import PRETRAINED_FILENAME, build_parser

CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR_STD = (0.2470, 0.2435, 0.2616)
PAD = 4  # random-crop padding, as in the usual CIFAR recipe (RandomCrop(32, padding=4))
SIZE = 32
SYNC_PERIOD_S = 2.0  # how often ranks meet to reduce metrics and check for SIGTERM
CHECKPOINT_NAME = "checkpoint.pt"
CHECKPOINT_FORMAT = 1

EXIT_OK = 0
EXIT_CRASH = 1
EXIT_USAGE = 2
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
    """SIGTERM handling: before training it aborts set-up; during training it only raises a
    flag that the ranks reduce at their next meeting, so that all stop after the same step
    instead of one leaving the others blocked in a collective."""

    def __init__(self) -> None:
        self.requested = False
        self.deferred = False

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True
        if not self.deferred:
            raise Terminated()


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


def epoch_shard(n: int, seed: int, epoch: int, rank: int, world: int) -> torch.Tensor:
    """DistributedSampler's split: the same permutation on every rank (seeded by seed+epoch,
    which is what set_epoch does), padded by wrapping to a multiple of world, then strided."""
    g = torch.Generator().manual_seed(seed + epoch)
    perm = torch.randperm(n, generator=g)
    total = math.ceil(n / world) * world
    if total > n:
        perm = torch.cat([perm, perm[: total - n]])
    return perm[rank::world]


def train_geometry(n: int, world: int, batch: int, max_steps: int | None) -> tuple[int, int]:
    """(batch, steps) per rank: whole batches only (a last short batch would recompile
    kernels and, with one image, break BatchNorm); a shard smaller than a batch is one step."""
    per_rank = math.ceil(n / world)
    b = min(batch, per_rank)
    steps = max(1, per_rank // b)
    if max_steps is not None:
        steps = min(steps, max_steps)
    return b, steps


def plan_epoch(
    data: DeviceData, cl: Cluster, seed: int, epoch: int, batch: int, steps: int
) -> EpochPlan:
    device = data.train_padded.device
    shard = epoch_shard(data.train_size, seed, epoch, cl.rank, cl.world_size)
    idx = shard[: steps * batch].to(device)
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


def build_model(stem: str) -> nn.Module:
    from torchvision.models import resnet18

    model: nn.Module = resnet18(weights=None, num_classes=cifar.NUM_CLASSES)
    if stem == "cifar":
        # 32x32 inputs: keep full resolution into layer1 instead of dividing it by 4.
        model.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
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
    """Rank 0's JSON-lines progress file; a no-op on other ranks or without a job dir."""

    def __init__(self, path: Path | None) -> None:
        self._file: IO[str] | None = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = path.open("a", encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        if self._file is None:
            return
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
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise WorkloadError(f"cannot read checkpoint {path}: {exc}") from exc
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
        raise WorkloadError(f"{path} is not a ddpq resnet18 checkpoint (format 1)")
    return state


def rng_state(device: torch.device) -> dict[str, Any]:
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
    }


def restore_rng(state: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and state.get("cuda") is not None:
        torch.cuda.set_rng_state(state["cuda"], device)


# --------------------------------------------------------------------------- training


@dataclass(frozen=True)
class Meeting:
    """What the ranks agreed on at a meeting point (global numbers)."""

    train_loss: float
    train_acc: float
    images: float  # images trained this epoch so far, all ranks
    stop: bool
    next_in: int  # steps to the next meeting


class EpochClock:
    """Wall time of an epoch's meeting points, for step times and throughput."""

    def __init__(self) -> None:
        self.start = self.last = time.perf_counter()
        self.last_step = 0
        self.first: tuple[float, float] | None = None  # (time, images) after the first meeting
        self.end: tuple[float, float] = (self.start, 0.0)

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
        autotuning), unless that was the only one."""
        (t0, n0), (t1, n1) = self.first or (self.start, 0.0), self.end
        if n1 <= n0:
            t0, n0 = self.start, 0.0
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
    batch: int
    steps: int
    start_epoch: int = 0
    step_time: float = 0.0  # rank 0's estimate, seconds per step
    eval_time: float = 0.0
    last: dict[str, Any] = field(default_factory=dict)

    def autocast(self) -> AbstractContextManager[Any]:
        if not self.amp:
            return nullcontext()
        return torch.autocast(self.cl.device.type, dtype=torch.bfloat16)

    def reduce(self, values: torch.Tensor) -> torch.Tensor:
        if self.cl.distributed:
            dist.all_reduce(values)
        return values

    def eta(self, epoch: int, step: int, evaluated: bool = False) -> float:
        """Seconds left after ``step`` of ``epoch`` (and its evaluation if ``evaluated``)."""
        left_steps = (self.args.epochs - epoch - 1) * self.steps + (self.steps - step - 1)
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
        sums, the stop flags and the next meeting's distance. Rank 0 alone proposes that
        distance from its step time (the others add 0, so every rank gets the same exact
        number); any rank's SIGTERM stops all."""
        steps, seconds = lap
        proposal = 0
        if self.cl.is_main:
            self.step_time = seconds / steps
            proposal = max(1, round(SYNC_PERIOD_S / max(self.step_time, 1e-6)))
        meta = [images, float(self.stop.requested), proposal]
        extra = torch.tensor(meta, dtype=torch.float64, device=self.cl.device)
        loss_sum, correct, total, stops, agreed = self.reduce(torch.cat([sums, extra])).tolist()
        return Meeting(loss_sum / total, correct / total, total, stops > 0, int(agreed))

    def train_epoch(self, epoch: int) -> dict[str, Any] | None:
        """One epoch; returns its global train metrics, or None when stopped by SIGTERM."""
        plan = plan_epoch(self.data, self.cl, self.args.seed, epoch, self.batch, self.steps)
        self.model.train()
        sums = torch.zeros(2, dtype=torch.float64, device=self.cl.device)  # loss*n, correct
        clock = EpochClock()
        next_meeting = 1  # after the first step (warm-up), then about every SYNC_PERIOD_S
        for s in range(plan.steps):
            self.train_step(plan, epoch, s, sums)
            done = s + 1
            if done != next_meeting and done != plan.steps:
                continue
            lap = clock.lap(done)
            m = self.meet(sums, done * plan.batch, lap)
            clock.met(done, m.images)
            if m.stop:
                return None
            next_meeting = done + m.next_in
            train = {"train_loss": m.train_loss, "train_acc": m.train_acc}
            if done == plan.steps:
                return {**train, "images_per_s": clock.steady_rate()}
            lap_rate = m.images * lap[0] / done / max(lap[1], 1e-9)
            rec = record(
                "train",
                epoch=epoch + 1,
                epochs=self.args.epochs,
                step=done,
                steps=plan.steps,
                images_per_s=round(lap_rate, 1),
                eta_s=self.eta(epoch, s),
                lr=self.optimizer.param_groups[0]["lr"],
                **train,
            )
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

    def checkpoint_state(self, epochs_done: int) -> dict[str, Any]:
        return {
            "format": CHECKPOINT_FORMAT,
            "epoch": epochs_done,
            "model": self.net.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.schedule.state_dict(),
            "rng": rng_state(self.cl.device),
            "stem": self.args.stem,
            "world_size": self.cl.world_size,
            "batch_size": self.args.batch_size,
            "metrics": self.last,
        }

    def run(self, ckpt: Path | None) -> int:
        args, cl = self.args, self.cl
        for epoch in range(self.start_epoch, args.epochs):
            t0 = time.perf_counter()
            train = self.train_epoch(epoch)
            if train is None:
                log(cl, f"SIGTERM: stopping during epoch {epoch + 1}/{args.epochs}")
                return EXIT_TERMINATED
            average_bn_buffers(self.net, cl)
            test = self.evaluate() if args.eval else {}
            self.last = record(
                "epoch",
                epoch=epoch + 1,
                epochs=args.epochs,
                step=self.steps,
                steps=self.steps,
                train_loss=train["train_loss"],
                train_acc=train["train_acc"],
                test_loss=test.get("test_loss"),
                test_acc=test.get("test_acc"),
                images_per_s=round(train["images_per_s"], 1),
                eta_s=self.eta(epoch, self.steps - 1, evaluated=True),
                lr=self.optimizer.param_groups[0]["lr"],
                epoch_s=round(time.perf_counter() - t0, 3),
            )
            self.metrics.write(self.last)
            log(cl, format_epoch(self.last))
            due = args.checkpoint_every and (
                (epoch + 1) % args.checkpoint_every == 0 or epoch + 1 == args.epochs
            )
            if due and ckpt is not None and cl.is_main:
                save_checkpoint(ckpt, self.checkpoint_state(epoch + 1))
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


def setup_backends(cuda: bool) -> None:
    if cuda:
        torch.backends.cudnn.benchmark = True  # fixed shapes: pick the fastest kernels once
        torch.set_float32_matmul_precision("high")  # TF32 where fp32 remains (no --amp)


def find_checkpoint(args: argparse.Namespace) -> tuple[Path | None, dict[str, Any] | None, str]:
    """The checkpoint path, its contents if it exists, and the stem to build."""
    ckpt = checkpoint_path(args)
    state = load_checkpoint(ckpt) if ckpt is not None and ckpt.is_file() else None
    if args.eval_only and state is None:
        where = ckpt or "(set --checkpoint-dir or $DDPQ_JOB_DIR)"
        raise WorkloadError(f"--eval-only: no checkpoint at {where}")
    if state is None or state["stem"] == args.stem:
        return ckpt, state, args.stem
    if args.eval_only:  # evaluate what was trained
        return ckpt, state, str(state["stem"])
    raise WorkloadError(
        f"checkpoint {ckpt} was trained with --stem {state['stem']}, not --stem {args.stem}"
    )


def build_trainer(
    args: argparse.Namespace,
    cl: Cluster,
    data_np: cifar.Cifar10,
    state: dict[str, Any] | None,
    stem: str,
    stop: StopRequest,
) -> Trainer:
    cuda = cl.device.type == "cuda"
    # channels_last suits cuDNN's tensor-core kernels; on the CPU it measured no faster
    # (191 vs 193 ms a step, 1 thread, batch 64), so the plain layout is kept there.
    channels_last = cuda
    torch.manual_seed(args.seed)
    net = build_model(stem)
    if args.pretrained is not None and state is None:
        skipped = load_pretrained(net, args.pretrained)
        log(cl, f"pretrained weights from {pretrained_path(args.pretrained)}; new: {skipped}")
    net = net.to(cl.device)
    if channels_last:
        net = net.to(memory_format=torch.channels_last)
    data = DeviceData.build(data_np, cl.device, channels_last)
    batch, steps = train_geometry(
        data.train_size, cl.world_size, args.batch_size, args.max_steps_per_epoch
    )
    lr = peak_lr(args.lr, cl.world_size, batch)
    optimizer = make_optimizer(net, args, lr)
    start_epoch = 0
    if state is not None:
        net.load_state_dict(state["model"])
        start_epoch = int(state["epoch"])
        if not args.eval_only:
            optimizer.load_state_dict(state["optimizer"])
            restore_rng(state["rng"], cl.device)
    job_dir = os.environ.get("DDPQ_JOB_DIR")
    return Trainer(
        args=args,
        cl=cl,
        data=data,
        model=wrap_ddp(net, cl),
        net=net,
        optimizer=optimizer,
        schedule=Schedule(lr, args.warmup_epochs, args.epochs),
        amp=args.amp if args.amp is not None else cuda,
        stop=stop,
        metrics=MetricsLog(Path(job_dir) / "metrics.jsonl" if job_dir and cl.is_main else None),
        batch=batch,
        steps=steps,
        start_epoch=start_epoch,
    )


def train_main(args: argparse.Namespace, stop: StopRequest) -> int:
    t_begin = time.perf_counter()
    data_np, data_desc = load_data(args)  # before joining: a data error fails fast everywhere
    ckpt, state, stem = find_checkpoint(args)
    cl = start_cluster(args)
    setup_backends(cl.device.type == "cuda")
    trainer = build_trainer(args, cl, data_np, state, stem, stop)
    del data_np  # the device copy is what trains
    backend = "nccl" if cl.device.type == "cuda" else "gloo"
    log(
        cl,
        f"resnet18: world_size {cl.world_size} on {cl.device.type} "
        f"({backend}{'' if cl.distributed else ', no process group'}), "
        f"{torch.get_num_threads()} threads/rank, stem {stem}, "
        f"amp {'on' if trainer.amp else 'off'}, "
        f"batch {trainer.batch}/rank x {trainer.steps} steps/epoch, "
        f"peak lr {trainer.schedule.peak_lr:.4g}; data {data_desc}",
    )
    try:
        if args.eval_only:
            return eval_only(trainer, state, t_begin)
        if state is not None:
            log(
                cl,
                f"resuming from checkpoint {ckpt} (epoch {trainer.start_epoch} done): "
                f"continuing at epoch {trainer.start_epoch + 1}/{args.epochs}",
            )
        stop.deferred = True  # from here on SIGTERM is handled at the ranks' meeting points
        code = trainer.run(ckpt)
        if code == EXIT_OK:
            summary(trainer, t_begin)
        return code
    finally:
        trainer.metrics.close()


def eval_only(trainer: Trainer, state: dict[str, Any] | None, t_begin: float) -> int:
    test = trainer.evaluate()
    epoch = int(state["epoch"]) if state else 0
    trainer.metrics.write(record("eval", epoch=epoch, epochs=trainer.args.epochs, **test))
    log(
        trainer.cl,
        f"eval: checkpoint after epoch {epoch}: test_loss {test['test_loss']:.6f} "
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
        return train_main(args, stop)
    except (WorkloadError, cifar.CifarError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    except (Terminated, KeyboardInterrupt):
        print(f"{prog}: stopped by a signal", file=sys.stderr, flush=True)
        return EXIT_TERMINATED
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception as exc:  # a peer may already be gone; nothing left to clean
                print(f"{prog}: destroy_process_group: {exc}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
