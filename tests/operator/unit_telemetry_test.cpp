// Telemetry math on synthetic reports: straggler scores, progress, tokens/s, hang; the
// hub's token check and command delivery; metric series lifecycle.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <map>
#include <prometheus/text_serializer.h>

#include "metrics/metrics.h"
#include "telemetry/job_state.h"
#include "telemetry/server.h"

using namespace edit::op;
using namespace edit::op::telemetry;

namespace {

Report rep(int rank, int64_t step, double stepSeconds, uint64_t tokens = 0, double loss = 1.0) {
  Report r;
  r.rank = rank;
  r.replica = rank;
  r.step = step;
  r.totalSteps = 100;
  r.stepSeconds = stepSeconds;
  r.tokens = tokens;
  r.loss = loss;
  return r;
}

// A report on the wire from rank `rank` of job ns/j (pod j-worker-<rank>, token "t").
edit::v1alpha1::WorkerReport wireReport(int rank) {
  edit::v1alpha1::WorkerReport r;
  r.set_namespace_("ns");
  r.set_job("j");
  r.set_token("t");
  r.set_rank(rank);
  r.set_pod("j-worker-" + std::to_string(rank));
  return r;
}

std::string scrape(metrics::Metrics& m) {
  return m.scrape();  // as /metrics: the hub publishes its job-wide series first
}

}  // namespace

TEST(Straggler, OnlyTheSlowRankIsOverThreshold) {
  JobTelemetry t({1.5, 10, 5});
  for (int step = 1; step <= 12; ++step)
    for (int rank = 0; rank < 4; ++rank) t.add(rep(rank, step, rank == 2 ? 0.30 : 0.10 + 0.001 * rank), step);
  auto scores = t.scores();
  ASSERT_EQ(scores.size(), 4u);
  for (const auto& s : scores) {
    EXPECT_TRUE(s.scored);
    if (s.rank == 2)
      EXPECT_NEAR(s.score, 0.30 / 0.1015, 0.05);
    else
      EXPECT_LT(s.score, 1.1);
  }
  auto slow = t.stragglers();
  ASSERT_EQ(slow.size(), 1u);
  EXPECT_EQ(slow[0].rank, 2);
}

TEST(Straggler, NeedsMinReportsAndUsesTheWindow) {
  JobTelemetry t({1.5, 3, 3});
  for (int rank = 0; rank < 3; ++rank) t.add(rep(rank, 1, rank == 0 ? 1.0 : 0.1), 1);
  EXPECT_TRUE(t.stragglers().empty());  // one report each: not scored yet
  for (int step = 2; step <= 3; ++step)
    for (int rank = 0; rank < 3; ++rank) t.add(rep(rank, step, rank == 0 ? 1.0 : 0.1), step);
  ASSERT_EQ(t.stragglers().size(), 1u);
  // Rank 0 recovers: after windowSteps fast steps it is no longer a straggler.
  for (int step = 4; step <= 6; ++step)
    for (int rank = 0; rank < 3; ++rank) t.add(rep(rank, step, 0.1), step);
  EXPECT_TRUE(t.stragglers().empty());
  EXPECT_DOUBLE_EQ(median({3, 1, 2}), 2);
  EXPECT_DOUBLE_EQ(median({4, 1, 2, 3}), 2.5);
}

TEST(Progress, StepTokensLossRateAndEta) {
  JobTelemetry t({}, 30.0);
  // Two ranks, 1 step/s each, 100 tokens per step per rank; rank 1 one step behind.
  for (int s = 1; s <= 11; ++s) {
    t.add(rep(0, s, 1.0, 100ull * s, 2.0), 1000.0 + s);
    t.add(rep(1, s - 1, 1.0, 100ull * (s - 1), 4.0), 1000.0 + s);
  }
  Progress p = t.progress();
  EXPECT_EQ(p.step, 10);          // min over ranks
  EXPECT_EQ(p.tokens, 1100u + 1000u);
  EXPECT_DOUBLE_EQ(p.loss, 3.0);  // mean of the last losses
  // Window: first sample t=1001 (rank 0 only: 100 tokens, step 1), last t=1011 (2100, 10).
  EXPECT_NEAR(p.tokensPerSecond, 200.0, 1e-6);
  EXPECT_NEAR(p.etaSeconds, 90.0 / 0.9, 1e-6);  // 90 steps left at 0.9 steps/s
  EXPECT_EQ(p.ranksReporting, 2);
}

TEST(Progress, RateUsesOnlyTheSlidingWindow) {
  JobTelemetry t({}, 5.0);
  t.add(rep(0, 1, 1, 0), 0);
  t.add(rep(0, 2, 1, 1000), 1);    // a fast burst long ago
  for (int s = 3; s <= 40; ++s) t.add(rep(0, s, 1, 1000 + 10ull * (s - 2)), s - 1);
  EXPECT_NEAR(t.progress().tokensPerSecond, 10.0, 1e-6);
}

// add() keeps the job's tokens (sum) and step (min) as running totals instead of a pass
// over every rank per report. Checked against sums over the test's own copy of each rank's
// last report, through the rate and the ETA, over random reports (steps that go back, as
// after a restart), ranks that leave, and resets.
TEST(Progress, RunningTotalsFollowEveryRanksLastReport) {
  std::srand(7);
  JobTelemetry t({1.5, 20, 5}, 1e9);  // a window longer than the test: the first sample stays
  std::map<int, Report> last;
  double now = 0, firstTime = 0;
  uint64_t firstTokens = 0;
  int64_t firstStep = 0;
  bool haveFirst = false;
  for (int i = 0; i < 3000; ++i) {
    const int op = std::rand() % 100;
    const int rank = std::rand() % 12;
    if (op < 3) {
      t.reset();
      last.clear();
      haveFirst = false;
      continue;
    }
    if (op < 8) {
      t.removeRank(rank);
      last.erase(rank);
      continue;
    }
    now += 0.5;
    Report r = rep(rank, std::rand() % 1000, 0.1, static_cast<uint64_t>(std::rand() % 100000));
    r.totalSteps = 5000;
    t.add(r, now);
    last[rank] = r;
    uint64_t tokens = 0;
    int64_t step = INT64_MAX;
    for (const auto& [k, v] : last) {
      tokens += v.tokens;
      step = std::min(step, v.step);
    }
    if (!haveFirst) {
      haveFirst = true;
      firstTime = now;
      firstTokens = tokens;
      firstStep = step;
      continue;
    }
    const Progress p = t.progress();
    ASSERT_EQ(p.tokens, tokens) << "at op " << i;
    ASSERT_EQ(p.step, step) << "at op " << i;
    const double dt = now - firstTime;
    ASSERT_DOUBLE_EQ(p.tokensPerSecond, static_cast<double>(tokens - std::min(firstTokens, tokens)) / dt)
        << "at op " << i;
    const double stepRate = static_cast<double>(step - firstStep) / dt;
    ASSERT_DOUBLE_EQ(p.etaSeconds, stepRate > 0 ? static_cast<double>(5000 - step) / stepRate : -1) << "at op " << i;
  }
}

TEST(Hang, NoProgressForTimeout) {
  JobTelemetry t;
  EXPECT_FALSE(t.hung(1000, 5));  // no reports: unknown, not hung
  t.add(rep(0, 1, 1), 100);
  t.add(rep(0, 1, 1), 104);  // a report without progress does not reset the clock
  EXPECT_FALSE(t.hung(104, 5));
  EXPECT_TRUE(t.hung(106, 5));
  t.add(rep(0, 2, 1), 106);
  EXPECT_FALSE(t.hung(107, 5));
  EXPECT_FALSE(t.hung(1000, 0));  // 0 disables
}

TEST(Hang, AStepAfterARollbackIsProgress) {
  // An in-place recovery: the ranks reached step 190, one hung, the others waited
  // (heartbeats), and after the replacement joined all went back to step 174. Their first
  // step after that (175) is progress although it is below 190; before, the job was
  // declared hung right after recovering and the gang restarted.
  JobTelemetry t;
  t.add(rep(0, 190, 0.2), 100);
  Report hb = rep(0, 190, 0.2);
  hb.heartbeat = true;
  t.add(hb, 108);
  EXPECT_TRUE(t.hung(111, 10));
  t.add(rep(0, 175, 0.2), 111);
  EXPECT_FALSE(t.hung(111.1, 10));
  EXPECT_FALSE(t.hung(120, 10));
  EXPECT_TRUE(t.hung(121.5, 10));
}

TEST(Hang, HeartbeatsShowLifeButNeitherProgressNorStepTimes) {
  JobTelemetry t({1.5, 5, 1});
  t.add(rep(0, 4, 0.1), 100);
  t.add(rep(1, 4, 0.1), 100);
  for (double now = 102; now <= 110; now += 2) {
    Report hb = rep(0, 4, 0.1);
    hb.heartbeat = true;
    t.add(hb, now);  // rank 0 waits in a collective; rank 1 is silent
  }
  EXPECT_TRUE(t.hung(110, 5));  // no step advanced
  EXPECT_EQ(t.ranks().at(0).lastSeen, 110);
  EXPECT_EQ(t.ranks().at(1).lastSeen, 100);
  EXPECT_EQ(t.ranks().at(0).stepTimes.size(), 1u);  // heartbeats add no step time
}

TEST(Token, ConstantTimeCompare) {
  EXPECT_TRUE(constantTimeEquals("abc123", "abc123"));
  EXPECT_FALSE(constantTimeEquals("abc123", "abc124"));
  EXPECT_FALSE(constantTimeEquals("abc123", "abc12"));
  EXPECT_FALSE(constantTimeEquals("", ""));  // an empty token never authenticates
}

TEST(Hub, JobSeriesAreSetWhenScrapedAndNotAfterTheHubIsGone) {
  metrics::Metrics m;
  {
    TelemetryHub hub(&m);
    hub.registerJob("ns", "j", "t", {1.5, 5, 2}, 0);
    edit::v1alpha1::WorkerReport r = wireReport(0);
    r.set_step(7);
    r.set_step_seconds(0.1);
    std::vector<edit::v1alpha1::Command> cmds;
    ASSERT_TRUE(hub.accept(r, &cmds).ok());
    // The job's series are computed by the scrape (TelemetryHub::publishJobMetrics).
    EXPECT_NE(scrape(m).find("edit_job_step{job=\"j\",namespace=\"ns\"} 7"), std::string::npos) << scrape(m);
  }
  // The hub removed its hook: a scrape after it is gone reads what is there (under ASan a
  // dangling hook would be a use after free).
  EXPECT_NE(scrape(m).find("edit_job_step{job=\"j\",namespace=\"ns\"} 7"), std::string::npos);
}

TEST(Hub, RejectsUnknownJobAndWrongToken) {
  metrics::Metrics m;
  TelemetryHub hub(&m);
  edit::v1alpha1::WorkerReport r;
  r.set_namespace_("ns");
  r.set_job("j");
  r.set_token("secret");
  std::vector<edit::v1alpha1::Command> cmds;
  EXPECT_EQ(hub.accept(r, &cmds).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  hub.registerJob("ns", "j", "other", {}, 0);
  EXPECT_EQ(hub.accept(r, &cmds).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  hub.registerJob("ns", "j", "secret", {}, 0);
  EXPECT_TRUE(hub.accept(r, &cmds).ok());
}

TEST(Hub, DeliversCommandsAndFeedsMetrics) {
  metrics::Metrics m;
  TelemetryHub hub(&m);
  hub.registerJob("ns", "j", "t", {1.5, 5, 2}, 0);
  hub.sendCommand("ns", "j", 1, edit::v1alpha1::Command::CHECKPOINT, "test");
  hub.sendCommand("ns", "j", -1, edit::v1alpha1::Command::STOP, "all");
  for (int step = 1; step <= 3; ++step)
    for (int rank = 0; rank < 3; ++rank) {
      edit::v1alpha1::WorkerReport r = wireReport(rank);
      r.set_node("n");
      r.set_step(step);
      r.set_step_seconds(rank == 1 ? 0.5 : 0.1);
      auto* c = r.add_comm();
      c->set_op("allreduce");
      c->set_group("sync");
      c->set_bytes(1000ull * step);
      std::vector<edit::v1alpha1::Command> cmds;
      ASSERT_TRUE(hub.accept(r, &cmds).ok());
      if (step == 1 && rank == 1) {
        ASSERT_EQ(cmds.size(), 2u);
        EXPECT_EQ(cmds[0].kind(), edit::v1alpha1::Command::CHECKPOINT);
      } else if (step == 1) {
        ASSERT_EQ(cmds.size(), 1u);
        EXPECT_EQ(cmds[0].kind(), edit::v1alpha1::Command::STOP);
      } else {
        EXPECT_TRUE(cmds.empty());
      }
    }
  auto snap = hub.snapshot("ns", "j");
  ASSERT_TRUE(snap);
  ASSERT_EQ(snap->stragglers.size(), 1u);
  EXPECT_EQ(snap->stragglers[0].rank, 1);
  std::string text = scrape(m);
  const std::string slowSeries =
      "edit_worker_straggler_score{job=\"j\",namespace=\"ns\",node=\"n\",pod=\"j-worker-1\",rank=\"1\",replica=\"0\",shard=\"0\"} ";
  auto at = text.find(slowSeries);
  ASSERT_NE(at, std::string::npos) << text;
  EXPECT_NEAR(std::stod(text.substr(at + slowSeries.size())), 5.0, 1e-6);
  EXPECT_NE(text.find("edit_worker_comm_bytes_total{group=\"sync\",job=\"j\",namespace=\"ns\",node=\"n\",op=\"allreduce\",pod=\"j-worker-0\",rank=\"0\",replica=\"0\",shard=\"0\"} 3000"), std::string::npos) << text;
  EXPECT_NE(text.find("edit_job_stragglers{job=\"j\",namespace=\"ns\"} 1"), std::string::npos);

  hub.forgetJob("ns", "j");
  text = scrape(m);
  EXPECT_EQ(text.find("job=\"j\""), std::string::npos) << text;
}

// After a gang restart the hub counts only the new gang's reports; each rank's newest
// report says which pod sent it (how the controller sees that a replacement rejoined).
TEST(Hub, CountsOnlyTheCurrentGenerationAndKeepsThePodUid) {
  TelemetryHub hub(nullptr);
  hub.registerJob("ns", "j", "t", {}, 0);
  auto report = [&](int gen, int64_t step, const std::string& uid) {
    edit::v1alpha1::WorkerReport r;
    r.set_namespace_("ns");
    r.set_job("j");
    r.set_token("t");
    r.set_rank(1);
    r.set_step(step);
    r.set_pod_uid(uid);
    r.set_restart_generation(gen);
    std::vector<edit::v1alpha1::Command> cmds;
    return hub.accept(r, &cmds);
  };
  ASSERT_TRUE(report(0, 30, "uid-a").ok());
  hub.resetJob("ns", "j", 1);
  ASSERT_TRUE(report(0, 31, "uid-a").ok());  // a leftover of the old gang: ignored, not an error
  auto snap = hub.snapshot("ns", "j");
  ASSERT_TRUE(snap);
  EXPECT_FALSE(snap->hasReports);
  ASSERT_TRUE(report(1, 5, "uid-b").ok());
  snap = hub.snapshot("ns", "j");
  ASSERT_TRUE(snap->hasReports);
  EXPECT_EQ(snap->progress.step, 5);
  ASSERT_EQ(snap->ranks.count(1), 1u);
  EXPECT_EQ(snap->ranks.at(1).podUid, "uid-b");
  EXPECT_EQ(snap->ranks.at(1).step, 5);
  EXPECT_EQ(report(1, 6, std::string(200, 'u')).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

// Scaling: a SCALE carries an absolute target and only the newest is sent; each rank's
// newest report says its world's size; a rank that left at a scale-down is forgotten, and
// a last report its pod sends on the way out does not bring it back.
TEST(Hub, ScaleCommandsAndRanksThatLeft) {
  metrics::Metrics m;
  TelemetryHub hub(&m);
  hub.registerJob("ns", "j", "t", {}, 0);
  auto report = [&](int rank, int64_t step, int replicas, std::vector<edit::v1alpha1::Command>* cmds) {
    edit::v1alpha1::WorkerReport r = wireReport(rank);
    r.set_pod_uid("uid-" + std::to_string(rank));
    r.set_step(step);
    r.set_replicas(replicas);
    return hub.accept(r, cmds);
  };
  hub.sendScale("ns", "j", 0, 4, "first");
  hub.sendScale("ns", "j", 0, 3, "second");
  std::vector<edit::v1alpha1::Command> cmds;
  ASSERT_TRUE(report(0, 10, 3, &cmds).ok());
  ASSERT_EQ(cmds.size(), 1u);
  EXPECT_EQ(cmds[0].kind(), edit::v1alpha1::Command::SCALE);
  EXPECT_EQ(cmds[0].replicas(), 3);
  cmds.clear();
  ASSERT_TRUE(report(2, 10, 3, &cmds).ok());
  EXPECT_TRUE(cmds.empty());  // sent to rank 0 only
  auto snap = hub.snapshot("ns", "j");
  EXPECT_EQ(snap->ranks.at(0).replicas, 3);
  EXPECT_NE(scrape(m).find("rank=\"2\""), std::string::npos);

  hub.removeRank("ns", "j", 2);
  ASSERT_TRUE(report(2, 11, 3, &cmds).ok());  // its last report, after it left
  snap = hub.snapshot("ns", "j");
  EXPECT_EQ(snap->ranks.count(2), 0u);
  EXPECT_EQ(snap->progress.ranksReporting, 1);
  EXPECT_EQ(scrape(m).find("rank=\"2\""), std::string::npos) << scrape(m);
  edit::v1alpha1::WorkerReport bad = wireReport(0);
  bad.set_replicas(5000);
  EXPECT_EQ(hub.accept(bad, &cmds).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

// The local phase a worker reports reaches the planner's view (condition LinkBound); a
// negative, NaN or out-of-range one is refused with the field named.
TEST(Hub, LocalPhaseReachesTheSnapshotAndIsChecked) {
  TelemetryHub hub(nullptr);
  hub.registerJob("ns", "j", "t", {}, 0);
  edit::v1alpha1::WorkerReport r = wireReport(1);
  r.set_step(40);
  auto* local = r.mutable_local_phase();
  local->set_steps(32);
  local->set_compute_seconds(3.2);
  local->set_blocked_seconds(1.5);
  local->set_rounds(2);
  std::vector<edit::v1alpha1::Command> cmds;
  ASSERT_TRUE(hub.accept(r, &cmds).ok());
  const auto snap = hub.snapshot("ns", "j");
  ASSERT_TRUE(snap);
  const auto& got = snap->ranks.at(1).local;
  EXPECT_EQ(got.localSteps, 32);
  EXPECT_DOUBLE_EQ(got.computeSeconds, 3.2);
  EXPECT_DOUBLE_EQ(got.blockedSeconds, 1.5);
  EXPECT_EQ(got.rounds, 2);

  for (int k = 0; k < 3; ++k) {
    edit::v1alpha1::WorkerReport bad = r;
    if (k == 0) bad.mutable_local_phase()->set_blocked_seconds(-1);
    if (k == 1) bad.mutable_local_phase()->set_compute_seconds(std::nan(""));
    if (k == 2) bad.mutable_local_phase()->set_steps(-5);
    const grpc::Status st = hub.accept(bad, &cmds);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << k;
    EXPECT_NE(st.error_message().find(k == 2 ? "local_phase" : "timings"), std::string::npos) << st.error_message();
  }
}

// Only the leader takes reports: a replica that does not lead tells workers to retry.
TEST(Hub, NotServingAnswersUnavailable) {
  TelemetryHub hub(nullptr);
  hub.registerJob("ns", "j", "t", {}, 0);
  edit::v1alpha1::WorkerReport r;
  r.set_namespace_("ns");
  r.set_job("j");
  r.set_token("t");
  std::vector<edit::v1alpha1::Command> cmds;
  hub.setServing(false);
  EXPECT_EQ(hub.accept(r, &cmds).error_code(), grpc::StatusCode::UNAVAILABLE);
  hub.setServing(true);
  EXPECT_TRUE(hub.accept(r, &cmds).ok());
}

// The reports carry the cumulative seconds blocked in collectives; the operator exports
// a counter that grows by each increase and survives a restarted worker's fresh count.
TEST(Metrics, CommWaitIsACounterOfTheReportedIncreases) {
  metrics::Metrics m;
  metrics::WorkerSample w;
  w.ns = "ns";
  w.job = "j";
  w.pod = "j-worker-0";
  w.node = "n";
  for (double cumulative : {1.5, 4.0, 4.0, 0.5, 2.0}) {  // 4.0 twice: a heartbeat; then a restart
    w.commWaitSeconds = cumulative;
    m.setWorker(w);
  }
  const std::string text = scrape(m);
  const std::string series =
      "edit_worker_comm_wait_seconds_total{job=\"j\",namespace=\"ns\",node=\"n\",pod=\"j-worker-0\",rank=\"0\",replica=\"0\",shard=\"0\"} ";
  auto at = text.find(series);
  ASSERT_NE(at, std::string::npos) << text;
  EXPECT_DOUBLE_EQ(std::stod(text.substr(at + series.size())), 4.0 + 2.0);
  EXPECT_NE(text.find("# TYPE edit_worker_comm_wait_seconds_total counter"), std::string::npos) << text;
}

TEST(Metrics, PhaseIsOneHotAndOperatorSeriesExist) {
  metrics::Metrics m;
  m.setJobPhase("ns", "j", edit::op::api::Phase::Running);
  m.setJobRestarts("ns", "j", 2);
  m.setJobRestarts("ns", "j", 2);
  m.reconcileDone("success", 0.01);
  m.replicaRecovered(12);
  std::string text = scrape(m);
  EXPECT_NE(text.find("edit_operator_replica_recovery_seconds_bucket{le=\"10\"} 0"), std::string::npos) << text;
  EXPECT_NE(text.find("edit_operator_replica_recovery_seconds_bucket{le=\"15\"} 1"), std::string::npos) << text;
  EXPECT_NE(text.find("edit_operator_replica_recovery_seconds_sum 12"), std::string::npos) << text;
  EXPECT_NE(text.find("edit_job_phase{job=\"j\",namespace=\"ns\",phase=\"Running\"} 1"), std::string::npos);
  EXPECT_NE(text.find("edit_job_phase{job=\"j\",namespace=\"ns\",phase=\"Failed\"} 0"), std::string::npos);
  EXPECT_NE(text.find("edit_job_restarts_total{job=\"j\",namespace=\"ns\"} 2"), std::string::npos);
  for (const char* name : {"edit_operator_reconcile_total", "edit_operator_reconcile_seconds_bucket",
                           "edit_operator_jobs_created_total", "edit_operator_jobs_succeeded_total",
                           "edit_operator_jobs_failed_total", "edit_operator_jobs_restarted_total", "edit_operator_leader"})
    EXPECT_NE(text.find(name), std::string::npos) << name;
}

// The job's sync-blocked share has no series until it is measured (a 0 would read as
// "never blocked"), follows status.link, and goes with the job.
TEST(Metrics, SyncBlockedRatioExistsOnlyOnceMeasured) {
  metrics::Metrics m;
  m.setJobPhase("ns", "j", edit::op::api::Phase::Running);
  EXPECT_EQ(scrape(m).find("edit_job_sync_blocked_ratio{"), std::string::npos);
  m.setJobSyncBlocked("ns", "j", 0.375);
  EXPECT_NE(scrape(m).find("edit_job_sync_blocked_ratio{job=\"j\",namespace=\"ns\"} 0.375"), std::string::npos)
      << scrape(m);
  m.removeJob("ns", "j");
  EXPECT_EQ(scrape(m).find("edit_job_sync_blocked_ratio{"), std::string::npos);
}
