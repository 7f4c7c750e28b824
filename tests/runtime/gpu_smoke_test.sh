#!/usr/bin/env bash
# scripts/gpu-smoke.sh without a GPU: its arguments, its report's arithmetic on made-up
# worker logs, and --dry-run (the carried dependencies, the -DEDIT_MINIMAL=ON CMake
# configuration against Debian's LibTorch as a stand-in, the carried yaml-cpp built, the
# run plan). Exit 77 (skipped) when Debian's mirror cannot be reached for the carry.
#   gpu_smoke_test.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
src=$1 bin=$2
smoke=$src/scripts/gpu-smoke.sh
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# --- arguments: refused with exit 2, naming what is wrong
for args in "--bogus" "--jobs abc" "--budget 0" "--out"; do
  rc=0; "$smoke" $args > "$tmp/out" 2>&1 || rc=$?
  [ $rc = 2 ] || fail "'gpu-smoke.sh $args' exited $rc, not 2: $(cat "$tmp/out")"
  grep -q -- "${args%% *}" "$tmp/out" || fail "'gpu-smoke.sh $args' did not name ${args%% *}: $(cat "$tmp/out")"
done
"$smoke" --help | grep -q -- '--dry-run' || fail "--help does not describe --dry-run"
echo "ok: arguments"

# --- the report, on logs whose numbers are known
w=$tmp/runs; mkdir -p "$w/r1" "$w/r2" "$w/nccl-2-ranks-1-gpu"
echo '{"gpu_name": "NVIDIA H200", "gpu_count": 1, "torch": "2.11.0"}' > "$w/env.json"
printf 'r1\t1\t1\t0\t30\tok\tone rank\n' >> "$w/runs.tsv"
printf 'r2\t2\t2\t0\t40\tok\ttwo shards\n' >> "$w/runs.tsv"
printf 'nccl-2-ranks-1-gpu\t2\t1\t75\t9\trefused as expected\tprobe\n' >> "$w/runs.tsv"
echo "[rank 0] NCCL error: invalid usage, Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 1000" \
  > "$w/nccl-2-ranks-1-gpu/edit-run.out"
# r1: progress tps 1000 (start-up, ignored), then 2000, 2200, 2100: steady = median 2100.
{
  for tps in 1000 2000 2200 2100; do
    echo "@edit {\"rank\":0,\"step\":10,\"loss\":5.5,\"tps\":$tps}"
  done
  echo '@edit-summary {"rank":0,"steps":40,"loss":2.0,"val_loss":2.1,"tps":1500,"params":1000000,"flops_per_token":1e9,"step_seconds_total":10.0,"sync_work_seconds":2.5,"comm":[{"op":"sync","group":"sync","wait":1.0},{"op":"allgather","group":"shard","wait":3.0}],"device":"cuda:0","peak_gpu_allocated_bytes":1500000000,"peak_gpu_reserved_bytes":2000000000}'
} > "$w/r1/rank-0.log"
# r2: two ranks on two GPUs, 1000 tok/s steady each; flops 2e9/token: 4 TFLOPS over 2 GPUs.
for r in 0 1; do
  {
    echo "@edit {\"rank\":$r,\"step\":5,\"loss\":6.0,\"tps\":10}"
    echo "@edit {\"rank\":$r,\"step\":10,\"loss\":5.0,\"tps\":1000}"
    echo "@edit-summary {\"rank\":$r,\"steps\":10,\"loss\":5.0,\"val_loss\":5.2,\"tps\":800,\"params\":1,\"flops_per_token\":2e9,\"step_seconds_total\":4.0,\"sync_work_seconds\":0.$((r + 1)),\"comm\":[],\"device\":\"cuda:$r\",\"peak_gpu_allocated_bytes\":100,\"peak_gpu_reserved_bytes\":200}"
  } > "$w/r2/rank-$r.log"
done
"$smoke" --report "$w" --out "$tmp/report" > "$tmp/report.out" || fail "--report failed: $(cat "$tmp/report.out")"
md=$tmp/report/gpu.md
row() { grep "^| $1 |" "$md" || fail "no row for $1 in the report: $(cat "$md")"; }
# r1: 2100 tok/s x 1e9 = 2.10 TFLOPS; / 989.4 = 0.2%, / 66.9 = 3.1%; sync 2.5/10, wait 1/10.
row r1 | grep -q '| 2.10k | 1.50k | 2.10 | 0.2% | 3.1% | 25.0% | 10.0% | 1.50GB / 2.00GB | 5.500 -> 2.000 (2.100) |' ||
  fail "r1's numbers: $(row r1)"
# r2: 2 x 1000 tok/s x 2e9 = 4 TFLOPS on 2 GPUs: 0.2% bf16, 3.0% fp32; sync max(0.2/4) = 5%.
row r2 | grep -q '| 1x2 | 0 | 40 | 10 | 2.00k | 1.60k | 4.00 | 0.2% | 3.0% | 5.0% | 0.0% |' ||
  fail "r2's numbers: $(row r2)"
grep -q 'Duplicate GPU detected' "$md" || fail "the report does not quote NCCL's refusal"
grep -q "bf16 989.4 TFLOPS, fp32 66.9 TFLOPS" "$md" || fail "the report does not name the H200's peaks"
echo "ok: report"

# --- the dry run
rc=0
"$smoke" --dry-run --carry "$bin/gpu-carry" --build "$bin/gpu-smoke-dry" \
  --torch-prefix /usr/lib/x86_64-linux-gnu/cmake --jobs 1 > "$tmp/dry" 2>&1 || rc=$?
cat "$tmp/dry"
[ $rc = 77 ] && { echo "skipped: the carried dependencies cannot be downloaded"; exit 77; }
[ $rc = 0 ] || fail "--dry-run exited $rc"
for want in "configured: EDIT_MINIMAL=ON, EDIT_WITH_CUDA=ON" "carried yaml-cpp built" \
            "tiny-edit: edit-run --nproc 1" "350m-edit: " "tiny-ddp: " "tiny-a-edit: " \
            "--set runtime.backend=nccl" "--set model.preset=llama-350m" "nccl-2-ranks-1-gpu: edit-run --nproc 2" \
            "tiny-edit-2x2 4 2" "dry run done (no GPU used)"; do
  grep -qF -- "$want" "$tmp/dry" || fail "--dry-run output lacks '$want'"
done
cache=$bin/gpu-smoke-dry/CMakeCache.txt
! grep -qE '^(GRPCPP_FOUND|prometheus-cpp_DIR|yaml-cpp_DIR)' "$cache" || fail "the minimal build looked for gRPC/prometheus/yaml-cpp"
grep -q "^nlohmann_json_DIR:PATH=$bin/gpu-carry/prefix/" "$cache" || fail "nlohmann-json was not the carried one"
[ -f "$bin/gpu-smoke-dry/yaml-cpp/libyaml-cpp.a" ] || fail "the carried yaml-cpp was not built"
echo "ok: dry run"

# --- the fallback when LibTorch's CMake package does not configure: a shim over a PyTorch
# package directory (include/, lib/); here Debian's layout stands in for one.
fake=$tmp/torch; mkdir -p "$fake"
ln -s /usr/include "$fake/include"; ln -s /usr/lib/x86_64-linux-gnu "$fake/lib"
"$smoke" --dry-run --shim --torch-dir "$fake" --carry "$bin/gpu-carry" --build "$bin/gpu-smoke-dry" \
  --jobs 1 > "$tmp/shim" 2>&1 || { cat "$tmp/shim"; fail "--dry-run --shim failed"; }
grep -qF "(shim over $fake)" "$tmp/shim" || fail "the shim was not used: $(cat "$tmp/shim")"
grep -q "^Torch_DIR:PATH=$bin/gpu-smoke-dry/torch-shim/Torch" "$cache" || fail "LibTorch did not come from the shim"
shimCfg=$bin/gpu-smoke-dry/torch-shim/Torch/TorchConfig.cmake
for want in "$fake/lib/libtorch_cuda.so" "USE_C10D_NCCL" "_GLIBCXX_USE_CXX11_ABI=" "$fake/include/torch/csrc/api/include"; do
  grep -qF -- "$want" "$shimCfg" || fail "the shim lacks $want"
done
echo "ok: shim"
