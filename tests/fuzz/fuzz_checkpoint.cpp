// libFuzzer entry point for the checkpoint target; the work is in target_checkpoint.h (shared with the corpus
// replay tests). Run: build-fuzz/tests/fuzz/fuzz_checkpoint tests/fuzz/corpus/checkpoint (README.md).
#include "target_checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  edit::fuzz::fuzzCheckpointOne(data, size);
  return 0;
}
