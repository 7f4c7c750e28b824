#!/usr/bin/env bash
# One prepared GPU verification: on a machine that has a CUDA PyTorch (its
# LibTorch and NCCL), CMake, ninja and nvcc but none of this project's Debian -dev
# packages and no network, build edit-train/edit-run and run them with NCCL; print
# tokens/s, MFU, the synchronization's share of the step time and peak GPU memory.
#
# On a machine with Debian's mirror (here), once:
#   scripts/gpu-smoke.sh --prepare     # fills build/gpu-carry: nlohmann-json (Debian's
#                                      # header package, unpacked) and yaml-cpp's sources
#                                      # (Debian's source package), built there with the runtime
# On the GPU machine, with build/gpu-carry and data/brown copied beside the checkout:
#   scripts/gpu-smoke.sh [--out DIR]   # ~4-5 minutes; writes DIR/gpu.md (and the logs)
# Without a GPU:
#   scripts/gpu-smoke.sh --dry-run     # arguments, carried dependencies, the CMake
#                                      # configuration of that build, the run plan
#
# Options:
#   --carry DIR         carried dependencies (default build/gpu-carry)
#   --build DIR         build tree (default build-gpu)
#   --out DIR           report and logs (default <build>/smoke)
#   --torch-prefix DIR  CMake prefix of LibTorch (default: python3's torch.utils.cmake_prefix_path)
#   --torch-dir DIR     PyTorch's package directory, with include/ and lib/ (default: python3's);
#                       when LibTorch's CMake package fails to configure (its CUDA part wants
#                       a complete CUDA toolkit), the build uses these through a small shim
#   --shim              use that shim from the start
#   --data DIR          train.bin/val.bin (default data/brown; else the repository's text is encoded)
#   --jobs N            build jobs (default: all cores)
#   --budget SECONDS    the whole script's time limit; runs that would not fit are skipped (default 450)
#   --cpu               no CUDA: build against the CPU LibTorch and run with Gloo, the
#                       350m run as `small` (tries the script without a GPU)
#   --no-build          use the edit-run/edit-train already in <build>/runtime
#   --report DIR        only write the report of the runs under DIR (their logs)
# Exit: 0 every run ended as expected; 1 a build or run failed; 2 bad arguments;
# 77 (--prepare/--dry-run) Debian's mirror cannot be reached.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
mode=run carry=$root/build/gpu-carry build=$root/build-gpu out="" torchPrefix="" data=$root/data/brown
jobs=$(nproc) budget=450 cpu=0 reportDir="" noBuild=0 torchDir="" shim=0 torchRoute=""

die() { echo "gpu-smoke: $*" >&2; exit 1; }
bad() { echo "gpu-smoke: $*" >&2; echo "usage: see the top of $0" >&2; exit 2; }
abspath() { mkdir -p "$1" && cd "$1" && pwd; }
while [ $# -gt 0 ]; do
  case $1 in
    --dry-run) mode=dry-run; shift ;;
    --prepare) mode=prepare; shift ;;
    --report) [ $# -ge 2 ] || bad "--report needs a directory"; mode=report; reportDir=$2; shift 2 ;;
    --carry|--build|--out|--torch-prefix|--torch-dir|--data)
      [ $# -ge 2 ] && [ -n "$2" ] || bad "$1 needs a directory"
      case $1 in --carry) carry=$2 ;; --build) build=$2 ;; --out) out=$2 ;; --torch-prefix) torchPrefix=$2 ;;
                 --torch-dir) torchDir=$2 ;; --data) data=$2 ;; esac
      shift 2 ;;
    --jobs|--budget)
      [[ ${2:-} =~ ^[1-9][0-9]*$ ]] || bad "$1 needs a positive integer (got '${2:-}')"
      if [ "$1" = --jobs ]; then jobs=$2; else budget=$2; fi
      shift 2 ;;
    --cpu) cpu=1; shift ;;
    --no-build) noBuild=1; shift ;;
    --shim) shim=1; shift ;;
    -h|--help) sed -n '2,37p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) bad "unknown argument '$1'" ;;
  esac
done
start=$SECONDS
carry=$(abspath "$carry")
build=$(abspath "$build")
out=$(abspath "${out:-$build/smoke}")
[ -d "$data" ] && data=$(cd "$data" && pwd)
work=$build/runs

# ------------------------------------------------------------------ the carried dependencies
# yaml-cpp: trixie's source package (0.8.0; 0.7.0 misses <cstdint> for GCC 13), built inside
# the runtime's build (-DEDIT_YAML_CPP_SOURCE_DIR), so no binary meets another glibc or
# libstdc++. nlohmann-json: this release's header-only package, unpacked. Gloo: trixie's
# headers, used only if the GPU machine's PyTorch lacks include/gloo.
prepare() {
  if [ -f "$carry/MANIFEST" ] && [ -f "$carry/yaml-cpp/CMakeLists.txt" ] &&
     [ -d "$carry/prefix/usr/include/nlohmann" ] && [ -d "$carry/gloo/include/gloo" ]; then
    echo "gpu-smoke: carried dependencies ready in $carry ($(paste -sd' ' "$carry/MANIFEST"))"
    return 0
  fi
  # shellcheck source=scripts/apt-private.sh
  . "$root/scripts/apt-private.sh"
  local codename; codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")
  rm -rf "$carry/prefix" "$carry/yaml-cpp" "$carry/gloo" "$carry/MANIFEST" "$carry/debs" "$carry/debs-gloo" "$carry/src" || return 1
  apt_private_setup "$carry/apt-bin" deb "$codename" main || return 77
  apt_private_download "$carry/debs" nlohmann-json3-dev || return 77
  apt_private_setup "$carry/apt-src" "deb deb-src" trixie main || return 77
  # Gloo's headers, in case the GPU machine's PyTorch does not ship them (ProcessGroupGloo.hpp needs them).
  apt_private_download "$carry/debs-gloo" libgloo-dev || return 77
  mkdir -p "$carry/src"
  (cd "$carry/src" && apt-get "${APT_PRIVATE[@]}" -q source --download-only yaml-cpp) > "$carry/src/download.log" 2>&1 ||
    { cat "$carry/src/download.log" >&2; return 77; }
  # (Called in an || list, where set -e does not apply: every step is checked.)
  for d in "$carry"/debs/*.deb; do dpkg -x "$d" "$carry/prefix" || return 1; done
  for d in "$carry"/debs-gloo/*.deb; do dpkg -x "$d" "$carry/gloo-pkg" || return 1; done
  mkdir -p "$carry/gloo" && mv "$carry/gloo-pkg/usr/include" "$carry/gloo/include" && rm -rf "$carry/gloo-pkg" || return 1
  local orig; orig=$(ls "$carry"/src/yaml-cpp_*.orig.tar.* 2>/dev/null | head -1)
  [ -n "$orig" ] || { echo "gpu-smoke: no yaml-cpp source tarball downloaded" >&2; return 1; }
  mkdir -p "$carry/yaml-cpp"
  tar -xf "$orig" -C "$carry/yaml-cpp" --strip-components=1 || return 1
  [ -f "$carry/yaml-cpp/CMakeLists.txt" ] || return 1
  { (cd "$carry/debs" && ls ./*.deb; cd "$carry/debs-gloo" && ls ./*.deb) | sed 's|^\./||'; basename "$orig"; } > "$carry/MANIFEST" || return 1
  rm -rf "$carry/apt-bin" "$carry/apt-src" "$carry/src"  # only what the GPU machine needs travels
  echo "gpu-smoke: carried dependencies in $carry: $(paste -sd' ' "$carry/MANIFEST") ($(du -sh "$carry" | cut -f1))"
}

# ------------------------------------------------------------------ configure and build
torch_prefix() {
  [ -n "$torchPrefix" ] && { echo "$torchPrefix"; return; }
  local p
  p=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null) || true
  if [ -n "$p" ] && [ -f "$p/Torch/TorchConfig.cmake" ]; then echo "$p"; return; fi
  if [ "$mode" = dry-run ] && [ -f /usr/lib/x86_64-linux-gnu/cmake/Torch/TorchConfig.cmake ]; then
    echo /usr/lib/x86_64-linux-gnu/cmake  # Debian's LibTorch: a stand-in for the configuration only
    return
  fi
  die "no LibTorch CMake package: python3's torch has none and --torch-prefix was not given"
}

nvcc_path() {
  command -v nvcc 2>/dev/null && return
  for c in "${CUDA_HOME:-}" /usr/local/cuda; do
    [ -n "$c" ] && [ -x "$c/bin/nvcc" ] && { echo "$c/bin/nvcc"; return; }
  done
  return 1
}

torch_dir() {
  [ -n "$torchDir" ] && { echo "$torchDir"; return; }
  python3 -c 'import os, torch; print(os.path.dirname(torch.__file__))' 2>/dev/null
}

# A stand-in for LibTorch's CMake package, from PyTorch's package directory (what
# torch.utils.cpp_extension uses): headers, libraries, and the compile definitions and ABI
# that package would give; of CUDA only the runtime's headers and library, no toolkit targets.
write_shim() {
  local t=$1 dir=$build/torch-shim/Torch
  local abi; abi=$(python3 -c 'import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))' 2>/dev/null || echo 1)
  local ver; ver=$(sed -nE 's/^#define TORCH_VERSION_(MAJOR|MINOR|PATCH) ([0-9]+).*/\2/p' \
    "$t/include/torch/csrc/api/include/torch/version.h" 2>/dev/null | paste -sd.)
  local cudaHome=${CUDA_HOME:-} incs="$t/include;$t/include/torch/csrc/api/include" libs=""
  local defs="USE_DISTRIBUTED;USE_C10D_GLOO;USE_RPC;USE_TENSORPIPE;_GLIBCXX_USE_CXX11_ABI=$abi"
  if [ $cpu = 0 ]; then
    defs="$defs;USE_C10D_NCCL"
    [ -n "$cudaHome" ] && incs="$incs;$cudaHome/include"
    # libtorch_cuda registers the CUDA kernels: linked even where nothing names its symbols.
    libs="-Wl,--no-as-needed;$t/lib/libtorch_cuda.so;$t/lib/libc10_cuda.so;-Wl,--as-needed;"
  fi
  libs="$libs$t/lib/libtorch.so;$t/lib/libtorch_cpu.so;$t/lib/libc10.so"
  if [ $cpu = 0 ] && [ -n "$cudaHome" ]; then
    local rt; rt=$(ls "$cudaHome"/lib64/libcudart.so "$cudaHome"/lib/libcudart.so 2>/dev/null | head -1)
    [ -n "$rt" ] && libs="$libs;$rt"
  fi
  mkdir -p "$dir"
  cat > "$dir/TorchConfig.cmake" <<SHIM
# Written by scripts/gpu-smoke.sh: LibTorch from $t without its CMake package.
add_library(torch INTERFACE IMPORTED)
set_target_properties(torch PROPERTIES
  INTERFACE_INCLUDE_DIRECTORIES "$incs"
  INTERFACE_COMPILE_DEFINITIONS "$defs"
  INTERFACE_LINK_LIBRARIES "$libs")
set(TORCH_LIBRARIES torch)
set(TORCH_INCLUDE_DIRS "$incs")
set(Torch_VERSION "$ver")
set(Torch_FOUND TRUE)
SHIM
  echo "$build/torch-shim"
}

configure() {
  local tp t
  t=$(torch_dir) || true
  if [ $shim = 1 ]; then
    [ -n "$t" ] && [ -d "$t/include/torch" ] || die "--shim: no PyTorch package directory (give --torch-dir)"
    tp=$(write_shim "$t")
  else
    tp=$(torch_prefix)
  fi
  local -a args=(-S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DEDIT_MINIMAL=ON
    -DEDIT_YAML_CPP_SOURCE_DIR="$carry/yaml-cpp" -DCMAKE_PREFIX_PATH="$tp;$carry/prefix/usr")
  if [ -n "$t" ] && [ -d "$t/include/torch" ] && [ ! -d "$t/include/gloo" ]; then
    echo "gpu-smoke: $t/include has no gloo/: using the carried Gloo headers"
    args+=(-DCMAKE_CXX_FLAGS="-isystem $carry/gloo/include")
  fi
  if [ $cpu = 1 ]; then
    args+=(-DEDIT_WITH_CUDA=OFF)
  else
    args+=(-DEDIT_WITH_CUDA=ON)
    # LibTorch's CMake package enables CUDA: it needs nvcc, and would otherwise probe
    # the GPU for the architectures (this project compiles no CUDA kernels).
    local nvcc; nvcc=$(nvcc_path) || { [ "$mode" = dry-run ] || die "no nvcc (set CUDA_HOME)"; nvcc=""; }
    [ -n "$nvcc" ] && export CUDACXX=$nvcc CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$nvcc")")}
    export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
  fi
  echo "gpu-smoke: cmake ${args[*]}"
  rm -rf "$build/CMakeCache.txt" "$build/CMakeFiles"
  if ! cmake "${args[@]}" > "$build/configure.log" 2>&1; then
    tail -40 "$build/configure.log"
    if [ $shim = 0 ] && [ $cpu = 0 ] && [ -n "$t" ]; then
      cp "$build/configure.log" "$build/configure-torch-package.log"
      echo "gpu-smoke: LibTorch's CMake package failed (above); configuring again with the shim (--shim)"
      shim=1
      configure
      return
    fi
    die "CMake configuration failed (all of it: $build/configure.log)"
  fi
  # The build must not have found or needed what the GPU machine lacks.
  local c=$build/CMakeCache.txt
  grep -q '^EDIT_MINIMAL:BOOL=ON' "$c" || die "EDIT_MINIMAL is not ON in $c"
  grep -q "^nlohmann_json_DIR:PATH=$carry/prefix/" "$c" || die "nlohmann-json did not come from $carry: $(grep '^nlohmann_json_DIR' "$c")"
  # (Protobuf is not checked: Debian's LibTorch package, the dry run's stand-in, looks
  # for it itself; PyTorch's does not.)
  if grep -E '^(GRPCPP_FOUND|GRPC_CPP_PLUGIN|prometheus-cpp_DIR|yaml-cpp_DIR|cpprestsdk_DIR)[:=]' "$c" | grep -v NOTFOUND; then
    die "the minimal build looked for a package the GPU machine does not have (above)"
  fi
  grep -q '^Torch_DIR:PATH=' "$c" || die "LibTorch not found"
  if [ $shim = 1 ]; then torchRoute="shim over $t"; else torchRoute="LibTorch's CMake package"; fi
  echo "gpu-smoke: configured: EDIT_MINIMAL=ON, EDIT_WITH_CUDA=$([ $cpu = 1 ] && echo OFF || echo ON), $(grep '^Torch_DIR:PATH=' "$c" | cut -d= -f2-) ($torchRoute)"
}

# ------------------------------------------------------------------ the runs
# NAME NPROC SHARDS TIMEOUT EXPECT(ok|fail) NOTE -- --set arguments...
plan() {
  local gpus=$1
  local common="data.train=$data/train.bin data.val=$data/val.bin runtime.backend=$backend runtime.collectiveTimeoutSeconds=60 data.valBatches=4"
  local tiny="$common model.preset=tiny training.steps=100 training.logEvery=10"
  local big="$common model.preset=llama-350m data.seqLen=1024 data.batchSize=8 training.steps=16 training.lrWarmupSteps=4 training.logEvery=4 algorithm.warmupSteps=4 algorithm.syncInterval=4 data.valBatches=2"
  [ $cpu = 1 ] && big=${big/llama-350m data.seqLen=1024/small data.seqLen=128}  # a CPU cannot train 350m in minutes
  # Most important first: a run that would overrun the budget is skipped.
  echo "tiny-edit 1 1 90 ok layer-wise EDiT sync on the side stream|$tiny algorithm.mode=edit"
  echo "350m-edit 1 1 180 ok llama-350m, 2 layer-wise syncs|$big algorithm.mode=edit"
  echo "tiny-ddp 1 1 90 ok synchronous|$tiny algorithm.mode=ddp"
  echo "tiny-a-edit 1 1 90 ok time-based sync every 0.5 s|$tiny algorithm.mode=a-edit algorithm.syncSeconds=0.5"
  echo "tiny-edit-offload 1 1 90 ok outer state in pinned host memory|$tiny algorithm.mode=edit algorithm.offloadOuterState=true"
  if [ "$gpus" -ge 2 ]; then
    echo "tiny-edit-2x1 2 1 120 ok 2 replicas on 2 GPUs: NCCL sync group|$tiny algorithm.mode=edit"
  fi
  if [ "$gpus" -ge 4 ]; then
    echo "tiny-edit-2x2 4 2 120 ok 2 replicas x 2 ZeRO-3 shards on 4 GPUs|$tiny algorithm.mode=edit"
    echo "350m-edit-2x2 4 2 240 ok llama-350m, 2 x 2 on 4 GPUs|$big algorithm.mode=edit"
  fi
  if [ "$gpus" = 1 ] && [ $cpu = 0 ]; then
    # NCCL (2.5 on) refuses two ranks of one communicator on one GPU ("Duplicate GPU
    # detected", ncclInvalidUsage): this records what this machine's NCCL says.
    echo "nccl-2-ranks-1-gpu 2 1 90 fail 2 ranks sharing the one GPU (NCCL refuses this)|$tiny algorithm.mode=ddp training.steps=5"
  fi
}

run_one() {
  local name=$1 nproc=$2 shards=$3 limit=$4 expect=$5 note=$6 sets=$7
  local dir=$work/$name
  rm -rf "$dir"; mkdir -p "$dir"
  local -a args=(--nproc "$nproc" --shards "$shards" --quiet --max-recoveries 0 --log-dir "$dir")
  for s in $sets; do args+=(--set "$s"); done
  printf '%s\n' "$build/runtime/edit-run ${args[*]}" > "$dir/command"
  local t0=$SECONDS rc=0
  # Its own session: at the limit, edit-run and its workers (their own process groups,
  # same session) all end, and none keeps the GPU for the next run.
  setsid "$build/runtime/edit-run" "${args[@]}" > "$dir/edit-run.out" 2>&1 &
  local pid=$!
  while kill -0 "$pid" 2>/dev/null && [ $((SECONDS - t0)) -lt "$limit" ]; do sleep 0.5; done
  if kill -0 "$pid" 2>/dev/null; then
    rc=124
    echo "gpu-smoke: $name: over its ${limit} s limit, stopping it" >> "$dir/edit-run.out"
    kill -TERM "$pid" 2>/dev/null || true
    sleep 5
    pkill -KILL -s "$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  else
    wait "$pid" || rc=$?
  fi
  local wall=$((SECONDS - t0)) verdict=ok
  [ $rc = 124 ] && [ "$expect" = ok ] && verdict="FAILED"
  if [ "$expect" = ok ] && [ $rc != 0 ]; then verdict=FAILED; fi
  if [ "$expect" = fail ] && [ $rc = 0 ]; then verdict="ran (NCCL accepted it)"; fi
  if [ "$expect" = fail ] && [ $rc != 0 ]; then verdict="refused as expected"; fi
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$nproc" "$shards" "$rc" "$wall" "$verdict" "$note" >> "$work/runs.tsv"
  echo "gpu-smoke: $name: exit $rc in $wall s ($verdict)"
  if [ "$verdict" = FAILED ]; then tail -15 "$dir/edit-run.out" | sed 's/^/    /'; return 1; fi
}

# ------------------------------------------------------------------ the report
# The Python parts (scripts/gpu_smoke_report.py) read the workers' lines with the
# project's own parser (tests/pylib/edit_testing): standard library only.
py() { PYTHONPATH=$root/tests/pylib${PYTHONPATH:+:$PYTHONPATH} python3 "$root/scripts/gpu_smoke_report.py" "$@"; }
report() { py report "$1" "$2"; }

# ------------------------------------------------------------------ main
case $mode in
  prepare)
    prepare || { [ $? = 77 ] && { echo "gpu-smoke: SKIPPED: cannot download from Debian's mirror"; exit 77; }; exit 1; }
    exit 0 ;;
  report)
    report "$(cd "$reportDir" && pwd)" "$out/gpu.md"
    exit 0 ;;
esac

backend=nccl; [ $cpu = 1 ] && backend=gloo
if [ "$mode" = dry-run ]; then
  rc=0; prepare || rc=$?
  [ $rc = 77 ] && { echo "gpu-smoke: SKIPPED: cannot download from Debian's mirror"; exit 77; }
  [ $rc = 0 ] || exit 1
  configure
  # The carried yaml-cpp compiles (the rest of the runtime is the normal build's code).
  t0=$SECONDS
  cmake --build "$build" --target yaml-cpp -j "$jobs" > "$build/yaml-cpp-build.log" 2>&1 ||
    { tail -30 "$build/yaml-cpp-build.log"; die "the carried yaml-cpp does not build"; }
  echo "gpu-smoke: carried yaml-cpp built in $((SECONDS - t0)) s"
  [ -s "$data/train.bin" ] && [ -s "$data/val.bin" ] && echo "gpu-smoke: data: $data ($(du -sh "$data" | cut -f1))" ||
    echo "gpu-smoke: data: $data missing: the run would encode the repository's text instead"
  echo "gpu-smoke: would build: cmake --build $build --target edit-train edit-run edit-data -j $jobs"
  echo "gpu-smoke: run plan on 1 GPU (budget ${budget} s), then the same with 4 GPUs adds:"
  plan 1 | while IFS='|' read -r head sets; do
    read -r name nproc shards limit expect note <<< "$head"
    echo "  $name: edit-run --nproc $nproc --shards $shards $(printf -- '--set %s ' $sets)(limit ${limit} s, expect $expect; $note)"
  done
  plan 4 | grep -E '^(tiny-edit-2x|350m-edit-2x)' | sed 's/|.*//; s/^/  /'
  echo "gpu-smoke: dry run done (no GPU used)"
  exit 0
fi

# The GPU run.
[ -f "$carry/MANIFEST" ] || die "no carried dependencies in $carry: run scripts/gpu-smoke.sh --prepare where Debian's mirror is reachable and copy $carry here"
rm -rf "$work"  # nothing of an earlier run may reach this report
mkdir -p "$work" "$out"
py env "$work/env.json" "$cpu" "$carry" || die "python3 with torch is needed"
gpus=$(py gpus "$work/env.json")
t0=$SECONDS
if [ $noBuild = 0 ]; then
  configure
  if ! cmake --build "$build" --target edit-train edit-run edit-data -j "$jobs" > "$build/build.log" 2>&1; then
    grep -E 'error|Error' "$build/build.log" | head -40
    die "build failed (all of it: $build/build.log)"
  fi
else
  [ -x "$build/runtime/edit-run" ] && [ -x "$build/runtime/edit-train" ] || die "--no-build: no edit-run/edit-train in $build/runtime"
fi
buildSecs=$((SECONDS - t0))
py build-info "$work/env.json" "$buildSecs" "$jobs" "$noBuild" "$torchRoute"
echo "gpu-smoke: built in $buildSecs s"

if ! [ -s "$data/train.bin" ] || ! [ -s "$data/val.bin" ]; then
  # No corpus was carried: byte-level tokens of the repository's own text (losses then
  # differ from the README's; throughput does not).
  echo "gpu-smoke: $data missing: encoding the repository's text instead"
  data=$build/smoke-data
  mkdir -p "$data"
  find "$root" -path "$root/build*" -prune -o \( -name '*.md' -o -name '*.cpp' -o -name '*.h' -o -name '*.py' -o -name '*.yaml' \) -type f -print0 |
    xargs -0 cat > "$data/text.txt"
  "$build/runtime/edit-data" encode --in "$data/text.txt" --train "$data/train.bin" --val "$data/val.bin" > /dev/null
fi

failed=0
while IFS='|' read -r head sets; do
  read -r name nproc shards limit expect note <<< "$head"
  # A run starts when a third of its limit (about its usual length) is left, and is cut
  # at the budget (less 15 s for the report): the whole script ends within the budget.
  left=$((budget - 15 - (SECONDS - start)))
  [ "$limit" -gt "$left" ] && limit=$left
  if [ "$left" -lt 10 ] || [ $((left * 3)) -lt "$(awk '{print $4}' <<< "$head")" ]; then
    printf '%s\t%s\t%s\t-\t-\tskipped\t%s (%s s left of the budget)\n' "$name" "$nproc" "$shards" "$note" "$left" >> "$work/runs.tsv"
    echo "gpu-smoke: $name: skipped ($left s left of the ${budget} s budget)"
    continue
  fi
  run_one "$name" "$nproc" "$shards" "$limit" "$expect" "$note" "$sets" || failed=1
done < <(plan "$gpus")

report "$work" "$out/gpu.md"
# The logs travel with the report (small text files).
rm -rf "$out/logs"; mkdir -p "$out/logs"
(cd "$work" && find . -name '*.log' -o -name '*.out' -o -name command -o -name runs.tsv -o -name env.json) |
  while read -r f; do mkdir -p "$out/logs/$(dirname "$f")"; cp "$work/$f" "$out/logs/$f"; done
cp "$build/configure.log" "$build/build.log" "$out/logs/" 2>/dev/null || true
echo "gpu-smoke: report in $out/gpu.md; $((SECONDS - start)) s in all"
exit $failed
