// Helpers shared by edit-export's unit tests (test_safetensors.cpp, test_hf_export.cpp):
// scratch folders, whole-file reads and writes, and expecting an error by its message.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

namespace edit::test {

inline std::string tempDir(const std::string& name) {
  static int counter = 0;
  auto d = std::filesystem::temp_directory_path() /
           (name + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d.string();
}

inline std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

inline void spit(const std::string& path, const std::string& s) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << s;
}

// Runs f and returns the message of the exception of type E it must throw.
template <typename E, typename F>
std::string errorOf(F f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  ADD_FAILURE() << "no exception thrown";
  return "";
}

}  // namespace edit::test

#define EXPECT_ERROR(E, expr, needle)                                               \
  do {                                                                              \
    const std::string msg_ = ::edit::test::errorOf<E>([&] { (void)(expr); });       \
    EXPECT_NE(msg_.find(needle), std::string::npos) << "message: " << msg_;        \
  } while (0)
