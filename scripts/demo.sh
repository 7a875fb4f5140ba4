#!/usr/bin/env bash
# The main demo: a daemon on a temporary home, two ResNet18 DDP jobs submitted
# at once, each on its own GPUs and rendezvous port, watched to the end.
# Uses the real GPUs when NVML finds some, else 4 fake GPUs (jobs on the CPU).
set -euo pipefail

home=$(mktemp -d "${TMPDIR:-/tmp}/ddpq-demo.XXXXXX")
port=${DDPQ_DEMO_PORT:-18765}
export DDPQ_URL="http://127.0.0.1:$port"
epochs=${DDPQ_DEMO_EPOCHS:-3}

gpu_flags=(--fake-gpus 4)
# A throwaway loopback daemon: as root it may run without per-user tokens.
root_flags=()
if [ "$(id -u)" = 0 ]; then root_flags=(--allow-root); fi
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  gpu_flags=()
fi
data_flags=(--synthetic 3000)
cifar=${DDPQ_CIFAR_DIR:-$HOME/.cache/ddpq/cifar10}
if [ -d "$cifar/cifar-10-batches-py" ]; then
  data_flags=(--data-dir "$cifar")
fi

echo "== ddpq serve --home $home --port $port ${gpu_flags[*]}"
ddpq serve --home "$home" --port "$port" "${gpu_flags[@]}" "${root_flags[@]}" --grace 5s \
  >"$home/daemon.log" 2>&1 &
daemon=$!
cleanup() {
  kill -TERM "$daemon" 2>/dev/null || true
  wait "$daemon" 2>/dev/null || true
  echo "== daemon stopped; its state folder was $home"
}
trap cleanup EXIT

deadline=$((SECONDS + 60))
until ddpq ls >/dev/null 2>&1; do
  if [ $SECONDS -gt $deadline ] || ! kill -0 "$daemon" 2>/dev/null; then
    echo "the daemon did not start:"; cat "$home/daemon.log"; exit 1
  fi
  sleep 0.2
done

echo "== ddpq submit resnet18 --gpus 2 (twice, at the same moment) ${data_flags[*]}"
echo "   (${DDPQ_DEMO_EPOCHS:-3} epochs each; a few minutes on a 2-core CPU)"
# A two-point learning-rate sweep: same model and data, each run on its own GPUs and port.
common=(--gpus 2 --epochs "$epochs" --batch-size 32 "${data_flags[@]}")
a=$(ddpq submit resnet18 --name resnet-lr0.05 --lr 0.05 "${common[@]}")
b=$(ddpq submit resnet18 --name resnet-lr0.2 --lr 0.2 "${common[@]}")
echo "submitted jobs $a and $b"

deadline=$((SECONDS + ${DDPQ_DEMO_TIMEOUT:-900}))
while :; do
  states=$(ddpq ls --all --json | python3 -c 'import json,sys; print(" ".join(j["state"] for j in json.load(sys.stdin)))')
  echo; echo "== $(date +%T)"; ddpq ls --all; echo; ddpq gpus
  case "$states" in *queued*|*starting*|*running*|*held*) ;; *) break ;; esac
  if [ $SECONDS -gt $deadline ]; then echo "demo timed out"; exit 1; fi
  sleep 5
done

echo
for job in "$a" "$b"; do ddpq show "$job"; echo; done
ddpq ls --all --json | python3 -c '
import json, sys
jobs = json.load(sys.stdin)
for j in jobs:
    acc = (j.get("progress") or {}).get("test_acc")
    shown = "%.1f%%" % (acc * 100) if isinstance(acc, (int, float)) else "n/a"
    print("job %s %s: %s, final test accuracy %s" % (j["id"], j["name"], j["state"], shown))
sys.exit(0 if all(j["state"] == "succeeded" for j in jobs) else 1)
'
