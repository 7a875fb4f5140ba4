"""A job that ignores SIGTERM and leaves children behind, some trying to escape.

It writes the PIDs of everything it started to $DDPQ_JOB_DIR/pids (one per line)
and then waits forever. A correct supervisor still leaves none of them alive.
"""

import os
import signal
import sys
import time

signal.signal(signal.SIGTERM, signal.SIG_IGN)
pids = [os.getpid()]


def idle() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    while True:
        time.sleep(3600)


for _ in range(2):  # plain children, like DataLoader workers
    pid = os.fork()
    if pid == 0:
        idle()
    pids.append(pid)

# A double-forked daemon in its own session: escapes the process group and session.
r, w = os.pipe()
if os.fork() == 0:
    os.setsid()
    grandchild = os.fork()
    if grandchild == 0:
        idle()
    os.write(w, f"{grandchild}\n".encode())
    os._exit(0)
pids.append(int(os.read(r, 64).decode()))
os.wait()

with open(os.path.join(os.environ["DDPQ_JOB_DIR"], "pids.tmp"), "w") as f:
    f.write("\n".join(map(str, pids)) + "\n")
os.replace(
    os.path.join(os.environ["DDPQ_JOB_DIR"], "pids.tmp"),
    os.path.join(os.environ["DDPQ_JOB_DIR"], "pids"),
)
print("started", pids, flush=True)
if len(sys.argv) > 1 and sys.argv[1] == "exit":
    sys.exit(0)  # leave the children behind as stragglers
idle()
