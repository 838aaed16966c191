#!/usr/bin/env bash
# Cloud TPU pod launcher for sagc_jax: check the preset fits (AOT, locally), create a
# TPU VM slice (directly or as a queued resource), set up every worker, run the same
# training command on all workers with the run directory in a bucket, follow it, resume
# it after preemptions, export the policy, delete the slice.
#
#   launch/tpu_pod.sh [options] ACTION [ACTION ...] [-- extra sagc_jax.train flags]
#
# Actions (run in the order given; "all" = aot create setup train export delete, with
# --watch on, so that export and delete wait for the run to complete):
#   aot      on THIS host, compile the preset for the slice's topology
#            (python -m sagc_jax.aot) and save the report, or read the one in
#            configs/aot/ compiled for the same digest (config, model, topology,
#            versions, program code); "train" refuses a preset that does not fit,
#            or one never checked, unless --force
#   create   create the slice (--queued: a queued resource, waits until ACTIVE)
#   setup    upload this repository (git archive of HEAD) to every worker and run
#            launch/install.sh there: a Python >= 3.11 venv (uv) with .[tpu,gcs]
#   train    start training on every worker (--worker=all) in the background;
#            with --watch, then watch the slice: after a preemption it recreates the
#            slice, runs setup and resumes the same gs:// workdir, until the run
#            completes or --max-restarts is reached
#   watch    the --watch loop on its own (for a run started earlier)
#   logs     follow process 0's log (Ctrl-C stops following, not the run)
#   copy     copy the run directory from the bucket to --local-dir (a convenience:
#            metrics, TensorBoard, summary and checkpoints are in the bucket already)
#   export   write the newest checkpoint as a Hugging Face folder to --export-dir
#   stop     stop the training processes on every worker (SIGTERM: they checkpoint first)
#   delete   delete the slice (or the queued resource)
#
# Options (defaults in brackets; environment variables of the same name in capitals
# with a SAGC_ prefix are read too, e.g. SAGC_PROJECT):
#   --project ID           GCP project                          [$SAGC_PROJECT]
#   --zone ZONE            zone, e.g. us-west4-a                 [$SAGC_ZONE]
#   --name NAME            TPU name                              [sagc-pod]
#   --accelerator TYPE     v4-N, v5litepod-N, v5p-N or v6e-N     [v5litepod-16]
#   --runtime VERSION      TPU software version        [by accelerator: v4
#                          tpu-ubuntu2204-base, v5litepod v2-alpha-tpuv5-lite,
#                          v5p v2-alpha-tpuv5, v6e v2-alpha-tpuv6e]
#   --topology TOPO        topology for "aot", e.g. v5e:4x4      [from --accelerator]
#   --config FILE          config file, relative to the repo     [configs/qwen2_5_3b.py]
#   --workdir GS_PATH      gs:// run directory: config, metrics, TensorBoard,
#                          summary, checkpoints                  (required for train)
#   --export-dir GS_PATH   where "export" writes                 [WORKDIR/export]
#   --local-dir DIR        where "copy" and "aot" write locally  [runs]
#   --venv DIR             the workers' virtual environment      [~/sagc_venv]
#   --queued               use a queued resource                 [off]
#   --spot                 Spot capacity (preemptible)           [off]
#   --reserved             capacity from your reservation        [off]
#   --watch                after "train", resume after preemptions
#   --max-restarts N       give up after N restarts              [5]
#   --poll SECONDS         how often --watch checks              [120]
#   --force                train even if "aot" found it does not fit, or never ran
#   --dry-run              print every command instead of running it
#
# Example (a full walk-through is in docs/scale.md):
#   launch/tpu_pod.sh --project my-proj --zone us-west4-a --accelerator v5litepod-16 \
#     --workdir gs://my-bucket/sagc/qwen --queued --spot --watch \
#     aot create setup train export delete -- \
#     --config.model.path=gs://my-bucket/models/Qwen2.5-3B \
#     --config.data.manual_dir=gs://my-bucket/data/gsm8k
set -euo pipefail
# shellcheck source=SCRIPTDIR/common.sh
source "$(dirname "$0")/common.sh"

project="${SAGC_PROJECT:-}"
zone="${SAGC_ZONE:-}"
name="${SAGC_NAME:-sagc-pod}"
accelerator="${SAGC_ACCELERATOR:-v5litepod-16}"
runtime="${SAGC_RUNTIME:-}"
topology="${SAGC_TOPOLOGY:-}"
config="${SAGC_CONFIG:-configs/qwen2_5_3b.py}"
workdir="${SAGC_WORKDIR:-}"
export_dir="${SAGC_EXPORT_DIR:-}"
local_dir="${SAGC_LOCAL_DIR:-runs}"
venv="${SAGC_VENV:-~/sagc_venv}"
local_python="${SAGC_LOCAL_PYTHON:-python3}"
max_restarts="${SAGC_MAX_RESTARTS:-5}"
poll="${SAGC_POLL:-120}"
queued=0
spot=0
reserved=0
watch=0
force=0
dry_run=0
actions=()
extra=()

usage() { sed -n '2,56p' "$0"; exit "${1:-0}"; }

while [[ $# -gt 0 ]]; do
  case "$1" in
    --project) project="$2"; shift 2 ;;
    --zone) zone="$2"; shift 2 ;;
    --name) name="$2"; shift 2 ;;
    --accelerator) accelerator="$2"; shift 2 ;;
    --runtime) runtime="$2"; shift 2 ;;
    --topology) topology="$2"; shift 2 ;;
    --config) config="$2"; shift 2 ;;
    --workdir) workdir="$2"; shift 2 ;;
    --export-dir) export_dir="$2"; shift 2 ;;
    --local-dir) local_dir="$2"; shift 2 ;;
    --venv) venv="$2"; shift 2 ;;
    --max-restarts) max_restarts="$2"; shift 2 ;;
    --poll) poll="$2"; shift 2 ;;
    --queued) queued=1; shift ;;
    --spot) spot=1; shift ;;
    --reserved) reserved=1; shift ;;
    --watch) watch=1; shift ;;
    --force) force=1; shift ;;
    --dry-run) dry_run=1; shift ;;
    -h|--help) usage 0 ;;
    --) shift; extra=("$@"); break ;;
    aot|create|setup|train|watch|logs|copy|export|stop|delete) actions+=("$1"); shift ;;
    all) actions+=(aot create setup train export delete); watch=1; shift ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
[[ ${#actions[@]} -gt 0 ]] || die "no action given (see --help)"
[[ -n "$project" ]] || die "--project is required"
[[ -n "$zone" ]] || die "--zone is required"
[[ "$max_restarts" =~ ^[0-9]+$ ]] || die "--max-restarts '$max_restarts' must be an integer >= 0"
[[ "$poll" =~ ^[1-9][0-9]*$ ]] || die "--poll '$poll' must be a positive integer (seconds)"
[[ $spot -eq 1 && $reserved -eq 1 ]] && die "--spot and --reserved exclude each other"
if [[ -n "$workdir" && "$workdir" != gs://* ]]; then
  die "--workdir '$workdir' must be a gs:// path (every worker, and every restart, shares it)"
fi
export_dir="${export_dir:-${workdir:+$workdir/export}}"
repo="$(cd "$(dirname "$0")/.." && pwd)"

# Accelerator family -> (runtime version, AOT generation, chips per type number).
# Runtime versions: https://cloud.google.com/tpu/docs/runtimes (JAX rows).
family="${accelerator%-*}"
size="${accelerator##*-}"
[[ "$size" =~ ^[0-9]+$ ]] || die "--accelerator '$accelerator' must look like v5litepod-16, v4-32, v5p-8 or v6e-16"
case "$family" in
  v4) default_runtime=tpu-ubuntu2204-base; generation=v4; chips=$((size / 2)) ;;
  v5p) default_runtime=v2-alpha-tpuv5; generation=v5p; chips=$((size / 2)) ;;
  v5litepod) default_runtime=v2-alpha-tpuv5-lite; generation=v5e; chips=$size ;;
  v6e) default_runtime=v2-alpha-tpuv6e; generation=v6e; chips=$size ;;
  *) die "--accelerator '$accelerator': family '$family' is not one of v4, v5litepod, v5p, v6e" ;;
esac
runtime="${runtime:-$default_runtime}"

# The slice's topology for AOT compilation (the shapes Cloud TPU documents per size).
default_topology() {
  local dims
  case "$generation:$chips" in
    v5e:1|v6e:1) dims=1x1 ;;
    v5e:4|v6e:4) dims=2x2 ;;
    v5e:8|v6e:8) dims=2x4 ;;
    v5e:16|v6e:16) dims=4x4 ;;
    v5e:32|v6e:32) dims=4x8 ;;
    v5e:64|v6e:64) dims=8x8 ;;
    v5e:128|v6e:128) dims=8x16 ;;
    v5e:256|v6e:256) dims=16x16 ;;
    v4:4|v5p:4) dims=2x2x1 ;;
    v4:8|v5p:8) dims=2x2x2 ;;
    v4:16|v5p:16) dims=2x2x4 ;;
    v4:32|v5p:32) dims=2x4x4 ;;
    v4:64|v5p:64) dims=4x4x4 ;;
    v4:128|v5p:128) dims=4x4x8 ;;
    v4:256|v5p:256) dims=4x8x8 ;;
    *) die "no default topology for $accelerator ($chips chips); pass --topology GEN:AxB[xC]" ;;
  esac
  echo "$generation:$dims"
}
aot_report="$local_dir/aot_${name}.json"

gcloud_tpu=(gcloud compute tpus tpu-vm --project="$project" --zone="$zone")
qr=(gcloud compute tpus queued-resources --project="$project" --zone="$zone")
ssh_all() { run "${gcloud_tpu[@]:0:4}" ssh "$name" "${gcloud_tpu[@]:4}" --worker=all --command="$1"; }
ssh_one() { run "${gcloud_tpu[@]:0:4}" ssh "$name" "${gcloud_tpu[@]:4}" --worker=0 --command="$1"; }

capacity_flags() {
  [[ $spot -eq 1 ]] && echo --spot
  [[ $reserved -eq 1 ]] && echo --reserved
  return 0
}

do_aot() {
  topology="${topology:-$(default_topology)}"
  local overrides=() arg
  for arg in "${extra[@]}"; do [[ "$arg" == --config.* ]] && overrides+=("$arg"); done
  run mkdir -p "$local_dir"
  echo "compiling $config for $topology on this host (no TPU needed; minutes, up to an hour" \
       "at 8B), unless configs/aot/ holds a report compiled for the same digest"
  if ! run env JAX_PLATFORMS=cpu "$local_python" -m sagc_jax.aot --config="$repo/$config" \
      --topology="$topology" --largest_only --reuse="$repo/configs/aot" --out="$aot_report" \
      "${overrides[@]}"; then
    [[ $force -eq 1 ]] && { echo "warning: $config does not fit $topology; going on (--force)"; return; }
    die "$config does not fit $topology (report: $aot_report); change the preset or pass --force"
  fi
}

# Refuses to train a preset that the aot action found too big, or never checked.
check_aot() {
  [[ $force -eq 1 || $dry_run -eq 1 ]] && return
  [[ -f "$aot_report" ]] || die "no pre-flight report $aot_report: run the 'aot' action first (or pass --force)"
  "$local_python" - "$aot_report" <<'EOF' || die "$config does not fit (see $aot_report); pass --force to train anyway"
import json, sys
report = json.load(open(sys.argv[1]))
if not report["fits"]:
    print("pre-flight: does not fit:", ", ".join(report["not_fitting"]), file=sys.stderr)
    sys.exit(1)
EOF
}

do_create() {
  local capacity
  mapfile -t capacity < <(capacity_flags)
  if [[ $queued -eq 1 ]]; then
    run "${qr[@]:0:4}" create "${name}-qr" "${qr[@]:4}" --node-id="$name" \
      --accelerator-type="$accelerator" --runtime-version="$runtime" "${capacity[@]}"
    [[ $dry_run -eq 1 ]] && return
    local state=""
    until [[ "$state" == "ACTIVE" ]]; do
      state="$(qr_state)"
      echo "queued resource ${name}-qr: ${state:-unknown}"
      case "$state" in FAILED|SUSPENDED) die "queued resource is $state" ;; esac
      [[ "$state" == "ACTIVE" ]] || sleep 30
    done
  else
    run "${gcloud_tpu[@]:0:4}" create "$name" "${gcloud_tpu[@]:4}" \
      --accelerator-type="$accelerator" --version="$runtime" "${capacity[@]}"
  fi
}

do_setup() {
  local archive="/tmp/sagc_jax_${name}.tar.gz"
  run git -C "$repo" archive --format=tar.gz --prefix=sagc_jax/ -o "$archive" HEAD
  run "${gcloud_tpu[@]:0:4}" scp "$archive" "${name}:~/sagc_jax.tar.gz" "${gcloud_tpu[@]:4}" \
    --worker=all
  ssh_all "rm -rf ~/sagc_jax && tar xzf ~/sagc_jax.tar.gz -C ~ && \
bash ~/sagc_jax/launch/install.sh --venv $venv --extras tpu,gcs"
}

do_train() {
  [[ -n "$workdir" ]] || die "--workdir gs://... is required for train"
  check_aot
  local flags arg
  flags="--config=$config --workdir=$workdir --distributed"
  for arg in "${extra[@]}"; do flags+=" $(printf '%q' "$arg")"; done
  ssh_all "mkdir -p ~/runs && cd ~/sagc_jax && nohup $venv/bin/python -m sagc_jax.train \
$flags >> ~/runs/$name.log 2>&1 < /dev/null &"
  echo "training started on every worker of $name; follow it with: $0 --project $project --zone $zone --name $name logs"
  if [[ $watch -eq 1 ]]; then do_watch; fi
}

qr_state() {
  "${qr[@]:0:4}" describe "${name}-qr" "${qr[@]:4}" --format='value(state.state)' 2>/dev/null || echo GONE
}
node_state() {
  "${gcloud_tpu[@]:0:4}" describe "$name" "${gcloud_tpu[@]:4}" --format='value(state)' 2>/dev/null || echo GONE
}
# A run is complete when its summary says it was not preempted (trainer.summary()).
run_complete() {
  gcloud storage cat "$workdir/summary.json" 2>/dev/null | grep -q '"preempted": false'
}
train_running() {
  "${gcloud_tpu[@]:0:4}" ssh "$name" "${gcloud_tpu[@]:4}" --worker=0 \
    --command="pgrep -f '[s]agc_jax.train' > /dev/null" 2>/dev/null
}

# Polls until the run completes; recreates the slice and resumes after a preemption.
do_watch() {
  [[ -n "$workdir" ]] || die "--workdir gs://... is required for watch"
  if [[ $dry_run -eq 1 ]]; then
    echo "# watch: every ${poll}s check $workdir/summary.json and the slice's state; after a preemption: delete, create, setup, train (at most $max_restarts restarts)"
    return
  fi
  local restarts=0 state
  while true; do
    sleep "$poll"
    if run_complete; then echo "watch: the run in $workdir is complete"; return; fi
    if [[ $queued -eq 1 ]]; then state="$(qr_state)"; else state="$(node_state)"; fi
    case "$state" in
      ACTIVE|READY)
        if ! train_running && ! run_complete; then
          die "watch: $name is $state but training is not running and $workdir/summary.json does not say complete; see: $0 --project $project --zone $zone --name $name logs"
        fi
        echo "watch: $(date -u +%H:%M:%S) $name $state, training" ;;
      WAITING_FOR_RESOURCES|PROVISIONING|CREATING|ACCEPTED|STARTING|RESTARTING|REPAIRING)
        echo "watch: $(date -u +%H:%M:%S) $name $state, waiting" ;;
      *)
        restarts=$((restarts + 1))
        if [[ $restarts -gt $max_restarts ]]; then
          die "watch: $name is $state; giving up after $max_restarts restarts (--max-restarts)"
        fi
        echo "watch: $(date -u +%H:%M:%S) $name is $state (preempted?): restart $restarts/$max_restarts — recreating and resuming $workdir"
        do_delete || true
        do_create
        do_setup
        watch=0 force=1 do_train ;;
    esac
  done
}

do_logs() { ssh_one "tail -n 200 -F ~/runs/$name.log"; }

do_copy() {
  [[ -n "$workdir" ]] || die "--workdir gs://... is required for copy"
  run mkdir -p "$local_dir/$name"
  run gcloud storage rsync --recursive "$workdir" "$local_dir/$name"
}

do_export() {
  [[ -n "$workdir" ]] || die "--workdir gs://... is required for export"
  ssh_one "cd ~/sagc_jax && JAX_PLATFORMS=cpu $venv/bin/python -m sagc_jax.export \
--workdir=$workdir --out=$export_dir"
}

# '[s]agc' keeps pkill from matching the remote shell that runs it.
do_stop() { ssh_all "pkill -TERM -f '[s]agc_jax.train' || true"; }

do_delete() {
  if [[ $queued -eq 1 ]]; then
    run "${qr[@]:0:4}" delete "${name}-qr" "${qr[@]:4}" --force --quiet
  else
    run "${gcloud_tpu[@]:0:4}" delete "$name" "${gcloud_tpu[@]:4}" --quiet
  fi
}

for action in "${actions[@]}"; do
  echo "== $action ($name, $accelerator, runtime $runtime, $zone)"
  "do_$action"
done
