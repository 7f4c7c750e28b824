// Corpus replay for the normal (gcc) build and the sanitizer build: every committed seed
// goes through the same harness code the fuzzers run (target_*.h), so a seed that
// crashes or throws an undocumented exception fails a unit test, with or without clang.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

namespace edit::fuzz::replay {

inline std::string readAll(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Regular files under dir (sorted; empty when the folder does not exist).
inline std::vector<std::filesystem::path> filesIn(const std::filesystem::path& dir) {
  std::vector<std::filesystem::path> out;
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) return out;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir, ec))
    if (e.is_regular_file()) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

inline std::string corpusDir(const std::string& target) { return std::string(EDIT_FUZZ_CORPUS) + "/" + target; }

// Replays every file; returns how many there were. The harness throws std::logic_error
// for a broken contract and lets undocumented exceptions through: both fail the test.
inline size_t replayAll(const std::vector<std::filesystem::path>& files,
                        const std::function<void(const uint8_t*, size_t)>& one) {
  for (const auto& f : files) {
    SCOPED_TRACE(f.string());
    const std::string bytes = readAll(f);
    try {
      one(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    } catch (const std::exception& e) {
      ADD_FAILURE() << f << ": " << e.what();
    } catch (...) {
      ADD_FAILURE() << f << ": a non-std exception";
    }
  }
  return files.size();
}

}  // namespace edit::fuzz::replay
