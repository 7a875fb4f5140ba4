"""The seed tutorial's DDP ResNet18/CIFAR-10 program, as a throughput baseline.

The program in /work/shared/seed/000_*.txt, changed only as far as needed to run here, each
change marked ``# changed:`` below:

* gloo on the CPU (NCCL and ``.to(rank)`` only with ``--device cuda``);
* ``resnet18(weights=None)``: ``pretrained=True`` needs the internet;
* the data is read from CIFAR-10 python files already on disk (ddpq.workloads.cifar's reader
  behind a Dataset that yields PIL images like ``datasets.CIFAR10``), not downloaded;
* MASTER_PORT comes from the environment; the missing imports are added;
* ``--world-size`` (default 2) instead of four hard-coded GPUs, ``--batch-size`` 64;
* ``--max-steps`` bounds the run, and rank 0 prints the training throughput measured from the
  end of the first step to the end of the last one (start-up and the first step excluded).

Everything else is the seed's: ``mp.spawn``, default thread settings, per-sample
``ToTensor`` + ``Normalize`` in a ``DataLoader`` on the main process, lr 0.001, and no
evaluation. Run: ``MASTER_PORT=29650 python bench/seed_baseline.py --data-dir DIR``.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.optim as optim
from PIL import Image
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset
from torchvision import models, transforms

from ddpq.workloads.cifar import load_cifar10

num_classes = 10


class CifarFiles(Dataset[tuple[Any, int]]):
    # changed: stands in for datasets.CIFAR10(root, train=True, download=True, transform=...):
    # same items (a PIL image through `transform`, an int label), read from files on disk.
    def __init__(self, root: str, transform: Any) -> None:
        data = load_cifar10(root)
        self.images = np.ascontiguousarray(data.train_x.transpose(0, 2, 3, 1))  # HWC, as CIFAR10
        self.labels = [int(v) for v in data.train_y]
        self.transform = transform

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        img = Image.fromarray(self.images[index])
        return self.transform(img), self.labels[index]


def setup(rank: int, world_size: int, backend: str) -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    # changed: MASTER_PORT from the environment (ddpq leases one), not a hard-coded '12355'
    if "MASTER_PORT" not in os.environ:
        raise SystemExit("seed_baseline: set MASTER_PORT")
    # 初始化进程组
    dist.init_process_group(backend, rank=rank, world_size=world_size)


def cleanup() -> None:
    dist.destroy_process_group()


def train(rank: int, world_size: int, args: argparse.Namespace) -> None:
    cuda = args.device == "cuda"
    setup(rank, world_size, "nccl" if cuda else "gloo")  # changed: gloo on the CPU

    model = models.resnet18(weights=None)  # changed: was pretrained=True (downloads)
    model.fc = nn.Linear(512, num_classes)
    if cuda:
        model = model.to(rank)
        model = DistributedDataParallel(model, device_ids=[rank])
    else:
        model = DistributedDataParallel(model)  # changed: CPU, no device_ids

    criterion = nn.CrossEntropyLoss()
    optimizer = optim.SGD(model.parameters(), lr=0.001)

    transform = transforms.Compose(
        [transforms.ToTensor(), transforms.Normalize((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))]
    )
    train_dataset = CifarFiles(args.data_dir, transform)  # changed: files on disk

    train_sampler: torch.utils.data.distributed.DistributedSampler[Any]
    train_sampler = torch.utils.data.distributed.DistributedSampler(
        train_dataset, num_replicas=world_size, rank=rank
    )
    train_loader = DataLoader(
        train_dataset, batch_size=args.batch_size, shuffle=False, sampler=train_sampler
    )

    num_epochs = 5
    step, t_first = 0, 0.0  # changed: timing and --max-steps
    for epoch in range(num_epochs):
        for images, labels in train_loader:
            if cuda:
                images, labels = images.to(rank), labels.to(rank)

            optimizer.zero_grad()
            outputs = model(images)
            loss = criterion(outputs, labels)
            loss.backward()
            optimizer.step()

            step += 1
            if step == 1:
                if cuda:
                    torch.cuda.synchronize()
                t_first = time.perf_counter()
            if step == args.max_steps:
                break

        print(f"Epoch [{epoch + 1}/{num_epochs}], Loss: {loss.item()}")
        if step == args.max_steps:
            break

    if cuda:
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - t_first
    if rank == 0 and step > 1:
        images_done = (step - 1) * args.batch_size * world_size
        print(
            f"seed_baseline: train images/s: {images_done / elapsed:.1f} "
            f"(steps 2..{step}, world_size {world_size}, batch {args.batch_size}/rank, "
            f"{torch.get_num_threads()} threads/rank)",
            flush=True,
        )
    cleanup()


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data-dir", required=True, help="holds cifar-10-batches-py/")
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--max-steps", type=int, default=50, help="stop after this many steps")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    return p.parse_args()


if __name__ == "__main__":
    # 启动多个进程进行分布式训练
    args = parse_args()
    # changed: no CUDA_VISIBLE_DEVICES='0,1,2,3' (ddpq leases the GPUs)
    mp.spawn(train, args=(args.world_size, args), nprocs=args.world_size, join=True)  # type: ignore[attr-defined,no-untyped-call]
