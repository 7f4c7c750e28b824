// libFuzzer entry point for the config target; the work is in target_config.h (shared with the corpus
// replay tests). Run: build-fuzz/tests/fuzz/fuzz_config tests/fuzz/corpus/config (README.md).
#include "target_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  edit::fuzz::fuzzConfigOne(data, size);
  return 0;
}
