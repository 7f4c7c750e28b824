// The -DEDIT_MINIMAL=ON telemetry (runtime/src/telemetry/telemetry_off.cpp), built here beside the
// real one: asking for /metrics or for telemetry fails at startup and names the setting
// and the build option; edit-train turns that into exit 2 with the message.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "telemetry/telemetry.h"

namespace {

template <typename F>
std::string errorOf(F f) {
  try {
    f();
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(TelemetryOff, MetricsPortIsAStartupErrorNamingTheOption) {
  const auto msg = errorOf([] { edit::WorkerMetrics m("127.0.0.1", 0, "job", 0, 0, 0); });
  EXPECT_NE(msg.find("metrics.port"), std::string::npos) << msg;
  EXPECT_NE(msg.find("EDIT_MINIMAL"), std::string::npos) << msg;
}

TEST(TelemetryOff, TelemetryAddrIsAStartupErrorNamingTheOption) {
  const auto msg = errorOf([] {
    edit::TelemetryClient c("127.0.0.1:1", "token", edit::TelemetryIdentity{"ns", "job", "pod", "", "", 0});
  });
  EXPECT_NE(msg.find("telemetry.addr"), std::string::npos) << msg;
  EXPECT_NE(msg.find("EDIT_MINIMAL"), std::string::npos) << msg;
}

TEST(TelemetryOff, EveryMethodEditTrainCallsIsDefined) {
  // Never called in such a build (the constructor throws), but edit-train links them.
  EXPECT_NE(&edit::TelemetryClient::takeCommand, nullptr);
  EXPECT_NE(&edit::TelemetryClient::takeScaleTarget, nullptr);
}
