#include "dist/rendezvous.h"

#include <unistd.h>

#include <chrono>
#include <iostream>
#include <random>
#include <thread>

#include "dist/job_store.h"

namespace edit {
namespace {

// How long rank 0's replacement waits for a survivor to name the size of the generation it
// opened on its fresh store (waitForOpenGeneration).
constexpr double kNameSizeGraceSeconds = 30;

std::string text(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }
std::vector<uint8_t> bytes(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }

int64_t parse(const std::vector<uint8_t>& v) {
  try {
    return std::stoll(text(v));
  } catch (const std::exception&) {
    throw PeerLost("rendezvous: the store holds a malformed generation \"" + text(v) + "\"");
  }
}

}  // namespace

Rendezvous::Rendezvous(const MeshSpec& spec) : spec_(spec), store_(connectStore(spec)), member_(!spec.join) {
  if (spec.rank != 0) return;
  // Which store this is: a survivor that reconnects after rank 0 left tells the store it
  // formed its generation on (still up while the old rank 0 exits) from its replacement's.
  // (Containers' pids repeat: a random number makes it unique.)
  incarnation_ = std::to_string(::getpid()) + "-" + std::to_string(std::random_device{}());
  store_->set(key("incarnation"), bytes(incarnation_));
  if (!spec.join) {
    store_->set(key("generation"), bytes("0"));
    store_->set(key("0/formed"), bytes("1"));
  } else {
    // The store died with the old rank 0; this one is fresh. Generation 1 is open: the
    // survivors reconnect to it (same address) and meet here. They name its size: this
    // replacement's environment may predate a scale (see waitForOpenGeneration).
    store_->set(key("generation"), bytes("1"));
  }
}

void Rendezvous::formed(bool keepConnection) {
  // The generation formed, so rank 0 has written the incarnation of its store.
  incarnation_ = text(store_->get(key("incarnation")));
  if (!keepConnection) static_cast<JobStore*>(store_.get())->close();
}

bool Rendezvous::closed() const { return static_cast<JobStore*>(store_.get())->closed(); }

c10::intrusive_ptr<c10d::Store> Rendezvous::openClient(double timeoutSeconds) const {
  MeshSpec client = spec_;
  client.join = true;  // never host: only rank 0's replacement does
  client.rank = std::max(1, spec_.rank);
  client.timeoutSeconds = timeoutSeconds;
  auto store = connectStore(client);
  store->setTimeout(std::chrono::milliseconds(static_cast<int64_t>(spec_.timeoutSeconds * 1000)));
  return store;
}

std::string Rendezvous::prefix() const {
  return spec_.storePrefix + "g" + std::to_string(generation_) + "/";
}

void Rendezvous::checkCancel(const std::atomic<bool>& cancel) {
  if (cancel) throw PeerLost("rendezvous: stopped by SIGTERM while waiting for peers");
}

void Rendezvous::arrive(int64_t gen, double deadline, const std::atomic<bool>& cancel) {
  const std::string g = std::to_string(gen);
  forming_ = gen;
  if (store_->add(key(g + "/arrived"), 1) == spec_.world) store_->set(key(g + "/formed"), bytes("1"));
  // Poll rather than Store::wait: the survivors' wait must end at the recovery deadline,
  // not at the (unrelated) collective timeout the store was opened with.
  while (!store_->check({key(g + "/formed")})) {
    checkCancel(cancel);
    if (callOff_ && *callOff_) store_->set(key(g + "/calledOff"), bytes("1"));
    if (store_->check({key(g + "/calledOff")}))
      throw PeerLost("rendezvous: generation " + g + " was called off (the scale it was for was given up)");
    if (nowSeconds() > deadline)
      throw PeerLost("rendezvous: generation " + g + " did not form within runtime.rendezvousTimeoutSeconds (" +
                     std::to_string(static_cast<int64_t>(store_->add(key(g + "/arrived"), 0))) + " of " +
                     std::to_string(spec_.world) + " ranks arrived)");
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  generation_ = gen;
  member_ = true;
}

void Rendezvous::rejoin(double timeoutSeconds, const std::atomic<bool>& cancel) {
  const double deadline = nowSeconds() + timeoutSeconds;
  const std::string cur = std::to_string(generation_), next = std::to_string(generation_ + 1);
  // Every store error (rank 0 left before or while we waited, or we reached its store just
  // before it went) means: connect again, until rank 0's replacement hosts a fresh store at
  // the same address (MASTER_ADDR names rank 0's pod, not its IP), and meet there. Only the
  // deadline and SIGTERM end the wait (reconnect and arrive throw PeerLost then).
  for (bool lost = false;; lost = true) {
    if (closed() || lost) reconnect(deadline, cancel);
    try {
      if (sameStore()) {
        // Whoever comes first moves the counter; the rest read the value it moved to. Every
        // survivor names the generation's size (the same value) before it arrives.
        const int64_t gen = parse(store_->compareSet(key("generation"), bytes(cur), bytes(next)));
        store_->set(key(std::to_string(gen) + "/world"), bytes(std::to_string(spec_.world)));
        arrive(gen, deadline, cancel);
      } else {
        // Rank 0's replacement opens generation 1 on its fresh store (compareSet from our
        // counter would open another, where it does not wait).
        waitForOpenGeneration(deadline, cancel);
      }
      return;
    } catch (const PeerLost&) {
      throw;
    } catch (const KvRefused&) {
      throw;  // another job's store, or a wrong secret: waiting cannot help
    } catch (const std::exception&) {
      // The store went after we reached it: connect again.
    }
  }
}

bool Rendezvous::sameStore() const {
  // A fresh store may not hold its incarnation yet: it is not ours either way.
  return !incarnation_.empty() && store_->check({key("incarnation")}) &&
         text(store_->get(key("incarnation"))) == incarnation_;
}

void Rendezvous::reconnect(double deadline, const std::atomic<bool>& cancel) {
  // Short attempts: until the replacement listens (and its name resolves) each one fails,
  // and a long one would make every survivor wait out its end after the store is back.
  std::string last;
  while (nowSeconds() < deadline) {
    checkCancel(cancel);
    try {
      store_ = openClient(1);
      return;
    } catch (const KvRefused&) {
      throw;
    } catch (const std::exception& e) {
      last = e.what();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  throw PeerLost("rendezvous: rank 0's store did not come back within runtime.rendezvousTimeoutSeconds (" +
                 last + ")");
}

void Rendezvous::join(double timeoutSeconds, const std::atomic<bool>& cancel) {
  const double deadline = nowSeconds() + timeoutSeconds;
  if (closed()) reconnect(deadline, cancel);  // a replacement's second attempt
  try {
    waitForOpenGeneration(deadline, cancel);
  } catch (const PeerLost&) {
    throw;
  } catch (const KvRefused&) {
    throw;
  } catch (const std::exception& e) {
    // The caller (Membership::joinRunningJob) goes round again until its deadline.
    throw PeerLost(std::string("rendezvous: the store (hosted by rank 0) is unreachable: ") + e.what());
  }
}

void Rendezvous::waitForOpenGeneration(double deadline, const std::atomic<bool>& cancel) {
  // Rank 0's replacement names its own size when no survivor has named one by then: with
  // every rank replaced at once nobody else would, and the recovery must fail fast (no
  // survivor holds the state) instead of at the deadline.
  const double ownSizeAt = nowSeconds() + std::min(kNameSizeGraceSeconds, std::max(0.0, deadline - nowSeconds()) / 4);
  bool namedOwn = false;
  for (;;) {
    if (store_->check({key("generation")})) {
      const int64_t gen = parse(store_->get(key("generation")));
      // The generation still running (formed) lost us; wait until the survivors notice
      // and open the next one, of our size (a scale's new replica waits past recoveries).
      // A replacement takes the size the survivors opened it with: its environment may
      // predate a scale that ended while it was being created (the operator renders
      // WORLD_SIZE from status.replicas, which moves only once the scale is confirmed).
      const std::string g = std::to_string(gen);
      // Rank 0's replacement opened it without a size: a survivor, which knows the running
      // world, names it (every survivor the same; the first one's stays).
      const bool fallback = !member_ && spec_.rank == 0 && !namedOwn && nowSeconds() >= ownSizeAt;
      if ((member_ || fallback) && !store_->check({key(g + "/formed")}) && !store_->check({key(g + "/world")})) {
        store_->compareSet(key(g + "/world"), {}, bytes(std::to_string(spec_.world)));
        if (fallback) {
          namedOwn = true;
          std::cerr << "rendezvous: no survivor named the size of generation " << g << " within "
                    << static_cast<int>(kNameSizeGraceSeconds) << " s; taking this worker's (" << spec_.world
                    << " ranks)\n";
        }
      }
      if (!store_->check({key(g + "/formed")}) && store_->check({key(g + "/world")})) {
        const auto world = static_cast<int>(parse(store_->get(key(g + "/world"))));
        const bool replacement = !member_ && spec_.join && !spec_.scaleJoin;
        if (world == spec_.world || (replacement && spec_.rank < world && world % spec_.shards == 0)) {
          spec_.world = world;
          arrive(gen, deadline, cancel);
          return;
        }
      }
    }
    checkCancel(cancel);
    if (nowSeconds() > deadline)
      throw PeerLost("rendezvous: no recovery generation opened within runtime.rendezvousTimeoutSeconds "
                     "(did the survivors exit?)");
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

}  // namespace edit
