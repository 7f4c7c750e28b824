// Corpus replay, the parsers without LibTorch: runtime config (YAML), EDiTJob (JSON),
// token files. Plus the bad-input contract in detail: every malformed seed is refused
// with the documented error type and a message that says what is wrong.
#include <unistd.h>

#include "replay_common.h"
#include "controller/desired.h"
#include "target_config.h"
#include "target_editjob.h"
#include "target_tokenfile.h"

using namespace edit::fuzz;
using namespace edit::fuzz::replay;
namespace fs = std::filesystem;

namespace {

template <typename Error, typename F>
std::string errorOf(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Config, CorpusNeverCrashes) {
  EXPECT_GE(replayAll(filesIn(corpusDir("config")), fuzzConfigOne), 10u);
  // The bad-input corpus (tests/bad_input/configs), when present.
  replayAll(filesIn(std::string(EDIT_SOURCE_ROOT_DIR) + "/tests/bad_input/configs"), fuzzConfigOne);
}

TEST(Config, SeedsAcceptedOrRefusedAsNamed) {
  for (const auto& f : filesIn(corpusDir("config"))) {
    const std::string name = f.filename().string();
    if (f.extension() != ".yaml") continue;
    SCOPED_TRACE(name);
    const std::string err = errorOf<edit::ConfigError>([&] { edit::parseConfig(readAll(f)); });
    if (name.rfind("bad_", 0) == 0)
      EXPECT_FALSE(err.empty()) << "accepted";
    else if (name.rfind("ok_", 0) == 0)
      EXPECT_EQ(err, "");
  }
}

TEST(Config, ErrorsNameTheKeyAndNeverEchoTheToken) {
  EXPECT_NE(errorOf<edit::ConfigError>([] { edit::parseConfig("training:\n  lr: .nan\n"); }).find("training.lr"),
            std::string::npos);
  EXPECT_NE(errorOf<edit::ConfigError>([] { edit::parseConfig("data:\n  seqLen: 1e99\n"); }).find("data.seqLen"),
            std::string::npos);
  const std::string secret(5000, 'S');  // over the 4096-character cap
  const std::string err =
      errorOf<edit::ConfigError>([&] { edit::parseConfig("telemetry:\n  token: " + secret + "\n"); });
  EXPECT_NE(err.find("telemetry.token"), std::string::npos) << err;
  EXPECT_EQ(err.find("SSSS"), std::string::npos) << "the token is echoed: " << err.substr(0, 200);
  // A valid token never leaves through toYaml (what goes into ConfigMaps, manifests, logs).
  auto cfg = edit::parseConfig("telemetry:\n  token: hunter2-secret-token\n");
  EXPECT_EQ(cfg.telemetry.token, "hunter2-secret-token");
  EXPECT_EQ(edit::toYaml(cfg).find("hunter2"), std::string::npos);
  // Nor through an override's error.
  const std::string overrideErr = errorOf<edit::ConfigError>(
      [&] { edit::Config c; edit::applyOverrides(c, {"telemetry.token=" + secret}); });
  EXPECT_FALSE(overrideErr.empty());
  EXPECT_EQ(overrideErr.find("SSSS"), std::string::npos);
}

TEST(EditJob, CorpusNeverCrashes) {
  EXPECT_GE(replayAll(filesIn(corpusDir("editjob")), fuzzEditJobOne), 10u);
}

TEST(EditJob, SeedsAcceptedOrRefusedWithTheFieldNamed) {
  namespace api = edit::op::api;
  for (const auto& f : filesIn(corpusDir("editjob"))) {
    const std::string name = f.filename().string();
    auto obj = nlohmann::json::parse(readAll(f), nullptr, false);
    if (obj.is_discarded() || (name.rfind("bad_", 0) != 0 && name.rfind("ok_", 0) != 0)) continue;
    SCOPED_TRACE(name);
    std::string field;
    try {
      auto spec = api::parseSpec(obj);
      api::validateName(obj["metadata"].value("name", "x"), spec.worldSize());
      // What the reconciler does next: the worker sections through the runtime's parser.
      edit::op::controller::checkWorkerConfig({api::parseMeta(obj), spec});
    } catch (const api::SpecError& e) {
      field = e.field();
    }
    if (name.rfind("ok_", 0) == 0) {
      EXPECT_EQ(field, "");
    } else {
      ASSERT_FALSE(field.empty()) << "accepted";
      EXPECT_TRUE(field.rfind("spec", 0) == 0 || field == "metadata.name") << field;
    }
  }
}

TEST(TokenFile, CorpusNeverCrashes) {
  EXPECT_GE(replayAll(filesIn(corpusDir("tokenfile")), fuzzTokenFileOne), 10u);
}

TEST(TokenFile, MalformedFilesGiveClearErrors) {
  using edit::data::DataError;
  using edit::data::TokenFile;
  const struct {
    const char* file;
    const char* says;
  } cases[] = {
      {"bad_truncated_header.bin", "shorter than the 1024-byte llm.c header"},
      {"bad_truncated_body.bin", "truncated"},
      {"bad_trailing_bytes.bin", "trailing bytes"},
      {"bad_version.bin", "version"},
      {"bad_negative_count.bin", "negative token count"},
      {"bad_unknown_magic.bin", "unknown llm.c magic"},
      {"bad_odd_size.bin", "odd size"},
      {"bad_u32_odd_body.bin", "header says 1 tokens"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.file);
    const std::string path = corpusDir("tokenfile") + "/" + c.file;
    const std::string err = errorOf<DataError>([&] { TokenFile::open(path); });
    EXPECT_NE(err.find(c.says), std::string::npos) << err;
    EXPECT_NE(err.find(path), std::string::npos) << "the message names the file: " << err;
  }
  // Not a regular file, and a missing one.
  EXPECT_NE(errorOf<DataError>([] { TokenFile::open("/"); }).find("not a regular file"), std::string::npos);
  EXPECT_NE(errorOf<DataError>([] { TokenFile::open("/nonexistent/x.bin"); }).find("cannot open"), std::string::npos);
}

// Regression tests: reproducers of bugs the fuzzers found (README.md, "Bugs found"), now fixed.
TEST(FixedBugs, EditJobOutOfRangeNumbers) {
  const auto files = filesIn(std::string(EDIT_FUZZ_KNOWN) + "/editjob");
  ASSERT_FALSE(files.empty());
  replayAll(files, fuzzEditJobOne);
}
