// libFuzzer entry point for the manifest target; the work is in target_checkpoint.h (shared with the corpus
// replay tests). Run: build-fuzz/tests/fuzz/fuzz_manifest tests/fuzz/corpus/manifest (README.md).
#include "target_checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  edit::fuzz::fuzzManifestOne(data, size);
  return 0;
}
