// Environment the math libraries read once, when they load; edit-run sets it for its
// workers, and edit-train sets it for itself by re-executing (a pod starts it directly).
//
// OPENBLAS_CORETYPE: Debian's OpenBLAS 0.3.21 does not recognise recent Xeons and falls back
// to its SSE3 "Prescott" kernels (~4-5x slower GEMM).
// OMP_WAIT_POLICY=PASSIVE: ATen's OpenMP team and OpenBLAS's own threads take turns on the
// same cores; with libgomp's default spin-wait, idle OpenMP threads burn the cores OpenBLAS
// needs (a 100M-parameter step took 3-6x longer on a shared 2-core machine).
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

namespace edit {

// The OPENBLAS_CORETYPE this CPU needs, "" when it is already set (never overridden: some
// machines set it on purpose) or when the CPU has nothing better than the default.
inline std::string blasCoreType() {
  if (const char* v = std::getenv("OPENBLAS_CORETYPE"); v && *v) return "";
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    const std::string flags = line + " ";
    auto has = [&](const char* f) { return flags.find(std::string(" ") + f + " ") != std::string::npos; };
    if (has("avx512_bf16")) return "Cooperlake";
    if (has("avx512f") && has("avx512bw") && has("avx512vl")) return "SkylakeX";
    if (has("avx2") && has("fma")) return "Haswell";
    return "";
  }
  return "";
}

// The OMP_WAIT_POLICY to set, "" when one is already set (a user's choice is kept).
inline std::string ompWaitPolicy() {
  if (const char* v = std::getenv("OMP_WAIT_POLICY"); v && *v) return "";
  return "PASSIVE";
}

// Re-executes this program with OPENBLAS_CORETYPE and OMP_WAIT_POLICY set when they are
// missing (same PID, so signals and the pod's lifecycle are unaffected). Returns only when
// nothing had to change, or when exec failed (then training is slower, still correct).
inline void reexecWithLibraryEnv(char** argv) {
  const std::string type = blasCoreType(), wait = ompWaitPolicy();
  if (type.empty() && wait.empty()) return;
  // Set: the new image does not come back here.
  if (!type.empty()) ::setenv("OPENBLAS_CORETYPE", type.c_str(), 1);
  if (!wait.empty()) ::setenv("OMP_WAIT_POLICY", wait.c_str(), 1);
  ::execv("/proc/self/exe", argv);
}

}  // namespace edit
