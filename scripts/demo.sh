#!/usr/bin/env bash
# The main demo: a daemon on a temporary home, a two-point learning-rate sweep of ResNet18
# DDP jobs submitted in one call, each on its own GPUs and rendezvous port, watched to the
# end, then the sweep's table with the better run first.
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
# In a session of its own: a Ctrl-C at the terminal reaches this script, whose cleanup
# then ends the demo's jobs through the daemon and stops it, not the daemon first.
setsid ddpq serve --home "$home" --port "$port" "${gpu_flags[@]}" "${root_flags[@]}" --grace 5s \
  >"$home/daemon.log" 2>&1 &
daemon=$!
# The home is temporary: removed once the demo has succeeded (its database keeps a 64 MiB
# reserve for a full disk, left in /tmp by every run otherwise). Kept when asked
# (DDPQ_DEMO_KEEP=1) or when the demo failed, for its daemon.log.
cleanup() {
  local status=$?
  if [ "$status" != 0 ]; then
    # Jobs outlive their daemon (a restart adopts them again): a demo that failed or was
    # interrupted ends its own first, so that no training goes on behind it.
    ddpq cancel --mine >/dev/null 2>&1 || true
    local until=$((SECONDS + 30))
    while [ $SECONDS -lt $until ] && [ "$(ddpq ls --json 2>/dev/null || echo '[]')" != "[]" ]; do
      sleep 0.5
    done
  fi
  kill -TERM "$daemon" 2>/dev/null || true
  wait "$daemon" 2>/dev/null || true
  if [ "$status" = 0 ] && [ -z "${DDPQ_DEMO_KEEP:-}" ]; then
    rm -rf "$home"
    echo "== daemon stopped; its temporary home removed (DDPQ_DEMO_KEEP=1 keeps it)"
  else
    echo "== daemon stopped; its state folder is $home (its log: $home/daemon.log)"
  fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

deadline=$((SECONDS + 60))
until ddpq ls >/dev/null 2>&1; do
  if [ $SECONDS -gt $deadline ] || ! kill -0 "$daemon" 2>/dev/null; then
    echo "the daemon did not start:"; cat "$home/daemon.log"; exit 1
  fi
  sleep 0.2
done

echo "== ddpq submit --sweep lr=0.05,0.2 resnet18 --gpus 2 ${data_flags[*]}"
echo "   (${DDPQ_DEMO_EPOCHS:-3} epochs each; a few minutes on a 2-core CPU)"
# Same model and data, two learning rates: one sweep, each job on its own GPUs and port.
sweep=$(ddpq submit --sweep lr=0.05,0.2 --name resnet-lr resnet18 --gpus 2 \
  --epochs "$epochs" --batch-size 32 "${data_flags[@]}")
echo "submitted sweep $sweep"

deadline=$((SECONDS + ${DDPQ_DEMO_TIMEOUT:-900}))
while :; do
  active=$(ddpq ls --json)  # the jobs not ended yet: [] once all have
  echo; echo "== $(date +%T)"; ddpq ls --all --expand; echo; ddpq gpus
  [ "$active" = "[]" ] && break
  if [ $SECONDS -gt $deadline ]; then echo "demo timed out"; exit 1; fi
  sleep 5
done

echo
echo "== ddpq show $sweep --sort -test_acc"
ddpq show "$sweep" --sort -test_acc
ddpq show "$sweep" --json | python3 -c '
import json, signal, sys
signal.signal(signal.SIGINT, signal.SIG_DFL)  # a Ctrl-C ends it quietly, as the demo
sweep = json.load(sys.stdin)
sys.exit(0 if sweep["counts"] == {"succeeded": sweep["size"]} else 1)
'
