// Elastic replicas (docs/elastic.md): the points at which a job changes its number of
// replicas, "STEP:M,STEP:M" (edit-run --scale-at, EDIT_SCALE_AT). edit-run and edit-train
// parse it with this one function, so both accept and reject the same text.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace edit {

struct ScalePoint {
  int64_t step = 0;  // at the first sync round at or after this step
  int replicas = 1;  // the job continues with this many replicas
};

// Steps strictly increasing, step and replicas >= 1. Throws std::runtime_error naming `what`.
inline std::vector<ScalePoint> parseScalePoints(const std::string& text, const std::string& what) {
  std::vector<ScalePoint> out;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    const std::string item = text.substr(start, end - start);
    const size_t colon = item.find(':');
    ScalePoint p;
    try {
      if (colon == std::string::npos) throw std::invalid_argument(item);
      size_t a = 0, b = 0;
      p.step = std::stoll(item.substr(0, colon), &a);
      p.replicas = std::stoi(item.substr(colon + 1), &b);
      if (a != colon || b != item.size() - colon - 1) throw std::invalid_argument(item);
    } catch (const std::exception&) {
      throw std::runtime_error(what + ": \"" + item + "\" is not STEP:REPLICAS (e.g. 100:3)");
    }
    if (p.step < 1 || p.replicas < 1)
      throw std::runtime_error(what + ": \"" + item + "\": STEP and REPLICAS must be >= 1");
    if (!out.empty() && p.step <= out.back().step)
      throw std::runtime_error(what + ": steps must increase (" + std::to_string(out.back().step) + " then " +
                               std::to_string(p.step) + ")");
    out.push_back(p);
    start = end + 1;
  }
  return out;
}

}  // namespace edit
