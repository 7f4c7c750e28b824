// Token data: llm.c / nanoGPT token files, a byte-level tokenizer and a deterministic,
// resumable batch sampler. No LibTorch here: the trainer wraps the buffers in tensors.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace edit::data {

struct DataError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

enum class TokenFormat {
  LlmcU16,    // 1024-byte header: int32 magic 20240520, version 1, token count; uint16 tokens
  LlmcU32,    // 1024-byte header: int32 magic 20240801, version 7, token count; uint32 tokens
  NanoGptU16  // headerless uint16 tokens
};

// A read-only, memory-mapped token file. Detects the format from the header (a file
// without an llm.c magic is nanoGPT uint16). A header whose token count does not match
// the file size, an odd size, or a bad version throws DataError naming the file.
class TokenFile {
 public:
  static TokenFile open(const std::string& path);
  TokenFile(TokenFile&&) noexcept;
  TokenFile& operator=(TokenFile&&) noexcept;
  TokenFile(const TokenFile&) = delete;
  ~TokenFile();

  size_t size() const { return count_; }
  TokenFormat format() const { return format_; }
  uint32_t at(size_t i) const;
  // Copies n tokens starting at `start` as int64 (what embedding lookups take).
  void copy(size_t start, size_t n, int64_t* out) const;
  uint32_t maxToken() const;  // scans once, cached
  const std::string& path() const { return path_; }

 private:
  TokenFile() = default;
  std::string path_;
  TokenFormat format_ = TokenFormat::NanoGptU16;
  const unsigned char* map_ = nullptr;
  size_t mapBytes_ = 0;
  const unsigned char* tokens_ = nullptr;
  size_t count_ = 0;
  mutable int64_t maxToken_ = -1;
};

// Writes a token file atomically (temp file, fsync, rename). Tokens must fit the format.
void writeTokenFile(const std::string& path, const std::vector<uint32_t>& tokens,
                    TokenFormat format);

// Byte-level tokenizer: token = byte value (vocabulary 256).
struct ByteTokenizer {
  static constexpr int64_t kVocab = 256;
  static std::vector<uint32_t> encode(const std::string& text);
  static std::string decode(const std::vector<uint32_t>& tokens);
};

// Draws batches of (inputs, targets) windows of seqLen+1 tokens at pseudo-random offsets.
// Batch k of stream s is a pure function of (seed, s, k): streams (one per rank) differ,
// runs repeat, and a resumed run continues the same sequence from k.
class BatchSampler {
 public:
  BatchSampler(const TokenFile& file, int64_t seqLen, int64_t batchSize, uint64_t seed,
               uint64_t stream);
  // inputs and targets each hold batchSize * seqLen int64 values, row-major.
  void fill(uint64_t batchIndex, int64_t* inputs, int64_t* targets) const;
  int64_t seqLen() const { return seqLen_; }
  int64_t batchSize() const { return batchSize_; }

 private:
  const TokenFile* file_;
  int64_t seqLen_, batchSize_;
  uint64_t seed_, stream_;
};

// Deterministic 64-bit mixing (splitmix64), shared by the sampler and the trainer.
uint64_t mix64(uint64_t x);

}  // namespace edit::data
