#include "dist/comm.h"
#include "dist/job_store.h"
#include "dist/thread_slices.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <dlfcn.h>

#include <chrono>
#include <cstdlib>
#include <stdexcept>

#ifdef EDIT_WITH_CUDA
// The GPU path (CUDA LibTorch + NCCL): compiled only with -DEDIT_WITH_CUDA=ON.
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace edit {

double nowSeconds() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

void waitForDeviceWork(const torch::Tensor& used) {
#ifdef EDIT_WITH_CUDA
  if (used.is_cuda()) c10::cuda::getCurrentCUDAStream(used.device().index()).synchronize();
#else
  (void)used;
#endif
}

static std::string env(const char* k, const char* dflt = nullptr) {
  const char* v = std::getenv(k);
  if (v && *v) return v;
  if (dflt) return dflt;
  throw std::runtime_error(std::string("environment variable ") + k +
                           " is not set (edit-run and the operator set it)");
}

static int envInt(const char* k, const char* dflt = nullptr) {
  auto s = env(k, dflt);
  try {
    size_t pos = 0;
    int v = std::stoi(s, &pos);
    if (pos != s.size()) throw std::invalid_argument(s);
    return v;
  } catch (const std::exception&) {
    throw std::runtime_error(std::string("environment variable ") + k +
                             " must be an integer (got \"" + s + "\")");
  }
}

MeshSpec MeshSpec::fromEnvironment() {
  MeshSpec m;
  m.rank = envInt("RANK", "0");
  m.world = envInt("WORLD_SIZE", "1");
  m.masterAddr = env("MASTER_ADDR", "127.0.0.1");
  m.masterPort = envInt("MASTER_PORT", "29500");
  m.shards = envInt("EDIT_SHARDS", "1");
  m.replicas = envInt("EDIT_REPLICAS", std::to_string(m.world / std::max(1, m.shards)).c_str());
  const char* bind = std::getenv("EDIT_BIND_ADDR");
  if (!bind || !*bind) bind = std::getenv("POD_IP");
  m.bindAddr = bind ? bind : "";
  m.restartGeneration = envInt("EDIT_RESTART_GENERATION", "0");
  if (m.restartGeneration < 0) throw std::runtime_error("EDIT_RESTART_GENERATION must be >= 0");
  m.storePrefix = "gen" + std::to_string(m.restartGeneration) + "/";
  const std::string join = env("EDIT_JOIN", "0");
  if (join != "0" && join != "1" && join != "scale")
    throw std::runtime_error("EDIT_JOIN must be 0, 1 or scale (got \"" + join + "\")");
  m.join = join != "0";
  m.scaleJoin = join == "scale";
  m.scaleAt = parseScalePoints(env("EDIT_SCALE_AT", ""), "EDIT_SCALE_AT");
  if (m.world < 1) throw std::runtime_error("WORLD_SIZE must be >= 1");
  if (m.rank < 0 || m.rank >= m.world)
    throw std::runtime_error("RANK must be in [0, WORLD_SIZE) (got " + std::to_string(m.rank) + ")");
  if (m.shards < 1 || m.replicas < 1 || m.replicas * m.shards != m.world)
    throw std::runtime_error("EDIT_REPLICAS x EDIT_SHARDS must equal WORLD_SIZE (got " +
                             std::to_string(m.replicas) + " x " + std::to_string(m.shards) +
                             " != " + std::to_string(m.world) + ")");
  if (m.masterPort <= 0 || m.masterPort > 65535)
    throw std::runtime_error("MASTER_PORT must be in [1, 65535]");
  return m;
}

const char* groupName(Group g) { return kCommGroupNames[static_cast<size_t>(g)]; }

c10::intrusive_ptr<c10d::Store> connectStore(const MeshSpec& spec) {
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(spec.timeoutSeconds * 1000));
  // Rank 0 hosts, and so does rank 0's replacement: the old store died with it.
  if (spec.rank == 0) return JobStore::host(spec.masterPort, timeout);
  return JobStore::connect(spec.masterAddr, spec.masterPort, timeout, timeout);
}

Comm::Comm(const MeshSpec& spec) : spec_(spec) { build(connectStore(spec), spec.storePrefix); }

Comm::Comm(const MeshSpec& spec, c10::intrusive_ptr<c10d::Store> store, const std::string& prefix)
    : spec_(spec) {
  build(store, prefix);
}

void Comm::build(const c10::intrusive_ptr<c10d::Store>& base, const std::string& prefix) {
  const auto& spec = spec_;
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(spec.timeoutSeconds * 1000));
  prefix_ = prefix;
  store_ = c10::make_intrusive<c10d::PrefixStore>(prefix, base);

#ifndef EDIT_WITH_CUDA
  if (spec.backend == "nccl")
    throw std::runtime_error("runtime.backend nccl needs a build with -DEDIT_WITH_CUDA=ON");
#endif
  // The Gloo device's I/O loop and each group's worker threads start here: they carry the
  // collectives, so they get short scheduler slices (dist/thread_slices.h).
  const std::set<int> threadsBefore = processThreads();
  auto device = spec.bindAddr.empty()
                    ? c10d::ProcessGroupGloo::createDefaultDevice()
                    : c10d::ProcessGroupGloo::createDeviceForHostname(spec.bindAddr);
  auto make = [&](const std::string& name, int rank, int size) -> c10::intrusive_ptr<CollectiveGroup> {
    if (size <= 1) return {};
#ifdef EDIT_WITH_CUDA
    if (spec.backend == "nccl") {
      auto o = c10d::ProcessGroupNCCL::Options::create();
      o->timeout = timeout;
      auto ps = c10::make_intrusive<c10d::PrefixStore>(name, store_);
      return c10::make_intrusive<c10d::ProcessGroupNCCL>(ps, rank, size, o);
    }
#endif
    auto o = c10d::ProcessGroupGloo::Options::create();
    o->timeout = timeout;
    o->devices.push_back(device);
    auto ps = c10::make_intrusive<c10d::PrefixStore>(name, store_);
    return c10::make_intrusive<c10d::ProcessGroupGloo>(ps, rank, size, o);
  };
  try {
    world_ = make("world/", spec.rank, spec.world);
    shard_ = make("shard" + std::to_string(replica()) + "/", shard(), spec.shards);
    sync_ = make("sync" + std::to_string(shard()) + "/", replica(), spec.replicas);
    shortSliceForThreadsSince(threadsBefore);
  } catch (const c10::Error& e) {
    throw PeerLost(std::string("forming the process groups failed (a peer did not arrive): ") +
                   e.what_without_backtrace());
  } catch (const std::exception& e) {
    throw PeerLost(std::string("forming the process groups failed (a peer did not arrive): ") + e.what());
  }
}

Comm::~Comm() = default;

int Comm::size(Group g) const {
  switch (g) {
    case Group::Shard: return spec_.shards;
    case Group::Sync: return spec_.replicas;
    default: return spec_.world;
  }
}

int Comm::rankIn(Group g) const {
  switch (g) {
    case Group::Shard: return shard();
    case Group::Sync: return replica();
    default: return spec_.rank;
  }
}

CollectiveGroup* Comm::pg(Group g) const {
  switch (g) {
    case Group::Shard: return shard_.get();
    case Group::Sync: return sync_.get();
    default: return world_.get();
  }
}

void Comm::count(Group g, CommOp op, uint64_t bytes, double waitSeconds) {
  std::lock_guard<std::mutex> lk(mu_);
  auto& c = counts_[{commOpName(op), groupName(g)}];
  c.bytes += bytes;
  c.waitSeconds += waitSeconds;
  c.calls += 1;
}

void Comm::addWait(Group g, CommOp op, double seconds) {
  std::lock_guard<std::mutex> lk(mu_);
  counts_[{commOpName(op), groupName(g)}].waitSeconds += seconds;
}

CommCounts Comm::counters() const {
  std::lock_guard<std::mutex> lk(mu_);
  return counts_;
}

torch::Tensor Comm::staged(const torch::Tensor& t) const {
  if (!onDevice() || t.is_cuda()) return t;
  return t.to(torch::Device(torch::kCUDA, spec_.device));
}

void Comm::allreduce(Group g, torch::Tensor& t, c10d::ReduceOp op) {
  auto* p = pg(g);
  if (!p) return;
  const int n = size(g);
  auto d = staged(t);
  std::vector<torch::Tensor> v{d};
  c10d::AllreduceOptions o;
  o.reduceOp = op;
  run(g, CommOp::AllReduce, [&] { return p->allreduce(v, o); });
  if (!d.is_same(t)) t.copy_(d);
  count(g, CommOp::AllReduce, static_cast<uint64_t>(2.0 * (n - 1) / n * t.nbytes()), 0);
}

void Comm::allgather(Group g, const torch::Tensor& in, std::vector<torch::Tensor>& out) {
  auto* p = pg(g);
  if (!p) {
    if (out[0].data_ptr() != in.data_ptr()) out[0].copy_(in);
    return;
  }
  std::vector<torch::Tensor> staging;
  for (auto& o : out) staging.push_back(staged(o));
  std::vector<std::vector<torch::Tensor>> outs{staging};
  std::vector<torch::Tensor> ins{staged(in)};
  run(g, CommOp::AllGather, [&] { return p->allgather(outs, ins); });
  for (size_t i = 0; i < out.size(); ++i)
    if (!staging[i].is_same(out[i])) out[i].copy_(staging[i]);
  count(g, CommOp::AllGather, static_cast<uint64_t>(size(g) - 1) * in.nbytes(), 0);
}

void Comm::allgatherInto(Group g, const torch::Tensor& mine, torch::Tensor& full) {
  auto* p = pg(g);
  const int n = size(g), me = rankIn(g);
  const int64_t chunk = mine.numel();
  auto part = [&](int i) { return full.narrow(0, ((i % n) + n) % n * chunk, chunk); };
  if (part(me).data_ptr() != mine.data_ptr()) part(me).copy_(mine);  // may be written in place
  if (!p) return;
#ifdef EDIT_WITH_CUDA
  if (onDevice()) {
    auto in = part(me);
    run(g, CommOp::AllGather, [&] { return p->_allgather_base(full, in); });
    count(g, CommOp::AllGather, static_cast<uint64_t>(n - 1) * chunk * full.element_size(), 0);
    return;
  }
#endif
  // Ring: at step k pass on the chunk received at step k-1 (first our own); after n-1
  // steps every chunk has arrived. Each rank sends (n-1) chunks, the optimal volume.
  const int next = (me + 1) % n, prev = (me - 1 + n) % n;
  for (int k = 0; k < n - 1; ++k) {
    std::vector<torch::Tensor> s{part(me - k)}, r{part(me - k - 1)};
    const int tag = (tag_++) & 0xffff;
    c10::intrusive_ptr<c10d::Work> sw;
    run(g, CommOp::AllGather, [&] {
      sw = p->send(s, next, tag);
      return p->recv(r, prev, tag);
    });
    run(g, CommOp::AllGather, [&] { return sw; });
  }
  count(g, CommOp::AllGather, static_cast<uint64_t>(n - 1) * chunk * full.element_size(), 0);
}

void Comm::reduceScatterSum(Group g, torch::Tensor& full) {
  auto* p = pg(g);
  if (!p) return;
  const int n = size(g), me = rankIn(g);
  const int64_t chunk = full.numel() / n;
#ifdef EDIT_WITH_CUDA
  if (onDevice()) {
    // NCCL has a real reduce-scatter.
    auto mine = full.narrow(0, me * chunk, chunk);
    auto out = torch::empty_like(mine);
    run(g, CommOp::ReduceScatter, [&] { return p->_reduce_scatter_base(out, full); });
    mine.copy_(out);
    count(g, CommOp::ReduceScatter, static_cast<uint64_t>(n - 1) * chunk * full.element_size(), 0);
    return;
  }
#endif
  auto part = [&](int i) { return full.narrow(0, ((i % n) + n) % n * chunk, chunk); };
  auto tmp = torch::empty({chunk}, full.options());
  const int next = (me + 1) % n, prev = (me - 1 + n) % n;
  // Ring: at step k send the running sum of chunk (me-k-1) to the next rank and add the
  // previous rank's running sum of chunk (me-k-2); after n-1 steps chunk `me` is complete.
  for (int k = 0; k < n - 1; ++k) {
    std::vector<torch::Tensor> s{part(me - k - 1)}, r{tmp};
    const int tag = (tag_++) & 0xffff;
    c10::intrusive_ptr<c10d::Work> sw;
    run(g, CommOp::ReduceScatter, [&] {
      sw = p->send(s, next, tag);
      return p->recv(r, prev, tag);
    });
    run(g, CommOp::ReduceScatter, [&] { return sw; });
    part(me - k - 2).add_(tmp);
  }
  count(g, CommOp::ReduceScatter, static_cast<uint64_t>(n - 1) * chunk * full.element_size(), 0);
}

void Comm::alltoall(Group g, const torch::Tensor& send, torch::Tensor& recv) {
  auto* p = pg(g);
  if (!p) {
    recv.copy_(send);
    return;
  }
  const int n = size(g);
  auto in = staged(send), out = staged(recv);
  std::vector<int64_t> equalSplits;  // empty: n equal chunks
  run(g, CommOp::AllToAll, [&] { return p->alltoall_base(out, in, equalSplits, equalSplits); });
  if (!out.is_same(recv)) recv.copy_(out);
  count(g, CommOp::AllToAll, static_cast<uint64_t>(n - 1) * (send.nbytes() / n), 0);
}

int64_t Comm::addCounter(const std::string& key, int64_t delta) {
  try {
    return store_->add(key, delta);
  } catch (const std::exception& e) {
    throw PeerLost("the job's store could not be reached (counter " + key + "): " + e.what());
  }
}

void Comm::barrier(Group g) {
  auto* p = pg(g);
  if (!p) return;
  auto t = staged(torch::zeros({1}));
  std::vector<torch::Tensor> v{t};
  run(g, CommOp::Barrier, [&] { return p->allreduce(v); });
  count(g, CommOp::Barrier, 0, 0);
}

void Comm::broadcast(Group g, torch::Tensor& t, int root) {
  auto* p = pg(g);
  if (!p) return;
  auto d = staged(t);
  std::vector<torch::Tensor> v{d};
  c10d::BroadcastOptions o;
  o.rootRank = root;
  run(g, CommOp::Broadcast, [&] { return p->broadcast(v, o); });
  if (!d.is_same(t)) t.copy_(d);
  count(g, CommOp::Broadcast, static_cast<uint64_t>(t.nbytes()), 0);
}

void Comm::run(Group g, CommOp op, const std::function<c10::intrusive_ptr<c10d::Work>()>& start) {
  try {
    start()->wait();
  } catch (const PeerLost&) {
    throw;
  } catch (const c10::Error& e) {
    throw PeerLost(std::string(commOpName(op)) + " on the " + groupName(g) + " group failed: " + e.what_without_backtrace());
  } catch (const std::exception& e) {
    throw PeerLost(std::string(commOpName(op)) + " on the " + groupName(g) + " group failed: " + e.what());
  }
}

CommStream::CommStream(Comm& comm, int device) : comm_(comm), device_(device) {
#ifdef EDIT_WITH_CUDA
  if (device_ >= 0)
    side_ = std::make_shared<c10::cuda::CUDAStream>(c10::cuda::getStreamFromPool(false, device_));
#endif
  thread_ = std::thread([this] { loop(); });
}

CommStream::~CommStream() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

Pending CommStream::enqueue(std::function<void()> task) {
  Pending p;
#ifdef EDIT_WITH_CUDA
  if (side_) {
    // The task may read what the training stream produced so far (gradients, weights).
    auto before = std::make_shared<at::cuda::CUDAEvent>();
    before->record(c10::cuda::getCurrentCUDAStream(device_));
    auto after = std::make_shared<at::cuda::CUDAEvent>();
    auto side = std::static_pointer_cast<c10::cuda::CUDAStream>(side_);
    task = [before, after, side, t = std::move(task)] {
      before->block(*side);
      t();
      after->record(*side);
    };
    p.event = after;
  }
#endif
  task = [this, t = std::move(task)] {
    if (aborted_) throw PeerLost("skipped: an earlier collective failed");
    try {
      t();
    } catch (...) {
      aborted_ = true;  // later tasks would run collectives the peers never join
      throw;
    }
  };
  std::packaged_task<void()> pt(std::move(task));
  p.done = pt.get_future().share();
  {
    std::lock_guard<std::mutex> lk(mu_);
    queue_.push_back(std::move(pt));
  }
  cv_.notify_one();
  return p;
}

void CommStream::wait(const Pending& p, Group g, CommOp op) {
  const double t0 = nowSeconds();
  p.done.wait();
  comm_.addWait(g, op, nowSeconds() - t0);
  p.done.get();  // rethrows the task's exception
#ifdef EDIT_WITH_CUDA
  if (p.event)
    std::static_pointer_cast<at::cuda::CUDAEvent>(p.event)->block(
        c10::cuda::getCurrentCUDAStream(device_));
#endif
}

void CommStream::loop() {
  // Communication never records autograd history.
  torch::NoGradGuard guard;
  // The ops between collectives (copies, scaling, norms) run on this thread alone: an
  // OpenMP team of its own would spin-wait against the training thread's team for cores.
  // at::get_num_threads() first makes ATen set this thread up, which would undo it after.
  (void)at::get_num_threads();
  if (auto* set = reinterpret_cast<void (*)(int)>(dlsym(RTLD_DEFAULT, "omp_set_num_threads"))) set(1);
  shortSliceForThisThread();  // it wakes for every collective (dist/thread_slices.h)
#ifdef EDIT_WITH_CUDA
  std::unique_ptr<c10::cuda::CUDAStreamGuard> streamGuard;
  if (side_) streamGuard = std::make_unique<c10::cuda::CUDAStreamGuard>(
      *std::static_pointer_cast<c10::cuda::CUDAStream>(side_));
#endif
  for (;;) {
    std::packaged_task<void()> task;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
  }
}

}  // namespace edit
