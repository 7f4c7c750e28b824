// The 2D device mesh and its collectives.
//
// World W = M x N. Rank r is in replica m = r / N and holds shard s = r % N.
//   shard group: the N ranks of one replica (ZeRO-3: all-gather, reduce-scatter every step)
//   sync group:  the M ranks with the same shard index (EDiT synchronization)
// Groups of size 1 are absent (nullptr) and every collective on them is a no-op.
//
// All collectives go through Comm, which counts bytes sent and time the caller was
// blocked, per (op, group). Bytes are those of a bandwidth-optimal ring algorithm for the
// op (what NCCL/Gloo's ring sends): allgather (n-1)*chunk, reduce-scatter (n-1)/n*S,
// allreduce 2(n-1)/n*S; alltoall (n-1)/n*S (the chunks that leave the rank).
#pragma once

#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>

#include "comm_labels.h"
#include "scale_points.h"

#include "dist/comm_counts.h"
#include "dist/torch_compat.h"

namespace edit {

struct MeshSpec {
  int rank = 0, world = 1, replicas = 1, shards = 1;
  std::string masterAddr = "127.0.0.1";
  int masterPort = 29500;
  std::string bindAddr;          // interface address for Gloo ("" = resolve hostname)
  double timeoutSeconds = 300;
  int restartGeneration = 0;     // EDIT_RESTART_GENERATION: bumped by each gang restart
  std::string storePrefix;       // distinguishes gang-restart generations
  bool join = false;             // EDIT_JOIN=1: a replacement joining a running job
  bool scaleJoin = false;        // EDIT_JOIN=scale: a new replica joining at a scale-up
  // EDIT_SCALE_AT ("STEP:M,..."; edit-run --scale-at): change the number of replicas to M
  // at the first sync round at or after STEP (docs/elastic.md). In step order.
  std::vector<ScalePoint> scaleAt;
  std::string backend = "gloo";  // gloo | nccl (nccl only in EDIT_WITH_CUDA builds)
  int device = -1;               // CUDA device index for nccl (-1: CPU)
  // From RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, EDIT_REPLICAS, EDIT_SHARDS,
  // EDIT_BIND_ADDR / POD_IP, EDIT_RESTART_GENERATION, EDIT_JOIN, EDIT_SCALE_AT. Throws with
  // the variable named.
  static MeshSpec fromEnvironment();
};

enum class Group { Shard, Sync, World };
const char* groupName(Group g);

// A collective failed or timed out: a peer died, hung, or left for recovery. Every wait
// on a process group converts its error to this, so the trainer can tell a lost peer
// from a bug and recover in place (docs/replica-recovery.md).
struct PeerLost : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The job's store (dist/job_store.h), hosted by rank 0 and connected to by everyone else.
// It outlives process groups: after a peer is lost, the survivors and its replacement
// meet here again under a new recovery generation.
c10::intrusive_ptr<c10d::Store> connectStore(const MeshSpec& spec);

class Comm {
 public:
  // Connects its own store (tests, single-generation use).
  explicit Comm(const MeshSpec& spec);
  // Process groups over `store` under `prefix` (one prefix per recovery generation).
  Comm(const MeshSpec& spec, c10::intrusive_ptr<c10d::Store> store, const std::string& prefix);
  ~Comm();

  int rank() const { return spec_.rank; }
  int world() const { return spec_.world; }
  int replicas() const { return spec_.replicas; }
  int shards() const { return spec_.shards; }
  int replica() const { return spec_.rank / spec_.shards; }
  int shard() const { return spec_.rank % spec_.shards; }
  int size(Group g) const;
  int rankIn(Group g) const;

  // Blocking collectives (on the calling thread). In-place on `t` where it applies.
  void allreduce(Group g, torch::Tensor& t, c10d::ReduceOp op = c10d::ReduceOp::SUM);
  // out[i] receives rank i's `in`; `in` and each out[i] have the same size.
  void allgather(Group g, const torch::Tensor& in, std::vector<torch::Tensor>& out);
  // full: [n * chunk]; on return chunk i holds rank i's `mine` ([chunk]). No staging copy:
  // Gloo gets a ring of send/recv on `full`'s memory, NCCL its all-gather into one tensor.
  void allgatherInto(Group g, const torch::Tensor& mine, torch::Tensor& full);
  // full: [n * chunk] contributions of this rank; on return chunk `rankIn(g)` of `full`
  // holds the sum over the group (other chunks are clobbered). Gloo 1.13 has no
  // reduce_scatter: this is a ring of send/recv, which sends the optimal (n-1)/n bytes.
  void reduceScatterSum(Group g, torch::Tensor& full);
  // send, recv: [n * chunk]. Chunk i of `send` goes to rank i; chunk i of `recv` comes
  // from rank i (its own chunk is copied). Each rank sends the (n-1) chunks that leave it.
  void alltoall(Group g, const torch::Tensor& send, torch::Tensor& recv);
  void barrier(Group g);
  // In place: every rank of the group gets `root`'s `t` (root = rank within the group).
  void broadcast(Group g, torch::Tensor& t, int root);

  // Adds `delta` to the counter `key` on the job's store, in this generation's namespace,
  // and returns its new value (delta 0 reads it). A store that cannot be reached (its host,
  // rank 0, is gone) is PeerLost, like a failed collective.
  int64_t addCounter(const std::string& key, int64_t delta);
  // The store namespace of this generation's groups (one per rendezvous generation).
  const std::string& prefix() const { return prefix_; }

  // Counters (thread-safe). wait time is recorded by the waiter, see CommStream.
  void addWait(Group g, CommOp op, double seconds);
  CommCounts counters() const;

 private:
  CollectiveGroup* pg(Group g) const;
  bool onDevice() const { return spec_.backend == "nccl"; }
  // NCCL needs device tensors: host tensors are staged through the device.
  torch::Tensor staged(const torch::Tensor& t) const;
  void count(Group g, CommOp op, uint64_t bytes, double waitSeconds);
  // Starts a collective and waits for it; any failure, starting included (Gloo's send and
  // recv write and read at once), becomes PeerLost.
  void run(Group g, CommOp op, const std::function<c10::intrusive_ptr<c10d::Work>()>& start);
  void build(const c10::intrusive_ptr<c10d::Store>& base, const std::string& prefix);

  MeshSpec spec_;
  c10::intrusive_ptr<c10d::Store> store_;
  std::string prefix_;
  c10::intrusive_ptr<CollectiveGroup> world_, shard_, sync_;
  mutable std::mutex mu_;
  CommCounts counts_;
  int tag_ = 0;
};

// A FIFO of communication tasks run by one background thread: the CPU analogue of a
// CUDA communication stream. Every rank enqueues the same tasks in the same order, so
// collectives match across ranks while the training thread computes. Waiting on a
// task's future records the blocked time against (group, op).
// A task in flight on the communication stream.
struct Pending {
  std::shared_future<void> done;
  std::shared_ptr<void> event;  // CUDA builds: recorded on the stream after the task's work
  bool valid() const { return done.valid(); }
};

class CommStream {
 public:
  explicit CommStream(Comm& comm, int device = -1);
  ~CommStream();
  // On GPU the task's kernels run on a separate CUDA stream that first waits for the work
  // the training stream has queued so far (the task may read it).
  Pending enqueue(std::function<void()> task);
  // Blocks until the task is done; rethrows its exception; counts the wait. On GPU the
  // training stream then waits for the task's kernels.
  void wait(const Pending& p, Group g, CommOp op);
  // After a failure: tasks not yet started fail at once instead of running collectives
  // that can no longer match across ranks. The task in flight (if any) finishes or fails.
  void abort() { aborted_ = true; }

 private:
  void loop();
  Comm& comm_;
  int device_;
  std::shared_ptr<void> side_;  // CUDA builds: the communication stream
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::packaged_task<void()>> queue_;
  bool stop_ = false;
  std::atomic<bool> aborted_{false};
  std::thread thread_;
};

double nowSeconds();  // monotonic

// For a GPU tensor, blocks until the calling thread's current CUDA stream has done its
// work (a buffer it used may then be reused on another stream); a no-op on CPU.
void waitForDeviceWork(const torch::Tensor& used);

}  // namespace edit
