#!/usr/bin/env bash
# Helpers shared by the launch scripts (sourced, not run).

# run CMD...: runs the command, or prints it shell-quoted when dry_run=1.
run() {
  if [[ "${dry_run:-0}" -eq 1 ]]; then
    printf '+'
    printf ' %q' "$@"
    printf '\n'
  else
    "$@"
  fi
}

# die MESSAGE: prints "error: MESSAGE" and exits with status 2 (bad usage).
die() { echo "error: $*" >&2; exit 2; }
