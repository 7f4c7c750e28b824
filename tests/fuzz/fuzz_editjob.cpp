// libFuzzer entry point for the editjob target; the work is in target_editjob.h (shared with the corpus
// replay tests). Run: build-fuzz/tests/fuzz/fuzz_editjob tests/fuzz/corpus/editjob (README.md).
#include "target_editjob.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  edit::fuzz::fuzzEditJobOne(data, size);
  return 0;
}
