// libFuzzer entry point for the job store's protocol; the work is in target_kv_frame.h
// (shared with the corpus replay in tests/runtime/light/test_kv_store_limits.cpp).
// Run: build-sanitize/tests/fuzz/fuzz_kv_frame tests/fuzz/corpus/kv_frame (README.md).
#include "target_kv_frame.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  edit::fuzz::fuzzKvFrameOne(data, size);
  return 0;
}
