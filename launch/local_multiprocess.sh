#!/usr/bin/env bash
# Runs one sagc_jax command as N local JAX processes (multi-host rehearsal on CPU).
#
#   launch/local_multiprocess.sh [-n NUM_PROCESSES] [-d DEVICES_PER_PROCESS] [-p PORT]
#       [-l LOG_DIR] [-t HEARTBEAT_S] -- python -m sagc_jax.train --config configs/tiny_cpu.py
#       --workdir DIR
#
# Every process runs the same command with SAGC_COORDINATOR / SAGC_NUM_PROCESSES /
# SAGC_PROCESS_ID / SAGC_LOCAL_DEVICES set; sagc_jax.runtime.distributed.initialize() turns them
# into jax.distributed.initialize(...) with DEVICES_PER_PROCESS CPU devices each. If one
# process dies, the others end within HEARTBEAT_S seconds [10] (SAGC_HEARTBEAT_TIMEOUT_S).
# Output of process i goes to LOG_DIR/process_i.log (process 0 is also echoed). The
# script exits with the first non-zero exit status of any process (0 if all succeed).
set -euo pipefail

num_processes=2
devices=2
port=$((20000 + RANDOM % 20000))
log_dir=""
heartbeat="${SAGC_HEARTBEAT_TIMEOUT_S:-10}"
usage() { sed -n '2,14p' "$0"; exit "${1:-0}"; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    -n) num_processes="$2"; shift 2 ;;
    -d) devices="$2"; shift 2 ;;
    -p) port="$2"; shift 2 ;;
    -l) log_dir="$2"; shift 2 ;;
    -t) heartbeat="$2"; shift 2 ;;
    -h|--help) usage 0 ;;
    --) shift; break ;;
    *) echo "error: unknown option $1" >&2; usage 2 ;;
  esac
done
[[ $# -gt 0 ]] || { echo "error: no command after --" >&2; usage 2; }
[[ "$num_processes" =~ ^[1-9][0-9]*$ ]] || { echo "error: -n $num_processes" >&2; exit 2; }
[[ "$devices" =~ ^[1-9][0-9]*$ ]] || { echo "error: -d $devices" >&2; exit 2; }
[[ "$heartbeat" =~ ^[1-9][0-9]*$ ]] || { echo "error: -t $heartbeat (seconds >= 1)" >&2; exit 2; }
log_dir="${log_dir:-$(mktemp -d -t sagc_procs.XXXXXX)}"
mkdir -p "$log_dir"

pids=()
for ((i = 0; i < num_processes; i++)); do
  # The fake-device XLA flag of the test suite would fight jax_num_cpu_devices.
  env -u XLA_FLAGS SAGC_COORDINATOR="127.0.0.1:${port}" SAGC_NUM_PROCESSES="$num_processes" \
    SAGC_PROCESS_ID="$i" SAGC_LOCAL_DEVICES="$devices" \
    SAGC_HEARTBEAT_TIMEOUT_S="$heartbeat" "$@" >"$log_dir/process_$i.log" 2>&1 &
  pids+=("$!")
done
trap 'kill "${pids[@]}" 2>/dev/null || true' INT TERM
echo "started $num_processes processes (logs in $log_dir); following process 0"
tail -n +1 -f "$log_dir/process_0.log" --pid="${pids[0]}" || true

status=0
for ((i = 0; i < num_processes; i++)); do
  code=0
  wait "${pids[$i]}" || code=$?
  if [[ $code -ne 0 ]]; then
    echo "process $i exited with status $code (log: $log_dir/process_$i.log)" >&2
    [[ $status -ne 0 ]] || status=$code
  fi
done
exit "$status"
