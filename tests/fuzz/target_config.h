// One fuzz input through the runtime configuration parser (common/src/worker_config.h).
// Contract checked: parseConfig and applyOverrides throw nothing but ConfigError, and an
// accepted configuration survives toYaml -> parseConfig unchanged (the operator writes
// toYaml's text into the job's ConfigMap and checkpoints store it in the MANIFEST).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "worker_config.h"

namespace edit::fuzz {

inline void fuzzConfigOne(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  Config cfg;
  try {
    cfg = parseConfig(text);
  } catch (const ConfigError&) {
    // The same bytes as --set / EDIT_SET assignments, one per line.
    std::vector<std::string> assignments;
    size_t start = 0;
    while (start <= text.size() && assignments.size() < 64) {
      size_t nl = text.find('\n', start);
      if (nl == std::string::npos) nl = text.size();
      assignments.push_back(text.substr(start, nl - start));
      start = nl + 1;
    }
    try {
      Config c;
      applyOverrides(c, assignments);
    } catch (const ConfigError&) {
    }
    return;
  }
  const std::string yaml = toYaml(cfg);
  Config back;
  try {
    back = parseConfig(yaml);
  } catch (const ConfigError& e) {
    throw std::logic_error(std::string("accepted config does not read back from toYaml: ") + e.what());
  }
  if (toYaml(back) != yaml) throw std::logic_error("toYaml -> parseConfig -> toYaml changed the config");
}

}  // namespace edit::fuzz
