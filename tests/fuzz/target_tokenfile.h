// One fuzz input through the token-file reader (runtime/src/data/data.h): the bytes become a
// file, TokenFile::open reads it, every token is read back, and a BatchSampler draws
// batches from it.
// Contract checked: only DataError is thrown; copy(), at() and maxToken() agree; every
// sampled row is a window of the file with targets = inputs shifted by one.
#pragma once

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "data/data.h"
#include "fuzz_util.h"

namespace edit::fuzz {

inline void fuzzTokenFileOne(const uint8_t* data, size_t size) {
  using namespace edit::data;
  const std::string path = scratchDir() + "/tokens.bin";
  writeFile(path, data, size);
  try {
    TokenFile f = TokenFile::open(path);
    const size_t n = f.size();
    std::vector<int64_t> all(n);
    if (n) f.copy(0, n, all.data());
    uint32_t mx = 0;
    for (size_t i = 0; i < n; ++i) {
      if (static_cast<int64_t>(f.at(i)) != all[i]) throw std::logic_error("at() and copy() disagree");
      mx = std::max<uint32_t>(mx, f.at(i));
    }
    if (n && f.maxToken() != mx) throw std::logic_error("maxToken() is not the maximum");
    // Reads past the end are errors, never out-of-bounds reads.
    try {
      int64_t one;
      f.copy(n, 1, &one);
      throw std::logic_error("copy past the end did not throw");
    } catch (const DataError&) {
    }
    // A window longer than the file is refused.
    try {
      BatchSampler tooLong(f, static_cast<int64_t>(n) + 1, 1, 1, 0);
      throw std::logic_error("a sampler window longer than the file was accepted");
    } catch (const DataError&) {
    }
    if (n < 2) return;
    const uint8_t b0 = size ? data[0] : 0, b1 = size > 1 ? data[1] : 0;
    const int64_t seqLen = 1 + static_cast<int64_t>(b0 % std::min<size_t>(n - 1, 64));
    const int64_t batch = 1 + b1 % 4;
    BatchSampler s(f, seqLen, batch, /*seed=*/size, /*stream=*/b1);
    std::vector<int64_t> in(seqLen * batch), tg(seqLen * batch);
    for (uint64_t k = 0; k < 3; ++k) {
      s.fill(k, in.data(), tg.data());
      for (int64_t r = 0; r < batch; ++r) {
        const int64_t* x = in.data() + r * seqLen;
        const int64_t* y = tg.data() + r * seqLen;
        for (int64_t i = 0; i + 1 < seqLen; ++i)
          if (y[i] != x[i + 1]) throw std::logic_error("targets are not the inputs shifted by one");
        for (int64_t i = 0; i < seqLen; ++i)
          if (x[i] < 0 || x[i] > mx || y[i] < 0 || y[i] > mx) throw std::logic_error("sampled token not in the file");
      }
    }
  } catch (const DataError&) {
  }
}

}  // namespace edit::fuzz
