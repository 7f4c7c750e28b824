#!/usr/bin/env bash
# ThreadSanitizer over the project's own concurrent servers: the job store (its epoll
# loop, sessions, waits and limits) and the idle-connection-proof HTTP server.
#
#   scripts/ci-tsan.sh          # what make test runs
#
# Configures build-tsan/ with clang and -DEDIT_TSAN=ON, builds runtime_unit_light (no
# LibTorch) and runs its store and HTTP server tests, halting on the first data race.
# The telemetry tests in the same binary are left out: they run gRPC, whose library is
# not built with TSan, so its own synchronization would show as races.
# Environment: EDIT_TSAN_BUILD (build dir), JOBS (default 2).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${EDIT_TSAN_BUILD:-$ROOT/build-tsan}"
JOBS="${JOBS:-2}"
FILTER='Kv*:*KvSemantics*:HttpServer*'
CLANG="$(command -v clang || true)"; CLANGXX="$(command -v clang++ || true)"
[[ -n "$CLANG" && -n "$CLANGXX" ]] || { echo "ci-tsan: clang not found; run scripts/install-deps.sh" >&2; exit 1; }

T0=$(date +%s)
say() { printf '== ci-tsan [%4ds]: %s\n' "$(( $(date +%s) - T0 ))" "$*"; }
say "configure $BUILD (clang, EDIT_TSAN=ON)"
cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_C_COMPILER="$CLANG" -DCMAKE_CXX_COMPILER="$CLANGXX" \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DEDIT_TSAN=ON >"$BUILD.configure.log" 2>&1 \
  || { cat "$BUILD.configure.log"; echo "ci-tsan: configure failed" >&2; exit 1; }
say "build runtime_unit_light (-j$JOBS)"
ninja -C "$BUILD" -j "$JOBS" runtime_unit_light
# halt_on_error: the first race fails the run; second_deadlock_stack for lock-order reports.
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:history_size=4"
say "run the store and HTTP server tests under TSan ($FILTER)"
listed=$("$BUILD/tests/runtime/runtime_unit_light" --gtest_list_tests --gtest_filter="$FILTER" | grep -c '^  ' || true)
if [[ "$listed" -eq 0 ]]; then
  echo "ci-tsan: the filter $FILTER selects no test (renamed suites?)" >&2
  exit 1
fi
"$BUILD/tests/runtime/runtime_unit_light" --gtest_filter="$FILTER" --gtest_brief=1
say "ok: $listed tests race-free under ThreadSanitizer"
