// Token files, the byte tokenizer and the batch sampler. Expected values are computed
// from the raw bytes of the files, not through TokenFile.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "data/data.h"

using namespace edit::data;

namespace {

struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/edit-data-test-XXXXXX";
    path = mkdtemp(tmpl);
  }
  ~TempDir() { std::system(("rm -rf '" + path + "'").c_str()); }
  std::string file(const std::string& name) const { return path + "/" + name; }
};

std::string readBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void writeBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::vector<uint32_t> ramp(size_t n, uint32_t mod) {
  std::vector<uint32_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint32_t>((i * 7919 + 3) % mod);
  return v;
}

// The message of the DataError thrown by opening `path` ("" if none).
std::string openError(const std::string& path) {
  try {
    TokenFile::open(path);
  } catch (const DataError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Data, WriteReadEachFormat) {
  TempDir dir;
  struct Case { TokenFormat fmt; uint32_t mod; size_t header, width; };
  for (const Case& c : {Case{TokenFormat::LlmcU16, 65536, 1024, 2}, Case{TokenFormat::LlmcU32, 200000, 1024, 4},
                        Case{TokenFormat::NanoGptU16, 50257, 0, 2}}) {
    const std::string path = dir.file("t" + std::to_string(static_cast<int>(c.fmt)) + ".bin");
    const auto toks = ramp(5000, c.mod);
    writeTokenFile(path, toks, c.fmt);
    const std::string raw = readBytes(path);
    ASSERT_EQ(raw.size(), c.header + toks.size() * c.width);
    if (c.header) {
      int32_t h[3];
      std::memcpy(h, raw.data(), sizeof h);
      EXPECT_EQ(h[0], c.fmt == TokenFormat::LlmcU16 ? 20240520 : 20240801);
      EXPECT_EQ(h[1], c.fmt == TokenFormat::LlmcU16 ? 1 : 7);
      EXPECT_EQ(h[2], 5000);
    }
    TokenFile f = TokenFile::open(path);
    EXPECT_EQ(f.format(), c.fmt);
    ASSERT_EQ(f.size(), toks.size());
    std::vector<int64_t> all(toks.size());
    f.copy(0, toks.size(), all.data());
    uint32_t mx = 0;
    for (size_t i = 0; i < toks.size(); ++i) {
      ASSERT_EQ(all[i], toks[i]) << i;
      ASSERT_EQ(f.at(i), toks[i]);
      mx = std::max(mx, toks[i]);
    }
    EXPECT_EQ(f.maxToken(), mx);
    EXPECT_THROW(f.copy(4999, 2, all.data()), DataError);
    TokenFile moved = std::move(f);
    EXPECT_EQ(moved.at(10), toks[10]);
  }
  // No temp files left behind by the atomic writes.
  EXPECT_EQ(std::system(("test -z \"$(ls " + dir.path + " | grep tmp)\"").c_str()), 0);
}

TEST(Data, WriteRejectsTokensThatDoNotFit) {
  TempDir dir;
  EXPECT_THROW(writeTokenFile(dir.file("x.bin"), {1, 70000}, TokenFormat::LlmcU16), DataError);
  EXPECT_THROW(writeTokenFile(dir.file("y.bin"), {70000}, TokenFormat::NanoGptU16), DataError);
  EXPECT_THROW(writeTokenFile("/nonexistent-dir/z.bin", {1}, TokenFormat::LlmcU16), DataError);
}

TEST(Data, TruncatedFileNamesTheFile) {
  TempDir dir;
  const std::string path = dir.file("trunc.bin");
  writeTokenFile(path, ramp(1000, 256), TokenFormat::LlmcU16);
  std::string raw = readBytes(path);
  writeBytes(path, raw.substr(0, raw.size() - 4));
  const std::string err = openError(path);
  EXPECT_NE(err.find(path), std::string::npos) << err;
  EXPECT_NE(err.find("header says 1000 tokens but the file holds 998 (truncated?)"), std::string::npos) << err;

  writeBytes(path, raw.substr(0, 100));  // shorter than the header
  EXPECT_NE(openError(path).find("truncated"), std::string::npos);

  const std::string odd = dir.file("odd.bin");
  writeBytes(odd, "abc");
  EXPECT_NE(openError(odd).find(odd), std::string::npos);

  EXPECT_NE(openError(dir.file("missing.bin")).find("missing.bin"), std::string::npos);
}

TEST(Data, BadMagicAndVersion) {
  TempDir dir;
  const std::string path = dir.file("hdr.bin");
  writeTokenFile(path, ramp(100, 256), TokenFormat::LlmcU16);
  std::string raw = readBytes(path);

  std::string badVersion = raw;
  int32_t v = 3;
  std::memcpy(&badVersion[4], &v, 4);
  writeBytes(path, badVersion);
  std::string err = openError(path);
  EXPECT_NE(err.find(path), std::string::npos);
  EXPECT_NE(err.find("version 3"), std::string::npos) << err;

  std::string badMagic = raw;
  int32_t m = 20991231;
  std::memcpy(&badMagic[0], &m, 4);
  writeBytes(path, badMagic);
  err = openError(path);
  EXPECT_NE(err.find(path), std::string::npos);
  EXPECT_NE(err.find("unknown llm.c magic 20991231"), std::string::npos) << err;
}

TEST(Data, HeaderlessIsNanoGpt) {
  TempDir dir;
  const std::string path = dir.file("n.bin");
  std::vector<uint16_t> raw = {5, 6, 7, 65535};
  writeBytes(path, std::string(reinterpret_cast<const char*>(raw.data()), raw.size() * 2));
  TokenFile f = TokenFile::open(path);
  EXPECT_EQ(f.format(), TokenFormat::NanoGptU16);
  ASSERT_EQ(f.size(), 4u);
  EXPECT_EQ(f.at(3), 65535u);
  EXPECT_EQ(f.maxToken(), 65535u);
}

TEST(Data, ByteTokenizerRoundTrip) {
  std::string text = "Hello, EDiT!\n";
  for (int b = 0; b < 256; ++b) text += static_cast<char>(b);
  const auto toks = ByteTokenizer::encode(text);
  ASSERT_EQ(toks.size(), text.size());
  EXPECT_EQ(toks[0], static_cast<uint32_t>('H'));
  EXPECT_EQ(toks.back(), 255u);
  EXPECT_EQ(ByteTokenizer::decode(toks), text);
  EXPECT_THROW(ByteTokenizer::decode({256}), DataError);
}

TEST(Data, SamplerIsDeterministicAndStreamsDiffer) {
  TempDir dir;
  const std::string path = dir.file("s.bin");
  writeTokenFile(path, ramp(20000, 50000), TokenFormat::LlmcU16);
  TokenFile f = TokenFile::open(path);
  const int64_t L = 32, B = 4;
  BatchSampler a(f, L, B, 42, 0), a2(f, L, B, 42, 0), b(f, L, B, 42, 1), c(f, L, B, 43, 0);
  std::vector<int64_t> x1(L * B), y1(L * B), x2(L * B), y2(L * B);
  for (uint64_t k : {0ull, 1ull, 999ull}) {
    a.fill(k, x1.data(), y1.data());
    a2.fill(k, x2.data(), y2.data());
    EXPECT_EQ(x1, x2);
    EXPECT_EQ(y1, y2);
    b.fill(k, x2.data(), y2.data());
    EXPECT_NE(x1, x2) << "streams must differ";
    c.fill(k, x2.data(), y2.data());
    EXPECT_NE(x1, x2) << "seeds must differ";
  }
  a.fill(0, x1.data(), y1.data());
  a.fill(1, x2.data(), y2.data());
  EXPECT_NE(x1, x2) << "batches must differ";
}

// Each row must be a window of the file: inputs = tokens[o, o+L), targets = tokens[o+1,
// o+L]. The offset is found by searching the raw file bytes, independently of TokenFile.
TEST(Data, SamplerRowsAreShiftedWindowsInRange) {
  TempDir dir;
  const std::string path = dir.file("w.bin");
  // Distinct tokens make every window's position unique.
  std::vector<uint32_t> toks(3000);
  for (size_t i = 0; i < toks.size(); ++i) toks[i] = static_cast<uint32_t>(i * 13 % 3001);
  writeTokenFile(path, toks, TokenFormat::LlmcU32);
  const std::string raw = readBytes(path);
  auto fileToken = [&](size_t i) {
    uint32_t t;
    std::memcpy(&t, raw.data() + 1024 + 4 * i, 4);
    return static_cast<int64_t>(t);
  };
  TokenFile f = TokenFile::open(path);
  const int64_t L = 50, B = 8;
  BatchSampler s(f, L, B, 7, 3);
  std::vector<int64_t> x(L * B), y(L * B);
  std::set<size_t> offsets;
  for (uint64_t k = 0; k < 200; ++k) {
    s.fill(k, x.data(), y.data());
    for (int64_t r = 0; r < B; ++r) {
      size_t off = SIZE_MAX;
      for (size_t o = 0; o < toks.size(); ++o)
        if (fileToken(o) == x[r * L]) off = o;
      ASSERT_NE(off, SIZE_MAX);
      ASSERT_LE(off + L, toks.size() - 1) << "window runs past the end";
      for (int64_t j = 0; j < L; ++j) {
        ASSERT_EQ(x[r * L + j], fileToken(off + j));
        ASSERT_EQ(y[r * L + j], fileToken(off + j + 1));
      }
      offsets.insert(off);
    }
  }
  EXPECT_GT(offsets.size(), 1000u);  // 1600 draws over 2950 offsets spread widely
}

TEST(Data, SamplerNeedsSeqLenPlusOneTokens) {
  TempDir dir;
  const std::string path = dir.file("short.bin");
  writeTokenFile(path, ramp(10, 256), TokenFormat::LlmcU16);
  TokenFile f = TokenFile::open(path);
  try {
    BatchSampler s(f, 10, 1, 1, 0);
    FAIL();
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos);
  }
  BatchSampler ok(f, 9, 2, 1, 0);  // exactly seqLen + 1 tokens: offset 0 only
  std::vector<int64_t> x(18), y(18);
  ok.fill(5, x.data(), y.data());
  EXPECT_EQ(x[0], f.at(0));
  EXPECT_EQ(y[8], f.at(9));
}

TEST(Data, Mix64IsSplitmix) {
  // Reference values of splitmix64 seeded with 0 (the first two outputs of the generator).
  EXPECT_EQ(mix64(0), 0xe220a8397b1dcdafULL);
  EXPECT_EQ(mix64(0x9e3779b97f4a7c15ULL), 0x6e789e6aa1b965f4ULL);
}
