#!/usr/bin/env bash
# The EDiT benchmark sweep: bench/run.sh [--quick] [options]; see bench/README.md
# and `bench/run.sh --help`. Needs build/runtime/edit-train and build/bench/edit-gemm-bench
# (ninja -C build edit-train edit-gemm-bench); root for the limited-link scenarios.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cleanup() {
  # The driver removes its namespaces itself; this catches a driver killed hard.
  if [[ $(id -u) -eq 0 ]]; then python3 "$here/run.py" --cleanup-netns || true; fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
python3 "$here/run.py" "$@"
