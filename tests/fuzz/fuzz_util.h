// Shared by the libFuzzer targets (fuzz_*.cpp) and the corpus replay tests (replay_*.cpp):
// a per-process scratch directory for parsers that read files, and the switch that lets
// (bugs the fuzzers found are listed, fixed, in README.md, "Bugs found").
#pragma once

#include <stdlib.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>

namespace edit::fuzz {

// A directory that lives as long as the process (tmpfs when available: fuzzing writes a
// file per input).
inline const std::string& scratchDir() {
  static const std::string dir = [] {
    std::string base = "/tmp";
    if (const char* t = std::getenv("TMPDIR"); t && *t) base = t;
    else if (std::filesystem::is_directory("/dev/shm")) base = "/dev/shm";
    std::string tmpl = base + "/edit-fuzz-XXXXXX";
    if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed under " + base);
    static std::string cleanup = tmpl;
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(cleanup, ec);
    });
    return tmpl;
  }();
  return dir;
}

inline void writeFile(const std::string& path, const uint8_t* data, size_t size) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) throw std::runtime_error("cannot write " + path);
  if (size) std::fwrite(data, 1, size, f);
  std::fclose(f);
}

}  // namespace edit::fuzz
