#!/usr/bin/env bash
# Compiles (syntax only) every runtime translation unit that uses LibTorch against
# LibTorch 2.x headers, as the GPU build will see them, without a GPU and without
# touching the machine's LibTorch (Debian bookworm's 1.13, the normal build):
#   CPU path   Debian trixie's libtorch-dev + libgloo-dev (2.6)
#   CUDA path  trixie's libtorch-cuda-dev + libgloo-cuda-dev (2.6, contrib) with
#              -DEDIT_WITH_CUDA=1 and this machine's CUDA toolkit headers (nvcc's, with nccl.h)
# The packages are downloaded with apt-get into a private apt state (scripts/apt-private.sh)
# and unpacked with dpkg -x under the cache directory; nothing is installed.
#
#   scripts/check-libtorch2.sh [--cache DIR] [--cpu-only] [--jobs N] [--keep-going]
#
# --cache DIR   downloads, unpacked headers and logs (default build/libtorch2; reused)
# --cpu-only    skip the CUDA path
# --jobs N      compile N files at once (default 1: the machine is shared)
# --keep-going  compile every file even after a failure
# Exit: 0 every file compiled in every path; 1 a file failed (its errors are printed);
# 2 bad arguments; 77 skipped: the packages cannot be downloaded, or (CPU path passed)
# there are no CUDA toolkit headers for the CUDA path.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cache=$root/build/libtorch2
cpuOnly=0 jobs=1 keepGoing=0
suite=${EDIT_LIBTORCH2_SUITE:-trixie}

usage() { sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }
while [ $# -gt 0 ]; do
  case $1 in
    --cache) [ $# -ge 2 ] || usage 2; cache=$2; shift 2 ;;
    --cpu-only) cpuOnly=1; shift ;;
    --jobs) [[ ${2:-} =~ ^[1-9][0-9]*$ ]] || { echo "check-libtorch2: --jobs needs a positive integer" >&2; exit 2; }
            jobs=$2; shift 2 ;;
    --keep-going) keepGoing=1; shift ;;
    -h|--help) usage 0 ;;
    *) echo "check-libtorch2: unknown argument $1" >&2; usage 2 ;;
  esac
done
mkdir -p "$cache"
cache=$(cd "$cache" && pwd)
trap 'rm -rf "$cache"/pch-*' EXIT  # the precompiled headers: 600 MB each

# shellcheck source=scripts/apt-private.sh
. "$root/scripts/apt-private.sh"

# ------------------------------------------------------------------ fetch and unpack
# prefix NAME PACKAGE...: downloads the packages (once) and unpacks them into $cache/NAME.
prefix() {
  local name=$1; shift
  local debs=$cache/debs-$name
  if ! ls "$debs"/*.deb >/dev/null 2>&1; then
    apt_private_download "$debs" "$@" || return 1
  fi
  local stamp; stamp=$(cd "$debs" && ls ./*.deb)
  if [ "$(cat "$cache/$name.unpacked" 2>/dev/null)" != "$stamp" ]; then
    rm -rf "${cache:?}/$name"
    for d in "$debs"/*.deb; do dpkg -x "$d" "$cache/$name"; done
    echo "$stamp" > "$cache/$name.unpacked"
  fi
}

skip() { echo "check-libtorch2: SKIPPED: $*"; exit 77; }

if ! ls "$cache"/debs-cpu/*.deb >/dev/null 2>&1 || { [ $cpuOnly = 0 ] && ! ls "$cache"/debs-cuda/*.deb >/dev/null 2>&1; }; then
  apt_private_setup "$cache/apt" deb "$suite" main contrib ||
    skip "cannot download Debian $suite's package lists (no network to the Debian mirror?)"
fi
prefix cpu libtorch-dev libgloo-dev || skip "cannot download $suite's libtorch-dev"
if [ $cpuOnly = 0 ]; then
  prefix cuda libtorch-cuda-dev libgloo-cuda-dev || skip "cannot download $suite's libtorch-cuda-dev"
fi

# ------------------------------------------------------------------ the CUDA toolkit
cudaInc=""
if [ $cpuOnly = 0 ]; then
  for c in "${CUDA_HOME:-}" "$(dirname "$(dirname "$(command -v nvcc 2>/dev/null || echo /x/x)")")" /usr/local/cuda; do
    if [ -n "$c" ] && [ -f "$c/include/cuda_runtime_api.h" ] && [ -f "$c/include/nccl.h" ]; then
      cudaInc=$(cd "$c/include" && pwd -P); break
    fi
  done
fi

# ------------------------------------------------------------------ what to compile
# A translation unit uses LibTorch when it, or a project header it includes (transitively),
# includes <torch/...>, <ATen/...> or <c10/...>.
declare -A usesTorch=()
uses_torch() {
  local f=$1
  [ -n "${usesTorch[$f]:-}" ] && { [ "${usesTorch[$f]}" = 1 ]; return; }
  usesTorch[$f]=0  # breaks include cycles
  if grep -qE '^[[:space:]]*#[[:space:]]*include[[:space:]]*<(torch|ATen|c10)/' "$f"; then
    usesTorch[$f]=1; return 0
  fi
  local inc
  for inc in $(sed -nE 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"([^"]+)".*/\1/p' "$f"); do
    for dir in "$(dirname "$f")" "$root/runtime/src" "$root/common/src"; do
      if [ -f "$dir/$inc" ]; then
        if uses_torch "$dir/$inc"; then usesTorch[$f]=1; return 0; fi
        break
      fi
    done
  done
  return 1
}
shopt -s nullglob
units=()
for f in "$root"/runtime/src/*.cpp "$root"/runtime/src/*/*.cpp "$root"/runtime/tools/*.cpp; do
  if uses_torch "$f"; then units+=("$f"); fi
done
[ ${#units[@]} -gt 0 ] || { echo "check-libtorch2: no LibTorch translation units found" >&2; exit 1; }

# The compile definitions and flags LibTorch's own CMake package gives its users
# (Caffe2Targets.cmake: USE_C10D_GLOO, USE_C10D_NCCL, ...; TorchConfig.cmake: the ABI).
torch_flags() {
  local p=$1/usr/lib/x86_64-linux-gnu/cmake
  grep -h 'INTERFACE_COMPILE_DEFINITIONS "' "$p/Caffe2/Caffe2Targets.cmake" | grep -v '\$<' |
    sed -E 's/.*"(.*)".*/\1/' | tr ';' '\n' | grep . | sort -u | sed 's/^/-D/'
  grep -h 'set(TORCH_CXX_FLAGS "' "$p/Torch/TorchConfig.cmake" | sed -E 's/.*"(.*)".*/\1/' | tr ' ' '\n' | grep .
}

version_of() {
  sed -nE 's/^#define TORCH_VERSION_(MAJOR|MINOR|PATCH) ([0-9]+).*/\2/p' \
    "$1/usr/include/torch/csrc/api/include/torch/version.h" | paste -sd.
}

# ------------------------------------------------------------------ compile
logs=$cache/logs
rm -rf "$logs"; mkdir -p "$logs"

# The flags of one path, as the build would pass them.
path_flags() {
  local path=$1 pfx=$cache/$1
  echo -std=c++17
  torch_flags "$pfx"
  # What runtime/CMakeLists.txt adds with -DEDIT_WITH_CUDA=ON.
  [ "$path" = cuda ] && printf '%s\n' -DEDIT_WITH_CUDA=1 -DUSE_C10D_NCCL -DUSE_C10D_GLOO -isystem "$cudaInc"
  printf '%s\n' -I"$pfx/usr/include" -I"$pfx/usr/include/torch/csrc/api/include" \
    -I"$root/runtime/src" -I"$root/common/src"
}

# A dependency list must name no header of the machine's own LibTorch
# (/usr/include/{torch,ATen,c10,caffe2,gloo}): one that 2.x dropped would otherwise be
# found there silently.
clean_deps() {
  local what=$1 dep=$2 bad=$2.bad
  grep -oE '(^| )/usr/include/(torch|ATen|c10|caffe2|gloo)/[^ ]*' "$dep" > "$bad" || true
  if [ -s "$bad" ]; then
    echo "FAIL  $what: used the machine's LibTorch 1.13 headers, e.g.:"
    head -5 "$bad" | sed 's/^ */        /'
    return 1
  fi
}

# The runtime's precompiled header (runtime/src/torch_pch.h, which the build gives every
# LibTorch file) is compiled once per path, as the build does; each file then parses
# only what it adds (about 3x faster).
make_pch() {
  local path=$1 dir=$cache/pch-$1
  rm -rf "$dir"; mkdir -p "$dir"
  cp "$root/runtime/src/torch_pch.h" "$dir/"
  mapfile -t flags < <(path_flags "$path")
  local t0=$SECONDS
  if ! g++ "${flags[@]}" -x c++-header -MD -MF "$logs/$path-pch.d" -MT x "$dir/torch_pch.h" \
       -o "$dir/torch_pch.h.gch" > "$logs/$path-pch.log" 2>&1; then
    echo "FAIL  $path  runtime/src/torch_pch.h"
    grep -E 'error|required from here' "$logs/$path-pch.log" | head -40
    return 1
  fi
  clean_deps "$path  runtime/src/torch_pch.h" "$logs/$path-pch.d" || return 1
  echo "ok    $path  runtime/src/torch_pch.h (precompiled, $((SECONDS - t0)) s)"
}

# check_one PATH FILE: one syntax-only compile.
check_one() {
  local path=$1 file=$2
  local name; name=$(basename "$(dirname "$file")")-$(basename "$file" .cpp)
  local log=$logs/$path-$name.log dep=$logs/$path-$name.d
  mapfile -t flags < <(path_flags "$path")
  local t0=$SECONDS
  if ! g++ "${flags[@]}" -fsyntax-only -Winvalid-pch -include "$cache/pch-$path/torch_pch.h" \
       -MD -MF "$dep" -MT x "$file" > "$log" 2>&1; then
    echo "FAIL  $path  ${file#"$root"/}  ($((SECONDS - t0)) s)"
    grep -E 'error|required from here' "$log" | head -40
    return 1
  fi
  grep -h 'invalid-pch\|not using' "$log" | head -3 || true
  clean_deps "$path  ${file#"$root"/}" "$dep" || return 1
  echo "ok    $path  ${file#"$root"/}  ($((SECONDS - t0)) s)"
}
export -f check_one path_flags torch_flags clean_deps
export root cache cudaInc logs

paths=(cpu)
[ $cpuOnly = 0 ] && [ -n "$cudaInc" ] && paths+=(cuda)
echo "check-libtorch2: ${#units[@]} translation units; LibTorch $(version_of "$cache/cpu") ($(sed 's|^\./||' "$cache/cpu.unpacked" | paste -sd' '))"
[ $cpuOnly = 0 ] && [ -n "$cudaInc" ] &&
  echo "check-libtorch2: CUDA path: LibTorch $(version_of "$cache/cuda") ($(sed 's|^\./||' "$cache/cuda.unpacked" | paste -sd' ')) with $cudaInc"
failed=0
for path in "${paths[@]}"; do
  if ! make_pch "$path"; then failed=1; [ $keepGoing = 1 ] && continue; break; fi
  if [ "$jobs" -gt 1 ]; then
    printf '%s\n' "${units[@]}" | xargs -P "$jobs" -I{} bash -c 'check_one "$0" "$1"' "$path" {} || failed=1
  else
    for f in "${units[@]}"; do
      check_one "$path" "$f" || failed=1
      [ $failed = 1 ] && [ $keepGoing = 0 ] && break
    done
  fi
  rm -rf "$cache/pch-$path"
  [ $failed = 1 ] && [ $keepGoing = 0 ] && break
done

if [ $failed != 0 ]; then
  echo "check-libtorch2: FAILED (logs in $logs)"
  exit 1
fi
if [ $cpuOnly = 0 ] && [ -z "$cudaInc" ]; then
  skip "the CPU path compiles against LibTorch 2.x; the CUDA path was not checked: no CUDA toolkit headers with nccl.h (set CUDA_HOME)"
fi
echo "check-libtorch2: every LibTorch translation unit compiles against LibTorch 2.x (${paths[*]})"
