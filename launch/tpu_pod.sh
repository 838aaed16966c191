#!/usr/bin/env bash
# Cloud TPU pod launcher for sagc_jax: create a TPU VM slice (directly or as a queued
# resource), set up every worker, run the same training command on all workers, follow
# the logs, copy results, stop and delete.
#
#   launch/tpu_pod.sh [options] ACTION [ACTION ...] [-- extra sagc_jax.train flags]
#
# Actions (run in the order given; "all" = create setup train logs copy delete):
#   create   create the slice (--queued: a queued resource, waits until ACTIVE)
#   setup    upload this repository (git archive of HEAD) to every worker and install it
#            with jax[tpu]
#   train    start the training command on every worker (--worker=all) in the background
#   logs     follow process 0's log (Ctrl-C stops following, not the run)
#   copy     copy worker 0's run directory (metrics, summary, plots) to --local-dir
#   stop     stop the training processes on every worker (SIGTERM: they checkpoint first)
#   delete   delete the slice (or the queued resource)
#
# Options (defaults in brackets; environment variables of the same name in capitals
# with a SAGC_ prefix are read too, e.g. SAGC_PROJECT):
#   --project ID           GCP project                       [$SAGC_PROJECT]
#   --zone ZONE            zone, e.g. us-central2-b           [$SAGC_ZONE]
#   --name NAME            TPU name                           [sagc-pod]
#   --accelerator TYPE     accelerator type, e.g. v4-32       [v4-32]
#   --runtime VERSION      TPU VM runtime version             [tpu-ubuntu2204-base]
#   --config FILE          config file, relative to the repo  [configs/qwen2_5_3b.py]
#   --workdir GS_PATH      gs:// bucket path for checkpoints  (required for train)
#   --run NAME             run name (worker-local dir ~/runs/NAME)  [same as --name]
#   --local-dir DIR        where "copy" puts results          [runs/]
#   --queued               use a queued resource               [off]
#   --spot                 spot / preemptible capacity         [off]
#   --dry-run              print every command instead of running it
#
# Example (a full walk-through is in README.md, "Cloud TPU pods"):
#   launch/tpu_pod.sh --project my-proj --zone us-central2-b --accelerator v4-32 \
#     --workdir gs://my-bucket/sagc/qwen --queued create setup train logs -- \
#     --config.model.path=/mnt/ckpt/Qwen2.5-3B --config.data.manual_dir=/mnt/data/gsm8k
set -euo pipefail
# shellcheck source=SCRIPTDIR/common.sh
source "$(dirname "$0")/common.sh"

project="${SAGC_PROJECT:-}"
zone="${SAGC_ZONE:-}"
name="${SAGC_NAME:-sagc-pod}"
accelerator="${SAGC_ACCELERATOR:-v4-32}"
runtime="${SAGC_RUNTIME:-tpu-ubuntu2204-base}"
config="${SAGC_CONFIG:-configs/qwen2_5_3b.py}"
workdir="${SAGC_WORKDIR:-}"
run_name="${SAGC_RUN:-}"
local_dir="${SAGC_LOCAL_DIR:-runs}"
queued=0
spot=0
dry_run=0
actions=()
extra=()

usage() { sed -n '2,36p' "$0"; exit "${1:-0}"; }

while [[ $# -gt 0 ]]; do
  case "$1" in
    --project) project="$2"; shift 2 ;;
    --zone) zone="$2"; shift 2 ;;
    --name) name="$2"; shift 2 ;;
    --accelerator) accelerator="$2"; shift 2 ;;
    --runtime) runtime="$2"; shift 2 ;;
    --config) config="$2"; shift 2 ;;
    --workdir) workdir="$2"; shift 2 ;;
    --run) run_name="$2"; shift 2 ;;
    --local-dir) local_dir="$2"; shift 2 ;;
    --queued) queued=1; shift ;;
    --spot) spot=1; shift ;;
    --dry-run) dry_run=1; shift ;;
    -h|--help) usage 0 ;;
    --) shift; extra=("$@"); break ;;
    create|setup|train|logs|copy|stop|delete) actions+=("$1"); shift ;;
    all) actions+=(create setup train logs copy delete); shift ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
[[ ${#actions[@]} -gt 0 ]] || die "no action given (see --help)"
[[ -n "$project" ]] || die "--project is required"
[[ -n "$zone" ]] || die "--zone is required"
run_name="${run_name:-$name}"
repo="$(cd "$(dirname "$0")/.." && pwd)"


gcloud_tpu=(gcloud compute tpus tpu-vm --project="$project" --zone="$zone")
ssh_all() { run "${gcloud_tpu[@]:0:4}" ssh "$name" "${gcloud_tpu[@]:4}" --worker=all --command="$1"; }
ssh_one() { run "${gcloud_tpu[@]:0:4}" ssh "$name" "${gcloud_tpu[@]:4}" --worker=0 --command="$1"; }

do_create() {
  local capacity=()
  [[ $spot -eq 1 ]] && capacity=(--spot)
  if [[ $queued -eq 1 ]]; then
    run gcloud compute tpus queued-resources create "${name}-qr" --project="$project" \
      --zone="$zone" --node-id="$name" --accelerator-type="$accelerator" \
      --runtime-version="$runtime" "${capacity[@]}"
    if [[ $dry_run -eq 1 ]]; then
      run gcloud compute tpus queued-resources describe "${name}-qr" --project="$project" \
        --zone="$zone" --format='value(state.state)'
      return
    fi
    local state=""
    until [[ "$state" == "ACTIVE" ]]; do
      state="$(gcloud compute tpus queued-resources describe "${name}-qr" \
        --project="$project" --zone="$zone" --format='value(state.state)')"
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
  ssh_all "rm -rf ~/sagc_jax && tar xzf ~/sagc_jax.tar.gz -C ~ && cd ~/sagc_jax && \
python3 -m pip install -U pip && python3 -m pip install -e . 'jax[tpu]' \
-f https://storage.googleapis.com/jax-releases/libtpu_releases.html"
}

do_train() {
  [[ "$workdir" == gs://* ]] || die "--workdir must be a gs:// path (checkpoints are shared by every host)"
  local flags
  flags="--config=$config --workdir=\$HOME/runs/$run_name --distributed \
--config.train.checkpoint_dir=$workdir/checkpoints"
  local arg
  for arg in "${extra[@]}"; do flags+=" $(printf '%q' "$arg")"; done
  ssh_all "mkdir -p ~/runs && cd ~/sagc_jax && nohup python3 -m sagc_jax.train $flags \
> ~/runs/$run_name.log 2>&1 < /dev/null &"
  echo "training started on every worker of $name; follow it with: $0 --project $project --zone $zone --name $name logs"
}

do_logs() { ssh_one "tail -n 200 -F ~/runs/$run_name.log"; }

do_copy() {
  run mkdir -p "$local_dir"
  run "${gcloud_tpu[@]:0:4}" scp --recurse "${name}:~/runs/$run_name" "$local_dir/" \
    "${gcloud_tpu[@]:4}" --worker=0
  if [[ -n "$workdir" ]]; then
    ssh_one "gsutil -m rsync -r ~/runs/$run_name $workdir/run"
  fi
}

# '[s]agc' keeps pkill from matching the remote shell that runs it.
do_stop() { ssh_all "pkill -TERM -f '[s]agc_jax.train' || true"; }

do_delete() {
  if [[ $queued -eq 1 ]]; then
    run gcloud compute tpus queued-resources delete "${name}-qr" --project="$project" \
      --zone="$zone" --force --quiet
  else
    run "${gcloud_tpu[@]:0:4}" delete "$name" "${gcloud_tpu[@]:4}" --quiet
  fi
}

for action in "${actions[@]}"; do
  echo "== $action ($name, $accelerator, $zone)"
  "do_$action"
done
