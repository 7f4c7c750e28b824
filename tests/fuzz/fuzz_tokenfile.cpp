// libFuzzer entry point for the tokenfile target; the work is in target_tokenfile.h (shared with the corpus
// replay tests). Run: build-fuzz/tests/fuzz/fuzz_tokenfile tests/fuzz/corpus/tokenfile (README.md).
#include "target_tokenfile.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  edit::fuzz::fuzzTokenFileOne(data, size);
  return 0;
}
