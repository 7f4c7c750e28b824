// Checkpoint files: round trip, checksums, atomic writes, manifests, pruning.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "train/checkpoint.h"
#include "test_util.h"

using namespace edit;
namespace fs = std::filesystem;

TEST(Checkpoint, Crc32KnownVector) { EXPECT_EQ(crc32("123456789", 9), 0xCBF43926u); }

TEST(Checkpoint, RoundTripIsExact) {
  const auto dir = test::tempDir("edit-ckpt");
  NamedTensors t{{"a", torch::randn({3, 4})}, {"b", torch::arange(5, torch::kInt64)},
                 {"c", torch::tensor({1.5, -2.0}, torch::kFloat64)}};
  writeCheckpointFile(dir + "/x.ckpt", t);
  auto back = readCheckpointFile(dir + "/x.ckpt");
  ASSERT_EQ(back.size(), 3u);
  for (auto& [k, v] : t) EXPECT_TRUE(torch::equal(back.at(k), v)) << k;
  // No temporary file is left behind.
  int files = 0;
  for (auto& e : fs::directory_iterator(dir)) files += e.is_regular_file();
  EXPECT_EQ(files, 1);
  fs::remove_all(dir);
}

TEST(Checkpoint, CorruptionAndTruncationAreDetected) {
  const auto dir = test::tempDir("edit-ckpt");
  const std::string p = dir + "/x.ckpt";
  writeCheckpointFile(p, {{"w", torch::randn({100})}});
  {
    std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(60);
    char c;
    f.read(&c, 1);
    f.seekp(60);
    c ^= 0x40;
    f.write(&c, 1);
  }
  EXPECT_THROW(
      {
        try {
          readCheckpointFile(p);
        } catch (const CheckpointError& e) {
          EXPECT_NE(std::string(e.what()).find("checksum"), std::string::npos);
          throw;
        }
      },
      CheckpointError);
  writeCheckpointFile(p, {{"w", torch::randn({100})}});
  fs::resize_file(p, fs::file_size(p) - 10);
  EXPECT_THROW(readCheckpointFile(p), CheckpointError);
  std::ofstream(dir + "/junk.ckpt") << "hello";
  EXPECT_THROW(readCheckpointFile(dir + "/junk.ckpt"), CheckpointError);
  EXPECT_THROW(readCheckpointFile(dir + "/missing.ckpt"), CheckpointError);
  fs::remove_all(dir);
}

TEST(Checkpoint, ManifestMarksCompletionAndPruneKeepsNewest) {
  const auto root = test::tempDir("edit-ckpt");
  for (int64_t s : {10, 20, 30}) {
    const auto d = stepDirName(root, s);
    fs::create_directories(d);
    Manifest m;
    m.step = s;
    m.world = 2;
    m.crcs = {writeCheckpointFile(rankFileName(d, 0), {{"x", torch::ones({1})}}),
              writeCheckpointFile(rankFileName(d, 1), {{"x", torch::ones({1})}})};
    m.configYaml = "model:\n  dim: 8\n";
    writeManifest(d, m);
  }
  fs::create_directories(stepDirName(root, 40));  // incomplete: no manifest
  EXPECT_EQ(completeCheckpointSteps(root), (std::vector<int64_t>{30, 20, 10}));
  auto m = readManifest(stepDirName(root, 20));
  EXPECT_EQ(m.world, 2);
  EXPECT_EQ(m.crcs.size(), 2u);
  EXPECT_EQ(m.configYaml, "model:\n  dim: 8\n");
  pruneCheckpoints(root, 2);
  EXPECT_EQ(completeCheckpointSteps(root), (std::vector<int64_t>{30, 20}));
  EXPECT_TRUE(fs::exists(stepDirName(root, 40)));  // newer than the newest complete: kept
  EXPECT_THROW(readManifest(stepDirName(root, 40)), CheckpointError);
  fs::remove_all(root);
}
