// planReconcile: the order the planner's policies run in (controller/plan_context.h), and
// the state they share.
#include <algorithm>

#include "api/spec_table.h"
#include "controller/desired.h"
#include "controller/plan_context.h"
#include "util/log.h"

namespace edit::op::controller {

std::map<int, std::set<std::string>> avoidNodesByRank(const api::EDiTJobStatus& status) {
  std::map<int, std::set<std::string>> out;
  for (const auto& a : status.avoidNodes) out[a.rank].insert(a.node);
  return out;
}

PlanContext::PlanContext(const PlanInput& input)
    : in(input), before(api::EDiTJobStatus::fromJson(input.status)), st(before), now(log::rfc3339(input.now)),
      gen(input.meta.generation) {}

BackoffBudget PlanContext::budget() const {
  BackoffBudget b;
  b.gangRestarts = st.restarts.value_or(0);
  b.inPlaceRecoveries = st.replicaRecoveries.value_or(0);
  b.disruptions = st.disruptions.value_or(0);
  b.limit = spec ? spec->runPolicy.backoffLimit : 0;
  return b;
}

std::vector<const ObservedPod*> PlanContext::current() const {
  std::vector<const ObservedPod*> out;
  for (const auto& p : in.pods)
    if (p.generation == restartGeneration() && (!spec || p.rank < spec->worldSize())) out.push_back(&p);
  return out;
}

void PlanContext::adoptReplicas(int replicas) {
  running.replicas = replicas;
  st.replicas = replicas;
  plan.replicas = replicas;
}

Plan PlanContext::done() {
  countWorkers(*this);
  if (spec) plan.replicas = running.replicas;
  plan.status = st;
  return plan;
}

Plan planReconcile(const PlanInput& in) {
  PlanContext c(in);
  c.st.observedGeneration = c.gen;
  c.st.restarts = c.st.restarts.value_or(0);  // 0 shows in kubectl get ej -o wide (RESTARTS), not blank
  if (!in.spec) return invalidSpec(c);
  // The world the workers run: status.replicas once a gang started (a change of
  // spec.replicas is a scale, plan_scaling.cpp), else spec.replicas.
  c.running = *in.spec;
  if (const auto trained = c.st.replicas;
      trained && *trained >= 1 && *trained * c.running.shardsPerReplica <= api::kMaxWorldSize)
    c.running.replicas = *trained;
  c.spec = &c.running;
  c.adoptReplicas(c.running.replicas);
  c.st.selector = podSelector(in.meta.name);
  countWorkers(c);
  if (api::isFinished(c.phase())) return finished(c);
  if (c.spec->runPolicy.suspend) return suspended(c);
  resumeIfSuspended(c);
  if (!oldGangLeft(c) || deadlineExceeded(c)) return c.done();
  noteDisruptions(c);
  if (handleFailures(c)) return c.done();
  planScaling(c);
  if (succeeded(c)) return c.done();
  createMissing(c);
  updateRunning(c);
  if (watchPodsStarting(c)) return c.done();
  mergeTelemetry(c);
  planLink(c);
  return c.done();
}

}  // namespace edit::op::controller
