// Restoring the training state in a new generation, without a checkpoint
// (docs/replica-recovery.md).
//
// Every rank of a sync group holds the same outer slice (weights, momentum), so a lost
// rank's outer state survives on its sync-group peers; its anomaly statistics (per
// replica) survive on its shard peers. The survivors and the replacement agree on a sync
// round: the newest any survivor applied any of. Units sync in order and a unit's update
// on one rank is its sync group's, so the ranks behind copy it from the furthest one (roll
// forward) and units nobody reached keep the previous round's state; then everyone
// continues from it: inner weights := outer weights, step := the step of that round. The
// replacement copies the outer state and its inner AdamW moments from one peer of its
// sync group, and the anomaly statistics from its own replica. No copy of the outer state
// is kept in case of a loss.
#include <algorithm>

#include "train/membership.h"
#include "train/recovery_plan.h"
#include "train/step_engine.h"
#include "train/sync_schedule.h"

namespace edit {
namespace {
// The columns of the table the ranks exchange.
enum OfferCol { kJoiner, kCur, kCurStep, kNext, kNextStep, kUnitsDone, kStepNow, kAdam, kCkpt, kScaleNext,
                kTotalSteps, kOfferCols };
}  // namespace

torch::Tensor Membership::offerTable(bool joiner) {
  // What each rank can offer: the outer state after round `cur`, and how many units of the
  // round in progress it has applied on top.
  auto mine = torch::full({kOfferCols}, -1.0, torch::kFloat64);
  auto m = mine.accessor<double, 1>();
  // A survivor whose copy failed half way holds nothing it can name: it takes everything
  // from its sync group like a replacement.
  const bool holdsNothing = joiner || outerLost_;
  m[kJoiner] = holdsNothing ? 1 : 0;
  if (!holdsNothing) {
    const RoundPosition p = schedule_->position();
    m[kCur] = static_cast<double>(p.cur);
    m[kCurStep] = static_cast<double>(p.curStep);
    m[kNext] = static_cast<double>(p.next);
    m[kNextStep] = static_cast<double>(p.nextStep);
    m[kUnitsDone] = static_cast<double>(p.unitsDone);
    m[kStepNow] = static_cast<double>(progress_.step);
    m[kAdam] = static_cast<double>(engine_->adam().stepCount());
    m[kCkpt] = static_cast<double>(progress_.lastCheckpointId);
    // What a new replica cannot know: the scale points already applied, and the job's
    // length (training.tokens gives the steps for the world the job started with).
    m[kScaleNext] = static_cast<double>(nextScale_);
    m[kTotalSteps] = static_cast<double>(progress_.totalSteps);
  }
  Comm& comm = *groups_.comm;
  auto table = torch::empty({comm.world(), kOfferCols}, torch::kFloat64);
  std::vector<torch::Tensor> rows;
  for (int r = 0; r < comm.world(); ++r) rows.push_back(table[r]);
  comm.allgather(Group::World, mine, rows);
  return table;
}

void Membership::copyOuterState(const RecoveryPlan& plan, bool joiner) {
  // Copy from the source replica over the sync group, if this sync group has a joiner or a
  // survivor that got less far into the round. The source's state is the plan's: the
  // round's update for the units it got to, the previous round's for the rest.
  Comm& comm = *groups_.comm;
  const int N = comm.shards(), myShard = comm.shard();
  bool groupReceives = false;
  for (int rep = 0; rep < comm.replicas(); ++rep) groupReceives |= plan.receives[rep * N + myShard];
  if (!groupReceives) return;
  const int root = plan.source[myShard];
  if (!joiner && plan.receives[mesh_.rank]) outerLost_ = true;  // half written until the copy is done
  if (faults_ && faults_->dropThisCopy())
    throw PeerLost("EDIT_TEST_DROP_COPY_RANK: connections dropped during the state copy");
  auto& outer = schedule_->outer();
  auto& adam = engine_->adam();
  for (size_t u = 0; u < outer.size(); ++u) {
    comm.broadcast(Group::Sync, outer[u].outer, root);
    comm.broadcast(Group::Sync, outer[u].momentum, root);
    // The root sends its inner moments; other survivors keep theirs (receive into scratch).
    const bool keep = !joiner && comm.replica() != root;
    auto am = keep ? torch::empty_like(adam.m()[u]) : adam.m()[u];
    auto av = keep ? torch::empty_like(adam.v()[u]) : adam.v()[u];
    comm.broadcast(Group::Sync, am, root);
    comm.broadcast(Group::Sync, av, root);
  }
}

void Membership::copyAnomalyStats(const std::vector<bool>& survivor, const RecoveryPlan& plan) {
  // The anomaly statistics are per replica (they follow its own norms), not per sync
  // group: a replacement takes them from a surviving shard peer of its own replica. A
  // replica that lost every rank takes shard 0's source replica's, the same on all its
  // shards: a prior for a replica that restarts from the outer weights like the others.
  Comm& comm = *groups_.comm;
  auto& detectors = schedule_->detectors();
  const int N = comm.shards(), myShard = comm.shard(), myReplica = comm.replica();
  auto ewma = torch::empty({static_cast<int64_t>(detectors.size()), 3}, torch::kFloat64);
  auto pack = [&] {
    for (size_t u = 0; u < detectors.size(); ++u) {
      ewma[u][0] = detectors[u].mean;
      ewma[u][1] = detectors[u].var;
      ewma[u][2] = static_cast<double>(detectors[u].count);
    }
  };
  auto unpack = [&] {
    for (size_t u = 0; u < detectors.size(); ++u)
      detectors[u] = {ewma[u][0].item<double>(), ewma[u][1].item<double>(),
                      static_cast<int64_t>(ewma[u][2].item<double>())};
  };
  auto firstSurvivingShard = [&](int rep) {
    for (int s = 0; s < N; ++s)
      if (survivor[rep * N + s]) return s;
    return -1;
  };
  bool someReplicaLost = false;
  for (int rep = 0; rep < comm.replicas(); ++rep) someReplicaLost |= firstSurvivingShard(rep) < 0;
  const int peer = firstSurvivingShard(myReplica);
  if (someReplicaLost && myShard == 0) {
    pack();
    comm.broadcast(Group::Sync, ewma, plan.source[0]);
    if (peer < 0) unpack();
  }
  // Every replica, not only one with a replacement: a round stopped part way may have
  // updated a unit's statistics on some of the replica's shards and not on others.
  if (N > 1) {
    const int root = peer < 0 ? 0 : peer;
    pack();
    comm.broadcast(Group::Shard, ewma, root);
    if (myShard != root) unpack();
  }
}

void Membership::continueFromRound(int64_t round, int64_t step, int64_t lastCkpt) {
  // Everyone: inner weights := outer weights of `round`, and the clock of that round.
  schedule_->continueFromRound(round, step);
  progress_.step = step;
  progress_.lastCheckpointId = lastCkpt;
  progress_.controlId = std::max<int64_t>(progress_.controlId, lastCkpt);
  partialTermExchanges_ = 0;  // a new generation: a joiner counts from zero too
  outerLost_ = false;
  // A scale asked before a recovery is dropped: a replacement would not know of it.
  if (pendingReplicas_ > 0 && !scaling_) log_("the scale asked before this recovery is dropped: ask again");
  pendingReplicas_ = 0;
  schedule_->agreeJobSteps(progress_.step);  // the job's progress at the restored round (A-EDiT's learning rate)
}

void Membership::restoreFromPeers(bool joiner) {
  torch::NoGradGuard ng;
  Comm& comm = *groups_.comm;
  const int W = comm.world();
  const torch::Tensor table = offerTable(joiner);
  auto T = table.accessor<double, 2>();
  std::vector<bool> survivor(W);
  std::vector<RecoveryOffer> offers(W);
  for (int r = 0; r < W; ++r) {
    survivor[r] = T[r][kJoiner] == 0;
    auto i = [&](OfferCol c) { return static_cast<int64_t>(T[r][c]); };
    offers[r] = {!survivor[r], i(kCur), i(kCurStep), i(kNext), i(kNextStep), i(kUnitsDone), i(kStepNow)};
  }
  const size_t U = schedule_->detectors().size();
  // The round to continue from, how far into it each shard got, each shard's source
  // replica, who copies (recovery_plan.h).
  const RecoveryPlan plan =
      planRecovery(offers, comm.replicas(), comm.shards(), static_cast<int64_t>(U), schedule_->stepClocked());
  if (!plan.why.empty()) throw RecoveryImpossible("cannot recover in place: " + plan.why + "; restart from a checkpoint");
  const int me = mesh_.rank;
  const int64_t round = plan.round, step = plan.step[me];
  int64_t lastCkpt = -1;
  int joiners = 0;
  for (int r = 0; r < W; ++r) {
    if (survivor[r]) lastCkpt = std::max(lastCkpt, static_cast<int64_t>(T[r][kCkpt]));
    else joiners++;
  }

  if (joiner) schedule_->initOuter();  // allocates the outer state in the right place; filled below
  copyOuterState(plan, joiner);
  copyAnomalyStats(survivor, plan);
  schedule_->agreeSkipStreaks();
  if (joiner) {
    engine_->adam().setStepCount(static_cast<int64_t>(T[plan.stepFrom[me]][kAdam]));
    // A replacement: cumulative tokens as if this rank had trained from the start (what a
    // resume from a checkpoint at `step` holds), so the job's token count does not drop by
    // a rank's share. A new replica of a scale-up counts only what it trains.
    progress_.tokens =
        mesh_.scaleJoin ? 0 : static_cast<uint64_t>(step) * static_cast<uint64_t>(engine_->tokensPerStep());
    progress_.totalSteps = static_cast<int64_t>(T[plan.stepFrom[me]][kTotalSteps]);
  }
  int64_t scaleNext = 0;
  for (int r = 0; r < W; ++r)
    if (survivor[r]) scaleNext = std::max(scaleNext, static_cast<int64_t>(T[r][kScaleNext]));
  nextScale_ = static_cast<size_t>(scaleNext);
  continueFromRound(round, step, lastCkpt);
  schedule_->checkSyncGroupAgrees();
  // Every rank of the generation finished its copy: otherwise a sync group done early
  // would train on and meet the failure in a second recovery instead of this one's retry.
  comm.barrier(Group::World);

  // A round that stopped part way keeps the previous round's state for the units it did
  // not reach, as if it had skipped them (docs/replica-recovery.md).
  std::string partial;
  for (int s = 0; s < comm.shards(); ++s)
    if (plan.unitsApplied[s] < static_cast<int64_t>(U))
      partial += (partial.empty() ? "" : ", ") + std::string("shard ") + std::to_string(s) + " " +
                 std::to_string(plan.unitsApplied[s]) + " of " + std::to_string(U);
  if (!partial.empty())
    log_("sync round " + std::to_string(round) + " stopped part way: its update holds for the first units of each " +
         "shard (" + partial + "); the other units keep round " + std::to_string(round - 1) + "'s outer state");
  if (scaling_ || (joiner && mesh_.scaleJoin))
    log_("scaled to " + std::to_string(comm.replicas()) + " replicas (generation " +
         std::to_string(rendezvous_->generation()) + ", " + std::to_string(joiners) +
         " new rank(s)): continuing from sync round " + std::to_string(round) + " at step " + std::to_string(step) +
         (joiner ? " as a new replica" : ""));
  else
    log_("recovered in place (generation " + std::to_string(rendezvous_->generation()) + ", " +
         std::to_string(joiners) + " rank(s) replaced): continuing from sync round " + std::to_string(round) +
         " at step " + std::to_string(step) + (joiner ? " as a replacement" : ""));
}

}  // namespace edit
