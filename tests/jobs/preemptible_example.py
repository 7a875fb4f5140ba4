import json
import os
import signal
import sys
import time

state_file = os.path.join(os.environ["DDPQ_JOB_DIR"], "state.json")
preempted = False


def on_preempt(signum: int, frame: object) -> None:
    global preempted
    preempted = True  # only note it: the loop saves at the end of the step it is in


signal.signal(getattr(signal, "SIG" + os.environ.get("DDPQ_PREEMPT_SIGNAL", "USR1")), on_preempt)

step, total = 0, 0  # the state: where the work is, and what it has computed so far
if os.path.exists(state_file):  # a later attempt: go on where the last one saved
    with open(state_file) as f:
        step, total = json.load(f)
print(f"attempt {os.environ.get('DDPQ_ATTEMPT', '1')}: starting at step {step}", flush=True)
while step < 100:
    time.sleep(0.02)  # stands for one step of real work
    step, total = step + 1, total + step
    print(f"step {step}", flush=True)
    if preempted:
        with open(state_file + ".tmp", "w") as f:
            json.dump([step, total], f)
        os.replace(state_file + ".tmp", state_file)  # atomic: the old state or the new one
        sys.exit(int(os.environ.get("DDPQ_REQUEUE_EXIT", "75")))
print(f"done: total {total}", flush=True)
