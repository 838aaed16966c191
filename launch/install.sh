#!/usr/bin/env bash
# Installs sagc_jax into a Python >= 3.11 virtual environment (one TPU VM worker, or
# any host). TPU VM images ship Python 3.10 (tpu-ubuntu2204-base and the v2-alpha-*
# runtimes), which setup.py refuses, so the environment comes from uv (from PyPI): it
# uses a local Python of the requested version, or downloads a standalone build.
#
#   launch/install.sh [--venv DIR] [--python SPEC] [--extras LIST] [--dry-run]
#
#   --venv DIR       the virtual environment; created when DIR/bin/python is missing,
#                    reused otherwise (a re-run after a preemption only reinstalls
#                    the project)                              [~/sagc_venv]
#   --python SPEC    uv's interpreter request: a version or a path    [3.11]
#   --extras LIST    setup.py extras to install                  [tpu,gcs]
#   --dry-run        print the commands instead of running them
#
# The project is installed with pip inside the environment: pip install -e ".[EXTRAS]".
set -euo pipefail
# shellcheck source=SCRIPTDIR/common.sh
source "$(dirname "$0")/common.sh"

venv="${SAGC_VENV:-$HOME/sagc_venv}"
python_spec="${SAGC_PYTHON:-3.11}"
extras="${SAGC_EXTRAS:-tpu,gcs}"
dry_run=0
repo="$(cd "$(dirname "$0")/.." && pwd)"

while [[ $# -gt 0 ]]; do
  case "$1" in
    --venv) venv="$2"; shift 2 ;;
    --python) python_spec="$2"; shift 2 ;;
    --extras) extras="$2"; shift 2 ;;
    --dry-run) dry_run=1; shift ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
[[ "$extras" =~ ^[a-z,]*$ ]] || die "--extras '$extras' must be a comma-separated list (e.g. tpu,gcs)"

if [[ ! -x "$venv/bin/python" ]]; then
  if ! command -v uv > /dev/null && [[ $dry_run -eq 0 ]]; then
    echo "installing uv (from PyPI) for the Python >= 3.11 environment"
    python3 -m pip install --user --quiet --upgrade uv
    export PATH="$HOME/.local/bin:$PATH"
  fi
  run uv venv --seed --python "$python_spec" "$venv"
fi
if [[ $dry_run -eq 0 ]]; then
  "$venv/bin/python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
    die "$venv has Python $("$venv/bin/python" -c 'import platform; print(platform.python_version())'); sagc_jax needs >= 3.11 (remove it, or pass --venv for a new one)"
fi
target="$repo"
[[ -n "$extras" ]] && target="${repo}[$extras]"
run "$venv/bin/python" -m pip install -e "$target"
run "$venv/bin/python" -c "import jax, sagc_jax, sys; print('sagc_jax installed: Python', sys.version.split()[0], '| jax', jax.__version__, '| backend', jax.default_backend())"
