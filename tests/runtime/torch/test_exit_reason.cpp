// edit-train's exit code for each kind of failure (bin/exit_reason.h, common/src/exit_codes.h):
// a LibTorch error outside any collective is no longer taken for a lost peer, a collective
// that timed out is, and a checkpoint that did not fit stops the job for good.
#include <gtest/gtest.h>

#include <cerrno>

#include "bin/exit_reason.h"

using namespace edit;

namespace {
template <typename F>
ExitReason reasonOf(F&& f) {
  try {
    f();
  } catch (...) {
    return exitReasonOf(std::current_exception());
  }
  ADD_FAILURE() << "nothing thrown";
  return {};
}
}  // namespace

TEST(ExitReason, LibTorchErrorOutsideACollectiveIsNotAPeerLost) {
  const auto r = reasonOf([] { torch::ones({2, 3}).matmul(torch::ones({2, 3})); });
  EXPECT_EQ(r.code, kExitTorchError);
  EXPECT_EQ(r.text.rfind("LibTorch error: ", 0), 0u) << r.text;
  EXPECT_EQ(r.text.find("Exception raised from"), std::string::npos) << "no backtrace: " << r.text;
  // Retryable like any failure of the worker itself: edit-run and the operator replace it.
  EXPECT_FALSE(isPermanentExit(r.code));
  EXPECT_TRUE(replaceableExit(r.code));
}

TEST(ExitReason, CollectiveTimeoutIsAPeerLostForAGangRestart) {
  // What Comm::run makes of Gloo's timeout when no in-place recovery is possible.
  const auto r = reasonOf([] {
    throw PeerLost("allreduce on the world group failed: [gloo/transport/tcp/unbound_buffer.cc:81] Timed out "
                   "waiting 10000ms for recv operation to complete");
  });
  EXPECT_EQ(r.code, kExitPeerLost);
  EXPECT_NE(r.text.find("peer lost: allreduce on the world group failed"), std::string::npos) << r.text;
  EXPECT_FALSE(isPermanentExit(r.code));
  EXPECT_FALSE(replaceableExit(r.code));  // a survivor that gave up: the gang restarts
}

TEST(ExitReason, CheckpointThatDidNotFitStopsTheJob) {
  const auto full = reasonOf([] { throw CheckpointNotSaved("checkpoint /ck/step-00000016 was not saved: ENOSPC", true); });
  EXPECT_EQ(full.code, kExitNoSpace);
  EXPECT_TRUE(isPermanentExit(full.code));
  EXPECT_FALSE(replaceableExit(full.code));
  EXPECT_TRUE(full.terminationLog);
  EXPECT_EQ(full.text, "checkpoint /ck/step-00000016 was not saved: ENOSPC");
  // Another write error: the gang restarts from the previous checkpoint.
  const auto eio = reasonOf([] { throw CheckpointNotSaved("checkpoint ... was not saved: EIO", false); });
  EXPECT_EQ(eio.code, kExitPeerLost);
  // A write error that reached the top without the world's agreement stays retryable.
  const auto lone = reasonOf([] { throw CheckpointWriteError("cannot write x: ENOSPC", ENOSPC); });
  EXPECT_EQ(lone.code, kExitFailure);
}

TEST(ExitReason, EachOtherKindKeepsItsCode) {
  EXPECT_EQ(reasonOf([] { throw CheckpointLayoutError("no checkpoint is readable on every rank"); }).code,
            kExitInvalidInput);
  EXPECT_EQ(reasonOf([] { throw TrainingStalled("stalled"); }).code, kExitStalled);
  EXPECT_EQ(reasonOf([] { throw ConfigError("bad key"); }).code, kExitInvalidInput);
  EXPECT_EQ(reasonOf([] { throw data::DataError("short file"); }).code, kExitInvalidInput);
  const auto left = reasonOf([] { throw LeftAlone("SIGTERM"); });
  EXPECT_EQ(left.code, kExitLeft);
  EXPECT_FALSE(left.terminationLog);
  EXPECT_EQ(reasonOf([] { throw std::runtime_error("boom"); }).code, kExitFailure);
}
