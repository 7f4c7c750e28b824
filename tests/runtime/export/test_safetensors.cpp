// The safetensors writer and reader of edit-export: the header (alignment, dtype names,
// offsets), BF16 rounding, exact read-back with no temporary file left, and the
// reader's and writer's refusals.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstring>
#include <filesystem>
#include <map>
#include <random>

#include "export/safetensors.h"
#include "export_test_util.h"

using namespace edit;
using namespace edit::test;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Round to nearest even, written out on the bits: the rule torch's BFloat16 conversion
// must follow for the exported bytes to be what a reader expects.
uint16_t bf16Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) return static_cast<uint16_t>((u >> 16) | 0x40);
  const uint32_t lsb = (u >> 16) & 1u;
  return static_cast<uint16_t>((u + 0x7fffu + lsb) >> 16);
}

// An 8-byte length, the header text, then `data`.
std::string fileWith(const std::string& header, const std::string& data) {
  uint64_t n = header.size();
  return std::string(reinterpret_cast<const char*>(&n), 8) + header + data;
}

}  // namespace


TEST(Safetensors, HeaderIsAlignedAndTensorsTileTheData) {
  const auto dir = tempDir("edit-st");
  const auto f32 = torch::randn({2, 3});
  const auto odd = torch::randn({5});  // 10 bytes as BF16: would misalign what follows
  const auto i64 = torch::arange(3, torch::kInt64);
  const auto scalar = torch::tensor(1.5f).reshape({});
  std::vector<st::Item> items = {{"b.odd", odd, st::DType::BF16},
                                 {"a.f32", f32, st::DType::F32},
                                 {"c.i64", i64, st::DType::I64},
                                 {"d.scalar", scalar, st::DType::F32}};
  const std::string path = dir + "/x.safetensors";
  const uint64_t size = st::writeFile(path, items, {{"format", "pt"}, {"k", "v"}});
  const std::string bytes = readFile(path);
  ASSERT_EQ(bytes.size(), size);

  // Parsed here with a JSON library directly, not with the module's reader.
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ(n % 8, 0u) << "data section must start 8-byte aligned";
  const std::string text = bytes.substr(8, n);
  const auto close = text.find_last_of('}');
  EXPECT_EQ(text.find_first_not_of(' ', close + 1), std::string::npos) << "padding must be spaces";
  const json h = json::parse(text);
  EXPECT_EQ(h["__metadata__"], json({{"format", "pt"}, {"k", "v"}}));
  EXPECT_EQ(h["a.f32"]["dtype"], "F32");
  EXPECT_EQ(h["b.odd"]["dtype"], "BF16");
  EXPECT_EQ(h["c.i64"]["dtype"], "I64");
  EXPECT_EQ(h["a.f32"]["shape"], json({2, 3}));
  EXPECT_EQ(h["d.scalar"]["shape"], json::array());
  // Larger elements first: I64, then the F32s in the caller's order, then BF16.
  EXPECT_EQ(h["c.i64"]["data_offsets"], json({0, 24}));
  EXPECT_EQ(h["a.f32"]["data_offsets"], json({24, 48}));
  EXPECT_EQ(h["d.scalar"]["data_offsets"], json({48, 52}));
  EXPECT_EQ(h["b.odd"]["data_offsets"], json({52, 62}));
  EXPECT_EQ(bytes.size(), 8 + n + 62);
  for (const auto& [name, e] : h.items()) {
    if (name == "__metadata__") continue;
    const uint64_t begin = e["data_offsets"][0];
    const uint64_t elem = e["dtype"] == "I64" ? 8 : e["dtype"] == "F32" ? 4 : 2;
    EXPECT_EQ((8 + n + begin) % elem, 0u) << name << " is not aligned to its element size in the file";
  }
  const char* data = bytes.data() + 8 + n;
  EXPECT_EQ(std::memcmp(data + 0, i64.data_ptr(), 24), 0);
  EXPECT_EQ(std::memcmp(data + 24, f32.data_ptr(), 24), 0);
  EXPECT_EQ(std::memcmp(data + 48, scalar.data_ptr(), 4), 0);
  for (int i = 0; i < 5; ++i) {
    uint16_t got;
    std::memcpy(&got, data + 52 + 2 * i, 2);
    EXPECT_EQ(got, bf16Bits(odd[i].item<float>())) << i;
  }
  fs::remove_all(dir);
}

TEST(Safetensors, Bf16RoundsToNearestEven) {
  const auto dir = tempDir("edit-st");
  auto fromBits = [](uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  };
  // Ties both ways, just above/below a tie, signs, a subnormal, the largest finite float
  // (rounds to Inf), infinities, and random values.
  std::vector<float> v = {fromBits(0x3f808000), fromBits(0x3f818000), fromBits(0x3f808001), fromBits(0x3f807fff),
                          -1.0f, fromBits(0x80018000), fromBits(0x7f7fffff), INFINITY, -INFINITY, 0.0f, -0.0f};
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0, 3);
  for (int i = 0; i < 200; ++i) v.push_back(nd(rng));
  const auto t = torch::tensor(v);
  const std::string path = dir + "/b.safetensors";
  st::writeFile(path, {{"t", t, st::DType::BF16}}, {});
  const std::string bytes = readFile(path);
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  ASSERT_EQ(bytes.size(), 8 + n + 2 * v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    uint16_t got;
    std::memcpy(&got, bytes.data() + 8 + n + 2 * i, 2);
    EXPECT_EQ(got, bf16Bits(v[i])) << "value " << i << " = " << v[i];
  }
  EXPECT_EQ(bf16Bits(fromBits(0x3f808000)), 0x3f80);  // the helper itself: tie to even
  EXPECT_EQ(bf16Bits(fromBits(0x3f818000)), 0x3f82);
  fs::remove_all(dir);
}

TEST(Safetensors, ReadBackIsExactAndLeavesNoTemporaryFile) {
  const auto dir = tempDir("edit-st");
  const auto a = torch::randn({4, 7});
  const auto b = torch::randn({3});
  st::writeFile(dir + "/m.safetensors", {{"a", a, st::DType::F32}, {"b", b, st::DType::BF16}}, {{"x", "y"}});
  std::map<std::string, torch::Tensor> back;
  const auto h = st::readFile(dir + "/m.safetensors", back);
  ASSERT_EQ(back.size(), 2u);
  EXPECT_TRUE(torch::equal(back.at("a"), a));
  EXPECT_EQ(back.at("b").scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(torch::equal(back.at("b"), b.to(torch::kBFloat16)));
  EXPECT_EQ(h.metadata.at("x"), "y");
  int files = 0;
  for (auto& e : fs::directory_iterator(dir)) files += e.is_regular_file();
  EXPECT_EQ(files, 1);
  fs::remove_all(dir);
}

TEST(Safetensors, WriterRefusesBadNamesAndConversions) {
  const auto t = torch::zeros({2});
  EXPECT_ERROR(st::FormatError, st::buildHeader({{"a", t, st::DType::F32}, {"a", t, st::DType::F32}}, {}),
               "duplicate tensor name a");
  EXPECT_ERROR(st::FormatError, st::buildHeader({{"__metadata__", t, st::DType::F32}}, {}), "invalid tensor name");
  EXPECT_ERROR(st::FormatError, st::buildHeader({{"", t, st::DType::F32}}, {}), "invalid tensor name");
  const auto dir = tempDir("edit-st");
  EXPECT_ERROR(st::FormatError, st::writeFile(dir + "/f", {{"x", t, st::DType::I64}}, {}), "cannot store");
  EXPECT_FALSE(fs::exists(dir + "/f"));
  EXPECT_TRUE(fs::is_empty(dir)) << "a failed write must not leave its temporary file";
  fs::remove_all(dir);
}

TEST(Safetensors, ReaderRefusesMalformedFiles) {
  auto parse = [](const std::string& file) { return st::parseHeader(file, file.size(), "f.safetensors"); };
  const std::string ok = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  EXPECT_NO_THROW(parse(fileWith(ok, std::string(8, '\0'))));
  EXPECT_ERROR(st::FormatError, parse("abc"), "shorter than the 8-byte");
  {
    std::string f = fileWith(ok, std::string(8, '\0'));
    uint64_t huge = 1000;
    std::memcpy(f.data(), &huge, 8);
    EXPECT_ERROR(st::FormatError, parse(f), "runs past the end");
    huge = 200'000'000;
    std::memcpy(f.data(), &huge, 8);
    EXPECT_ERROR(st::FormatError, parse(f), "exceeds 100 MB");
  }
  EXPECT_ERROR(st::FormatError, parse(fileWith("{\"a\":", "")), "not valid JSON");
  EXPECT_ERROR(st::FormatError, parse(fileWith("[1,2]", "")), "not a JSON object");
  EXPECT_ERROR(st::FormatError,
               parse(fileWith(R"({"a":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[0,2]}})", std::string(2, 0))),
               "unsupported dtype");
  EXPECT_ERROR(st::FormatError,
               parse(fileWith(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", std::string(8, 0))),
               "do not hold 3 F32 values");
  EXPECT_ERROR(st::FormatError,
               parse(fileWith(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,8]}})", std::string(8, 0))),
               "shape holds -1");
  EXPECT_ERROR(st::FormatError,
               parse(fileWith(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", std::string(8, 0))),
               "do not hold");
  EXPECT_ERROR(st::FormatError, parse(fileWith(R"({"a":{"dtype":"F32","shape":[2]}})", std::string(8, 0))),
               "needs dtype, shape and data_offsets");
  // A gap, an overlap, trailing bytes, a truncated data section.
  EXPECT_ERROR(st::FormatError,
               parse(fileWith(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", std::string(8, 0))),
               "without gaps or overlaps");
  EXPECT_ERROR(st::FormatError,
               parse(fileWith(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                              R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                              std::string(8, 0))),
               "without gaps or overlaps");
  EXPECT_ERROR(st::FormatError, parse(fileWith(ok, std::string(12, '\0'))), "trailing bytes");
  EXPECT_ERROR(st::FormatError, parse(fileWith(ok, std::string(4, '\0'))), "truncated");
  EXPECT_ERROR(st::FormatError, parse(fileWith(R"({"__metadata__":{"k":1}})", "")), "is not a string");
  // Whole files: a missing one, and the reader names the file.
  std::map<std::string, torch::Tensor> none;
  EXPECT_ERROR(st::FormatError, st::readFile("/nonexistent/x.safetensors", none), "/nonexistent/x.safetensors");
}
