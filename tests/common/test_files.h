// Files for C++ tests: a fresh scratch folder, whole-file reads and writes. Standard
// library only, so that any test program can include it.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

namespace edit::test {

// An empty folder of its own under the system's temp folder: the pid and a count make
// its name unique among concurrent test programs and within one.
inline std::string tempDir(const std::string& name) {
  static int counter = 0;
  auto d = std::filesystem::temp_directory_path() /
           (name + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d.string();
}

// The whole file as bytes ("" when it cannot be read).
inline std::string readFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

inline void writeFile(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

}  // namespace edit::test
