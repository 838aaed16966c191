#!/usr/bin/env bash
# Single-host GPU launcher for sagc_jax: same entry point as the TPU and CPU runs.
#
#   launch/gpu_single_host.sh [--install] [--dry-run] --config FILE --workdir DIR
#       [-- extra sagc_jax.train flags, e.g. --config.mesh.shape="(-1,1)"]
#
#   --install   pip install this repository with jax[cuda12] first
#   --dry-run   print the commands instead of running them
#
# All visible GPUs form the mesh (config mesh.shape, -1 = remaining devices). XLA is
# told to preallocate 90% of GPU memory (override XLA_PYTHON_CLIENT_MEM_FRACTION).
set -euo pipefail
# shellcheck source=SCRIPTDIR/common.sh
source "$(dirname "$0")/common.sh"

install=0
dry_run=0
config=""
workdir=""
extra=()
usage() { sed -n '2,12p' "$0"; exit "${1:-0}"; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --install) install=1; shift ;;
    --dry-run) dry_run=1; shift ;;
    --config) config="$2"; shift 2 ;;
    --workdir) workdir="$2"; shift 2 ;;
    -h|--help) usage 0 ;;
    --) shift; extra=("$@"); break ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
[[ -n "$config" ]] || die "--config is required"
[[ -n "$workdir" ]] || die "--workdir is required"
repo="$(cd "$(dirname "$0")/.." && pwd)"


if [[ $install -eq 1 ]]; then
  run python3 -m pip install -e "$repo" "jax[cuda12]"
fi
export XLA_PYTHON_CLIENT_MEM_FRACTION="${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.9}"
run python3 -m sagc_jax.train --config="$config" --workdir="$workdir" "${extra[@]}"
