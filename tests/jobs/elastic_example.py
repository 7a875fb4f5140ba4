import json
import os
import signal
import sys
import time
from typing import Any

preempted = False


def on_preempt(signum: int, frame: object) -> None:
    global preempted
    preempted = True  # only note it: the ranks agree on it after the step they are in


# Before importing torch (seconds): a rank under torchrun inherits the signal ignored.
signal.signal(getattr(signal, "SIG" + os.environ.get("DDPQ_PREEMPT_SIGNAL", "USR1")), on_preempt)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

IMAGES, EPOCHS, GLOBAL_BATCH, LR = 256, 3, 32, 0.05


def leave(status: int) -> None:
    """Exit without Python's teardown: at exit, gloo's threads can abort a rank that is done
    ("terminate called without an active exception", SIGABRT), and torchrun then reports the
    run failed, or a saved rank's 75 lost."""
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(status)  # everything written is closed already


job_dir = os.environ["DDPQ_JOB_DIR"]
state_file = os.path.join(job_dir, "state.pt")

dist.init_process_group("gloo")  # WORLD_SIZE, like DDPQ_GPUS, may differ at each attempt
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
x = torch.randn(IMAGES, 8)
y = x.sum(1, keepdim=True)
model = DistributedDataParallel(torch.nn.Linear(8, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=LR)
# Where training is: not "step k of rank r", which means nothing on another number of ranks,
# but how many of the epoch's samples are done, and the global batch of the first attempt.
state: dict[str, Any] = {"epoch": 0, "consumed": 0, "global_batch": GLOBAL_BATCH}
if os.path.exists(state_file):
    state = torch.load(state_file, weights_only=True)
    model.module.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
global_batch = state["global_batch"]
per_rank = global_batch // world  # the global batch kept, split over this attempt's ranks
if per_rank == 0:
    sys.exit(f"a global batch of {global_batch} cannot be split over {world} ranks")
step = per_rank * world  # less than global_batch when it does not divide by world:
for group in optimizer.param_groups:  # then the learning rate shrinks with it
    group["lr"] = LR * step / global_batch
epoch, consumed = state["epoch"], state["consumed"]
if rank == 0:
    print(f"{world} ranks, {per_rank} samples each a step, from epoch {epoch} at {consumed}")
while epoch < EPOCHS:
    order = torch.randperm(IMAGES, generator=torch.Generator().manual_seed(epoch))
    while consumed + step <= IMAGES:  # whole steps: the rest is left for the next epoch
        mine = order[consumed : consumed + step][rank::world]  # the same samples, re-dealt
        loss = F.mse_loss(model(x[mine]), y[mine])
        optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        time.sleep(0.05)  # stands for a longer step of real work
        if rank == 0:
            print(f"epoch {epoch}: samples {consumed}..{consumed + step}", flush=True)
        consumed += step
        stop = torch.tensor([float(preempted)])
        dist.all_reduce(stop, op=dist.ReduceOp.MAX)  # every rank stops after the same step
        if stop.item():
            if rank == 0:
                saved: dict[str, Any] = {"epoch": epoch, "consumed": consumed}
                saved |= {"global_batch": global_batch, "model": model.module.state_dict()}
                saved["optimizer"] = optimizer.state_dict()
                torch.save(saved, state_file + ".tmp")
                os.replace(state_file + ".tmp", state_file)  # atomic
                # torchrun exits 1 whatever its ranks say: this line tells ddpq it saved.
                with open(os.path.join(job_dir, "metrics.jsonl"), "a") as f:
                    f.write(json.dumps({"preempted": True}) + "\n")
            dist.barrier()  # nobody leaves before the state is saved
            leave(int(os.environ.get("DDPQ_REQUEUE_EXIT", "75")))
    epoch, consumed = epoch + 1, 0
if rank == 0:
    print(f"done: loss {loss.item():.4f}", flush=True)
leave(0)
