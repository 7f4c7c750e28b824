// Helpers shared by edit-export's unit tests (test_safetensors.cpp, test_hf_export.cpp):
// expecting an error by its message; scratch folders and whole files from test_files.h.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "../../common/test_files.h"

namespace edit::test {

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
