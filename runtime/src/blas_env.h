// OpenBLAS kernel selection. Debian's OpenBLAS 0.3.21 does not recognise recent Xeons and
// falls back to its SSE3 "Prescott" kernels (~4-5x slower GEMM). The kernel set is chosen
// once, when the library loads, from OPENBLAS_CORETYPE: edit-run sets it for its workers,
// and edit-train sets it for itself by re-executing (a pod starts edit-train directly).
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

// Re-executes this program with OPENBLAS_CORETYPE set when blasCoreType() says so (same
// PID, so signals and the pod's lifecycle are unaffected). Returns only when nothing had to
// change, or when exec failed (then the slow kernels are used; training is still correct).
inline void reexecWithBlasCoreType(char** argv) {
  const std::string type = blasCoreType();
  if (type.empty()) return;
  ::setenv("OPENBLAS_CORETYPE", type.c_str(), 1);  // set: the new image does not come back here
  ::execv("/proc/self/exe", argv);
}

}  // namespace edit
