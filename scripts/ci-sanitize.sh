#!/usr/bin/env bash
# ASan + UBSan unit tests and bounded libFuzzer runs (tests/fuzz/README.md).
#
#   scripts/ci-sanitize.sh                 # what CI runs
#   FUZZ_SECONDS=600 scripts/ci-sanitize.sh --fuzz-only    # fuzz longer, skip the unit tests
#
# 1. configures a separate build dir (default build-sanitize/) with clang, -DEDIT_FUZZ=ON
#    and -DEDIT_SANITIZE=ON (the top-level CMake adds -fsanitize=address,undefined);
# 2. builds only what needs no LibTorch: runtime_unit_light, operator_unit,
#    operator_runtime_config, fuzz_replay_light, telemetry_garbage_test, and the fuzzers
#    (the checkpoint fuzzers compile runtime/src/train/checkpoint.cpp alone against LibTorch);
# 3. runs those unit tests (ctest -L unit) under ASan+UBSan (+LeakSanitizer when ptrace
#    allows it), halting on the first UB report;
# 4. runs each fuzzer for FUZZ_SECONDS (default 30) on its committed seed corpus plus a
#    working corpus kept in the build dir, failing on any crash, leak, timeout or OOM.
# Idempotent: rerunning reuses the build dir and the working corpora. Exit 0 only if all pass.
#
# Environment: EDIT_SANITIZE_BUILD (build dir), JOBS (default 2), FUZZ_SECONDS,
# FUZZERS (default "config editjob tokenfile checkpoint manifest kv_frame").
# Options: --fuzz-only, --unit-only, --no-fuzz (= --unit-only).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${EDIT_SANITIZE_BUILD:-$ROOT/build-sanitize}"
JOBS="${JOBS:-2}"
FUZZ_SECONDS="${FUZZ_SECONDS:-30}"
FUZZERS="${FUZZERS:-config editjob tokenfile checkpoint manifest kv_frame}"
UNIT_TARGETS="runtime_unit_light runtime_unit_minimal operator_unit operator_runtime_config fuzz_replay_light telemetry_garbage_test"
UNIT_DIRS="tests/runtime tests/operator tests/fuzz"
DO_UNIT=1
DO_FUZZ=1
for arg in "$@"; do
  case "$arg" in
    --fuzz-only) DO_UNIT=0 ;;
    --unit-only|--no-fuzz) DO_FUZZ=0 ;;
    -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
    *) echo "ci-sanitize: unknown option $arg" >&2; exit 2 ;;
  esac
done

T0=$(date +%s)
say() { printf '== ci-sanitize [%4ds]: %s\n' "$(( $(date +%s) - T0 ))" "$*"; }

# --- 0. tools ---------------------------------------------------------------------
CLANGXX="$(command -v clang++ || true)"
CLANG="$(command -v clang || true)"
if [[ -z "$CLANGXX" || -z "$CLANG" ]]; then
  echo "ci-sanitize: clang/clang++ not found; run scripts/install-deps.sh (packages clang, libclang-rt-14-dev)" >&2
  exit 1
fi
if ! ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a >/dev/null 2>&1; then
  echo "ci-sanitize: libFuzzer runtime missing; run scripts/install-deps.sh (libclang-rt-14-dev)" >&2
  exit 1
fi

# --- 1. configure -----------------------------------------------------------------
say "configure $BUILD (clang, EDIT_FUZZ=ON, EDIT_SANITIZE=ON)"
cmake -S "$ROOT" -B "$BUILD" -G Ninja \
  -DCMAKE_C_COMPILER="$CLANG" -DCMAKE_CXX_COMPILER="$CLANGXX" \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DEDIT_FUZZ=ON -DEDIT_SANITIZE=ON >"$BUILD.configure.log" 2>&1 \
  || { cat "$BUILD.configure.log"; echo "ci-sanitize: configure failed" >&2; exit 1; }

# --- 2. build ---------------------------------------------------------------------
targets=""
[[ $DO_UNIT == 1 ]] && targets="$UNIT_TARGETS"
if [[ $DO_FUZZ == 1 ]]; then
  for f in $FUZZERS; do targets="$targets fuzz_$f"; done
fi
say "build (-j$JOBS):$targets"
# shellcheck disable=SC2086
ninja -C "$BUILD" -j "$JOBS" $targets

# Sanitizer options. halt_on_error: the first UB report fails the test.
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
LSAN_SUPP="$ROOT/tests/fuzz/lsan.supp"
leaks=1
# LeakSanitizer needs ptrace; some containers forbid it. Probe with a built binary.
probe=("$BUILD/tests/fuzz/fuzz_replay_light" --gtest_list_tests)
[[ -x "${probe[0]}" ]] || probe=("$BUILD/tests/fuzz/fuzz_config" -runs=0)
if [[ -x "${probe[0]}" ]] && ! ASAN_OPTIONS=detect_leaks=1 "${probe[@]}" >/dev/null 2>"$BUILD.lsan-probe.log"; then
  if grep -q "LeakSanitizer has encountered a fatal error\|does not work under ptrace" "$BUILD.lsan-probe.log"; then
    leaks=0
    say "LeakSanitizer unavailable here (ptrace): running with detect_leaks=0"
  fi
fi
export ASAN_OPTIONS="detect_leaks=$leaks:strict_string_checks=1:check_initialization_order=1:detect_stack_use_after_return=1"
export LSAN_OPTIONS="suppressions=$LSAN_SUPP:print_suppressions=0"

fail=0

# --- 3. unit tests under ASan + UBSan ------------------------------------------------
if [[ $DO_UNIT == 1 ]]; then
  say "unit tests under ASan+UBSan (ASAN_OPTIONS=$ASAN_OPTIONS UBSAN_OPTIONS=$UBSAN_OPTIONS)"
  summary=""
  for d in $UNIT_DIRS; do
    log="$BUILD/ctest-$(echo "$d" | tr / -).log"
    if (cd "$BUILD/$d" && ctest -L unit --output-on-failure -j "$JOBS" --timeout 300) >"$log" 2>&1; then
      status=ok
    else
      status=FAILED
      fail=1
      cat "$log"
    fi
    line="$(grep -E 'tests passed|No tests were found' "$log" | tail -1)"
    summary="$summary  $d: ${line:-no ctest summary} [$status]"$'\n'
  done
  say "unit test summary (ctest -L unit, per directory):"
  printf '%s' "$summary"
fi

# --- 4. fuzzers -----------------------------------------------------------------------
if [[ $DO_FUZZ == 1 ]]; then
  for f in $FUZZERS; do
    bin="$BUILD/tests/fuzz/fuzz_$f"
    seeds="$ROOT/tests/fuzz/corpus/$f"
    work="$BUILD/fuzz/corpus/$f"        # grows across runs; not committed
    arts="$BUILD/fuzz/artifacts/$f"     # crash-*, leak-*, timeout-*, oom-* land here
    mkdir -p "$work" "$arts"
    dict=()
    [[ -f "$ROOT/tests/fuzz/dict/$f.dict" ]] && dict=(-dict="$ROOT/tests/fuzz/dict/$f.dict")
    log="$BUILD/fuzz/$f.log"
    say "fuzz_$f for ${FUZZ_SECONDS}s (seeds $seeds, working corpus $work)"
    if (cd "$arts" && "$bin" -max_total_time="$FUZZ_SECONDS" -timeout=10 -rss_limit_mb=2048 \
          -max_len=4096 -print_final_stats=1 -artifact_prefix="$arts/" "${dict[@]}" "$work" "$seeds") \
          >"$log" 2>&1; then
      say "fuzz_$f: $(grep -E '^Done [0-9]+ runs' "$log" | tail -1), corpus $(find "$work" -type f | wc -l) files"
    else
      fail=1
      tail -60 "$log"
      say "fuzz_$f FAILED; inputs in $arts:"
      ls -1 "$arts" | sed 's/^/    /'
      echo "    reproduce: $bin $arts/<file>   (see tests/fuzz/README.md)"
    fi
  done
fi

if [[ $fail == 0 ]]; then
  say "all passed"
else
  say "FAILED"
fi
exit $fail
