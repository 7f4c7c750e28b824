// Token files (llm.c and nanoGPT layouts), the byte tokenizer and the batch sampler.
#include "data/data.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>
#include <utility>

namespace edit::data {
namespace {

constexpr size_t kHeaderInts = 256;
constexpr size_t kHeaderBytes = kHeaderInts * sizeof(int32_t);
constexpr int32_t kMagicU16 = 20240520, kVersionU16 = 1;
constexpr int32_t kMagicU32 = 20240801, kVersionU32 = 7;

std::string sysError(const std::string& what) { return what + ": " + std::strerror(errno); }

size_t widthOf(TokenFormat f) { return f == TokenFormat::LlmcU32 ? 4 : 2; }

// Closes a descriptor on every exit path.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

void writeAll(int fd, const void* data, size_t n, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      throw DataError(sysError(path + ": write failed"));
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}

std::string dirOf(const std::string& path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

}  // namespace

uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

TokenFile TokenFile::open(const std::string& path) {
  TokenFile f;
  f.path_ = path;
  Fd fd{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (fd.fd < 0)
    throw DataError(sysError(path + ": cannot open token file") +
                    " (run scripts/prepare-data.sh or edit-data encode to create it)");
  struct stat st {};
  if (::fstat(fd.fd, &st) != 0) throw DataError(sysError(path + ": stat failed"));
  if (!S_ISREG(st.st_mode)) throw DataError(path + ": not a regular file");
  const size_t bytes = static_cast<size_t>(st.st_size);
  if (bytes > 0) {
    void* m = ::mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, fd.fd, 0);
    if (m == MAP_FAILED) throw DataError(sysError(path + ": mmap failed"));
    f.map_ = static_cast<const unsigned char*>(m);
    f.mapBytes_ = bytes;
  }
  // From here on f owns the mapping: a throw unmaps it in ~TokenFile.

  int32_t hdr[kHeaderInts] = {};
  if (bytes >= 8) std::memcpy(hdr, f.map_, std::min(bytes, kHeaderBytes));
  const bool knownMagic = hdr[0] == kMagicU16 || hdr[0] == kMagicU32;
  if (knownMagic) {
    const bool u32 = hdr[0] == kMagicU32;
    const int32_t want = u32 ? kVersionU32 : kVersionU16;
    if (bytes < kHeaderBytes)
      throw DataError(path + ": " + std::to_string(bytes) + " bytes, shorter than the 1024-byte llm.c header (truncated?)");
    if (hdr[1] != want)
      throw DataError(path + ": llm.c header version " + std::to_string(hdr[1]) + " with magic " +
                      std::to_string(hdr[0]) + "; expected version " + std::to_string(want) +
                      " (re-encode the file with edit-data encode)");
    f.format_ = u32 ? TokenFormat::LlmcU32 : TokenFormat::LlmcU16;
    const size_t width = widthOf(f.format_);
    if (hdr[2] < 0) throw DataError(path + ": llm.c header has a negative token count");
    const size_t declared = static_cast<size_t>(hdr[2]);
    const size_t body = bytes - kHeaderBytes;
    if (body % width != 0 || body / width != declared) {
      const size_t held = body / width;
      throw DataError(path + ": header says " + std::to_string(declared) + " tokens but the file holds " +
                      std::to_string(held) + (held < declared ? " (truncated?)" : " (trailing bytes?)") +
                      "; re-create it with scripts/prepare-data.sh or edit-data encode");
    }
    f.count_ = declared;
    f.tokens_ = f.map_ + kHeaderBytes;
    return f;
  }
  // An llm.c-shaped header (zeros after the first three ints) with a magic we do not know:
  // better an error than reading the header as tokens.
  if (bytes >= kHeaderBytes && hdr[0] != 0 &&
      std::all_of(hdr + 3, hdr + kHeaderInts, [](int32_t v) { return v == 0; }))
    throw DataError(path + ": unknown llm.c magic " + std::to_string(hdr[0]) + " (expected " +
                    std::to_string(kMagicU16) + " for uint16 or " + std::to_string(kMagicU32) +
                    " for uint32 tokens)");
  if (bytes % 2 != 0)
    throw DataError(path + ": " + std::to_string(bytes) +
                    " bytes, an odd size: not a headerless nanoGPT uint16 file (truncated?)");
  f.format_ = TokenFormat::NanoGptU16;
  f.count_ = bytes / 2;
  f.tokens_ = f.map_;
  return f;
}

TokenFile::TokenFile(TokenFile&& o) noexcept { *this = std::move(o); }

TokenFile& TokenFile::operator=(TokenFile&& o) noexcept {
  if (this == &o) return *this;
  if (map_) ::munmap(const_cast<unsigned char*>(map_), mapBytes_);
  path_ = std::move(o.path_);
  format_ = o.format_;
  map_ = std::exchange(o.map_, nullptr);
  mapBytes_ = std::exchange(o.mapBytes_, 0);
  tokens_ = std::exchange(o.tokens_, nullptr);
  count_ = std::exchange(o.count_, 0);
  maxToken_ = o.maxToken_;
  return *this;
}

TokenFile::~TokenFile() {
  if (map_) ::munmap(const_cast<unsigned char*>(map_), mapBytes_);
}

uint32_t TokenFile::at(size_t i) const {
  if (i >= count_)
    throw DataError(path_ + ": token index " + std::to_string(i) + " out of range (" +
                    std::to_string(count_) + " tokens)");
  if (format_ == TokenFormat::LlmcU32) return reinterpret_cast<const uint32_t*>(tokens_)[i];
  return reinterpret_cast<const uint16_t*>(tokens_)[i];
}

void TokenFile::copy(size_t start, size_t n, int64_t* out) const {
  if (start > count_ || n > count_ - start)
    throw DataError(path_ + ": read of " + std::to_string(n) + " tokens at " + std::to_string(start) +
                    " past the end (" + std::to_string(count_) + " tokens)");
  // The header is 1024 bytes and mappings are page aligned, so the casts are aligned.
  if (format_ == TokenFormat::LlmcU32) {
    const uint32_t* src = reinterpret_cast<const uint32_t*>(tokens_) + start;
    for (size_t i = 0; i < n; ++i) out[i] = src[i];
  } else {
    const uint16_t* src = reinterpret_cast<const uint16_t*>(tokens_) + start;
    for (size_t i = 0; i < n; ++i) out[i] = src[i];
  }
}

uint32_t TokenFile::maxToken() const {
  if (maxToken_ >= 0) return static_cast<uint32_t>(maxToken_);
  uint32_t m = 0;
  if (format_ == TokenFormat::LlmcU32) {
    const uint32_t* p = reinterpret_cast<const uint32_t*>(tokens_);
    for (size_t i = 0; i < count_; ++i) m = std::max(m, p[i]);
  } else {
    const uint16_t* p = reinterpret_cast<const uint16_t*>(tokens_);
    uint16_t m16 = 0;
    for (size_t i = 0; i < count_; ++i) m16 = std::max(m16, p[i]);
    m = m16;
  }
  maxToken_ = m;
  return m;
}

void writeTokenFile(const std::string& path, const std::vector<uint32_t>& tokens, TokenFormat format) {
  const size_t width = widthOf(format);
  if (width == 2) {
    for (size_t i = 0; i < tokens.size(); ++i)
      if (tokens[i] > 0xFFFF)
        throw DataError(path + ": token " + std::to_string(tokens[i]) + " at " + std::to_string(i) +
                        " does not fit uint16; use the llmc32 format");
  }
  if (format != TokenFormat::NanoGptU16 && tokens.size() > 0x7FFFFFFFULL)
    throw DataError(path + ": " + std::to_string(tokens.size()) +
                    " tokens exceed the llm.c header's int32 count; split the data");

  // A unique temp name in the same directory, so rename() is atomic.
  std::random_device rd;
  const std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(rd());
  Fd fd{::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644)};
  if (fd.fd < 0) throw DataError(sysError(path + ": cannot create " + tmp));
  try {
    if (format != TokenFormat::NanoGptU16) {
      int32_t hdr[kHeaderInts] = {};
      const bool u32 = format == TokenFormat::LlmcU32;
      hdr[0] = u32 ? kMagicU32 : kMagicU16;
      hdr[1] = u32 ? kVersionU32 : kVersionU16;
      hdr[2] = static_cast<int32_t>(tokens.size());
      writeAll(fd.fd, hdr, sizeof hdr, tmp);
    }
    if (width == 4) {
      writeAll(fd.fd, tokens.data(), tokens.size() * 4, tmp);
    } else {
      std::vector<uint16_t> buf;
      const size_t chunk = 1 << 20;
      for (size_t i = 0; i < tokens.size(); i += chunk) {
        const size_t n = std::min(chunk, tokens.size() - i);
        buf.assign(tokens.begin() + i, tokens.begin() + i + n);
        writeAll(fd.fd, buf.data(), n * 2, tmp);
      }
    }
    if (::fsync(fd.fd) != 0) throw DataError(sysError(tmp + ": fsync failed"));
    ::close(fd.fd);
    fd.fd = -1;
    if (::rename(tmp.c_str(), path.c_str()) != 0) throw DataError(sysError(path + ": rename failed"));
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  // Make the rename itself durable.
  Fd dir{::open(dirOf(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  if (dir.fd >= 0) ::fsync(dir.fd);
}

std::vector<uint32_t> ByteTokenizer::encode(const std::string& text) {
  std::vector<uint32_t> out(text.size());
  for (size_t i = 0; i < text.size(); ++i) out[i] = static_cast<unsigned char>(text[i]);
  return out;
}

std::string ByteTokenizer::decode(const std::vector<uint32_t>& tokens) {
  std::string out(tokens.size(), '\0');
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] >= kVocab)
      throw DataError("byte tokenizer: token " + std::to_string(tokens[i]) + " at " + std::to_string(i) +
                      " is not a byte (vocabulary 256)");
    out[i] = static_cast<char>(tokens[i]);
  }
  return out;
}

BatchSampler::BatchSampler(const TokenFile& file, int64_t seqLen, int64_t batchSize, uint64_t seed,
                           uint64_t stream)
    : file_(&file), seqLen_(seqLen), batchSize_(batchSize), seed_(seed), stream_(stream) {
  if (seqLen < 1 || batchSize < 1)
    throw DataError(file.path() + ": sampler needs seqLen >= 1 and batchSize >= 1 (got " +
                    std::to_string(seqLen) + ", " + std::to_string(batchSize) + ")");
  if (file.size() < static_cast<size_t>(seqLen) + 1)
    throw DataError(file.path() + ": holds " + std::to_string(file.size()) +
                    " tokens; a training window needs data.seqLen + 1 = " + std::to_string(seqLen + 1) +
                    " (use more data or a shorter data.seqLen)");
}

void BatchSampler::fill(uint64_t batchIndex, int64_t* inputs, int64_t* targets) const {
  const size_t L = static_cast<size_t>(seqLen_);
  // Offsets uniform in [0, size - seqLen - 1], so that offset + seqLen is a valid index.
  const uint64_t range = file_->size() - L;
  const uint64_t base = mix64(mix64(mix64(seed_) ^ stream_) ^ batchIndex);
  for (int64_t row = 0; row < batchSize_; ++row) {
    const uint64_t h = mix64(base ^ static_cast<uint64_t>(row));
    const uint64_t off = static_cast<uint64_t>((static_cast<unsigned __int128>(h) * range) >> 64);
    int64_t* in = inputs + row * seqLen_;
    int64_t* tg = targets + row * seqLen_;
    file_->copy(off, L, in);
    std::copy(in + 1, in + L, tg);  // targets are the inputs shifted by one token
    tg[L - 1] = file_->at(off + L);
  }
}

}  // namespace edit::data
