// Corpus replay of the checkpoint readers (LibTorch): rank files and MANIFESTs, plus the
// bad-input contract: truncated, corrupt or foreign files are refused with a
// CheckpointError that names the file and says what is wrong.
#include <unistd.h>

#include "replay_common.h"
#include "target_checkpoint.h"

using namespace edit::fuzz;
using namespace edit::fuzz::replay;

namespace {
std::string readError(const std::string& path) {
  try {
    edit::readCheckpointFile(path);
  } catch (const edit::CheckpointError& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(Checkpoint, CorpusNeverCrashes) {
  EXPECT_GE(replayAll(filesIn(corpusDir("checkpoint")), fuzzCheckpointOne), 10u);
}

TEST(Checkpoint, SeedsReadOrRefusedClearly) {
  const struct {
    const char* file;
    const char* says;  // nullptr: reads
  } cases[] = {
      {"ok_three_tensors.ckpt", nullptr},
      {"ok_no_tensors.ckpt", nullptr},
      {"ok_rank8.ckpt", nullptr},
      {"bad_truncated.ckpt", "truncated"},  // read front to back: the end is missing
      {"bad_checksum.ckpt", "checksum mismatch"},
      {"bad_magic.ckpt", "not an EDiT checkpoint"},
      {"bad_tiny.ckpt", "not an EDiT checkpoint"},
      {"bad_dtype.ckpt", "unsupported tensor type"},
      {"bad_rank9.ckpt", "bad tensor rank"},
      {"bad_negative_size.ckpt", "bad tensor size"},
      {"bad_nbytes_mismatch.ckpt", "size mismatch"},
      {"bad_count_too_high.ckpt", "truncated"},
      {"bad_name_past_end.ckpt", "truncated"},
      {"bad_data_short.ckpt", "truncated"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.file);
    const std::string path = corpusDir("checkpoint") + "/" + c.file;
    const std::string err = readError(path);
    if (!c.says) {
      EXPECT_EQ(err, "");
      continue;
    }
    EXPECT_NE(err.find(c.says), std::string::npos) << err;
    EXPECT_EQ(err.rfind(path, 0), 0u) << "the message starts with the file: " << err;
  }
  auto t = edit::readCheckpointFile(corpusDir("checkpoint") + "/ok_three_tensors.ckpt");
  ASSERT_EQ(t.size(), 3u);
  EXPECT_TRUE(torch::equal(t["inner.w"], torch::arange(6, torch::kFloat32).mul(0.5).reshape({2, 3})));
  EXPECT_EQ(t["step"].item<int64_t>(), 0);
}

TEST(Checkpoint, EveryTruncationOfAValidFileIsRefused) {
  const std::string good = readAll(corpusDir("checkpoint") + "/ok_three_tensors.ckpt");
  const std::string path = scratchDir() + "/cut.ckpt";
  for (size_t n = 0; n < good.size(); ++n) {
    writeFile(path, reinterpret_cast<const uint8_t*>(good.data()), n);
    EXPECT_THROW(edit::readCheckpointFile(path), edit::CheckpointError) << n << " bytes";
  }
  // Every single flipped bit is caught by the checksum.
  for (size_t i = 0; i < good.size(); i += 7) {
    std::string bad = good;
    bad[i] ^= 0x10;
    writeFile(path, reinterpret_cast<const uint8_t*>(bad.data()), bad.size());
    EXPECT_THROW(edit::readCheckpointFile(path), edit::CheckpointError) << "bit flip at " << i;
  }
}

TEST(Manifest, CorpusNeverCrashes) {
  EXPECT_GE(replayAll(filesIn(corpusDir("manifest")), fuzzManifestOne), 5u);
}

TEST(Manifest, SeedsReadOrRefused) {
  for (const auto& f : filesIn(corpusDir("manifest"))) {
    const std::string name = f.filename().string();
    SCOPED_TRACE(name);
    const std::string dir = scratchDir() + "/m-" + name;
    std::filesystem::create_directories(dir);
    const std::string bytes = readAll(f);
    writeFile(dir + "/MANIFEST", reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    if (name.rfind("ok_", 0) == 0) {
      EXPECT_NO_THROW(edit::readManifest(dir));
    } else if (name.rfind("bad_", 0) == 0) {
      EXPECT_THROW(edit::readManifest(dir), edit::CheckpointError);
    }
  }
  EXPECT_THROW(edit::readManifest(scratchDir() + "/no-such-step"), edit::CheckpointError);
  auto m = edit::readManifest([] {
    const std::string dir = scratchDir() + "/m-ok";
    std::filesystem::create_directories(dir);
    const std::string b = readAll(corpusDir("manifest") + "/ok_two_ranks");
    writeFile(dir + "/MANIFEST", reinterpret_cast<const uint8_t*>(b.data()), b.size());
    return dir;
  }());
  EXPECT_EQ(m.step, 120);
  EXPECT_EQ(m.world, 2);
  EXPECT_EQ(m.crcs, (std::vector<uint32_t>{12345u, 4294967295u}));
  EXPECT_EQ(m.configYaml, "model:\n  dim: 8\n");
}

// Regression tests: reproducers of bugs the fuzzers found (README.md, "Bugs found"), now fixed.
TEST(FixedBugs, CheckpointDeclaringHugeTensor) {
  const auto files = filesIn(std::string(EDIT_FUZZ_KNOWN) + "/checkpoint");
  ASSERT_FALSE(files.empty());
  replayAll(files, fuzzCheckpointOne);
}
