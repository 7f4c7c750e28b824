// edit-config-schema: prints the workers' config schema (OpenAPI v3 JSON, what
// `edit-train --print-schema` prints) from the LibTorch-free config library, so that
// scripts/schema_outputs.py can make the config fuzzer's dictionary in any build.
#include <iostream>
#include <string>

#include "worker_config.h"

int main(int argc, char** argv) {
  if (argc > 1) {
    std::cerr << "usage: edit-config-schema\n  prints the worker config's schema (OpenAPI v3 JSON) on stdout\n";
    return std::string(argv[1]) == "--help" ? 0 : 2;
  }
  std::cout << edit::workerConfigSchemaJson();
  return 0;
}
