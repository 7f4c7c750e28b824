// Recovery generations on the job's store (docs/replica-recovery.md).
//
// Generation 0 is the job as started. When a peer is lost, every survivor moves the
// store's generation counter from g to g+1 (compare-and-set: the first one wins, the
// others see g+1) and waits there; a replacement (EDIT_JOIN=1) waits until the counter
// names a generation that is still forming and joins it. A generation is formed when all
// WORLD_SIZE ranks arrived; then each builds its process groups under the generation's
// prefix. Rank 0 hosts the store: when rank 0 dies, its replacement hosts a fresh store at
// the same address with generation 1 open, and the survivors reconnect to it and name its
// size (a replacement takes the size the survivors give its generation: its environment
// may predate a scale).
//
// Each store names its incarnation: a survivor that reconnects tells rank 0's store (still
// up while rank 0 exits) from its replacement's, and meets the replacement where it waits.
//
// The store is our own (dist/kv_store.h): its client has no background thread, so rank 0
// leaving or dying is an error of the next store call, never an abort. The other ranks
// still close their connection while they train (formed), so rank 0 serves no idle
// connections, and open a new one at the next recovery. A-EDiT's exception: each
// replica's shard rank 0 keeps its connection to post the replica's arrivals.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <algorithm>
#include <atomic>
#include <string>

#include "dist/comm.h"

namespace edit {

class Rendezvous {
 public:
  // Connects to (rank 0: hosts) the job's store. Rank 0 marks generation 0 formed.
  explicit Rendezvous(const MeshSpec& spec);

  c10::intrusive_ptr<c10d::Store> store() const { return store_; }
  // Once the generation's process groups are formed (Gloo uses the store only to
  // connect): notes the store's incarnation and closes this rank's connection to the
  // store, unless it hosts the store or keepConnection (A-EDiT posts its replicas'
  // arrivals there while it trains). The next rejoin connects again.
  void formed(bool keepConnection);
  int64_t generation() const { return generation_; }
  // A scale (docs/elastic.md): the next generation this rank opens or joins has `world`
  // ranks. Each generation names its size on the store, so a new replica waiting for a
  // scale-up never arrives in a recovery generation of the old size, or the reverse.
  void setWorld(int world) { spec_.world = world; }
  // The size of the generation this rank is in. A replacement that joined takes the size
  // the survivors opened it with, whatever its environment said (join()).
  int world() const { return spec_.world; }
  // After rejoin() timed out in a generation that never formed: the next rejoin opens the
  // one after it (that one may still hold the arrivals of the ranks that waited there).
  void abandonForming() { generation_ = std::max(generation_, forming_); }
  // While set and true, a generation this rank waits in is called off for everyone: it
  // marks it on the store, and every rank waiting there throws PeerLost (a scale-up the
  // operator gave up: the survivors need not wait out their deadline for its new replica).
  void setCallOff(const std::atomic<bool>* callOff) { callOff_ = callOff; }
  // Store prefix of the process groups of the current generation.
  std::string prefix() const;

  // A survivor of generation `generation()`: moves to the next one and waits until every
  // rank arrived. Throws PeerLost after timeoutSeconds or once `cancel` is set (SIGTERM).
  void rejoin(double timeoutSeconds, const std::atomic<bool>& cancel);
  // A replacement: waits for a generation that is forming, joins it (at its size, see
  // world()) and waits until it is formed. Throws PeerLost after timeoutSeconds or once
  // `cancel` is set.
  void join(double timeoutSeconds, const std::atomic<bool>& cancel);

 private:
  std::string key(const std::string& k) const { return spec_.storePrefix + "rdzv/" + k; }
  void arrive(int64_t gen, double deadline, const std::atomic<bool>& cancel);
  // Waits until the counter names a generation still forming, then arrives in it. A store
  // error propagates as is (the callers reconnect or give up).
  void waitForOpenGeneration(double deadline, const std::atomic<bool>& cancel);
  // Whether store_ is the store this rank's generation formed on (not a replacement's).
  bool sameStore() const;
  // A new client connection to MASTER_ADDR:MASTER_PORT (after rank 0's store died).
  void reconnect(double deadline, const std::atomic<bool>& cancel);
  // One attempt at a client connection (never hosts).
  c10::intrusive_ptr<c10d::Store> openClient(double timeoutSeconds) const;
  bool closed() const;
  static void checkCancel(const std::atomic<bool>& cancel);

  MeshSpec spec_;
  c10::intrusive_ptr<c10d::Store> store_;
  int64_t generation_ = 0;
  int64_t forming_ = 0;      // the generation this rank last arrived in
  std::string incarnation_;  // of the store the current generation formed on
  // In a generation that formed (from the start, unless EDIT_JOIN): it knows the running
  // world's size. A replacement is not until it joined, and takes the size it finds.
  bool member_ = false;
  const std::atomic<bool>* callOff_ = nullptr;
};

}  // namespace edit
