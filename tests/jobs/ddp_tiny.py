"""A minimal DDP program for torchrun: gloo, a few all-reduces, prints what it was given."""

import os
import sys
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
steps = int(sys.argv[1]) if len(sys.argv) > 1 else 3
for _ in range(steps):
    t = torch.ones(4) * (rank + 1)
    dist.all_reduce(t)
    assert t[0].item() == world * (world + 1) / 2
    time.sleep(0.1)
# One write per line: with PYTHONUNBUFFERED, print() writes the text and its newline apart,
# and two ranks sharing one log could interleave between them.
line = (
    f"rank {rank}/{world} CUDA_VISIBLE_DEVICES={os.environ['CUDA_VISIBLE_DEVICES']} "
    f"MASTER_PORT={os.environ['MASTER_PORT']} ok\n"
)
os.write(1, line.encode())
dist.destroy_process_group()
# Not Python's teardown: at exit gloo's threads can abort a finished rank (docs/elastic.md).
os._exit(0)
