#include "model/cpu_allocator.h"

#include <c10/core/CPUAllocator.h>
#include <torch/version.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

namespace edit {
namespace {

constexpr size_t kMinBytes = size_t{64} << 10;  // below: malloc's bins are fine
constexpr size_t kMaxBytes = size_t{64} << 20;  // above: rare, and worth giving back
constexpr size_t kPage = 4096;
constexpr size_t kAlign = 64;  // what c10's allocator guarantees

struct Block {
  void* ptr;
  size_t bytes;  // page-rounded
};

class CachingCpuAllocator final : public c10::Allocator {
 public:
  CachingCpuAllocator(c10::Allocator* fallback, int64_t maxCached) : fallback_(fallback), max_(maxCached) {}

  // 1.13 declares allocate() const; 2.x (checked against 2.6 by check-libtorch2.sh) does not.
#if TORCH_VERSION_MAJOR >= 2
  c10::DataPtr allocate(size_t n) override {
#else
  c10::DataPtr allocate(size_t n) const override {
#endif
    if (n < kMinBytes || n > kMaxBytes) return fallback_->allocate(n);
    const size_t bytes = (n + kPage - 1) / kPage * kPage;
    Block* b = nullptr;
    {
      std::lock_guard<std::mutex> lk(mu_);
      auto it = free_.find(bytes);
      if (it != free_.end() && !it->second.empty()) {
        b = it->second.back();
        it->second.pop_back();
        cached_ -= static_cast<int64_t>(bytes);
        ++hits_;
      } else {
        ++misses_;
      }
    }
    if (!b) {
      void* p = nullptr;
      if (posix_memalign(&p, kAlign, bytes) != 0) throw std::bad_alloc();
      b = new Block{p, bytes};
    }
    return {b->ptr, b, &release, c10::Device(c10::DeviceType::CPU)};
  }

  // LibTorch 2.x asks allocators to copy; 1.13 does not have this.
#if TORCH_VERSION_MAJOR >= 2
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }
#endif

  static void release(void* ctx) {
    auto* b = static_cast<Block*>(ctx);
    auto* self = instance();
    {
      std::lock_guard<std::mutex> lk(self->mu_);
      if (self->cached_ + static_cast<int64_t>(b->bytes) <= self->max_) {
        self->free_[b->bytes].push_back(b);
        self->cached_ += static_cast<int64_t>(b->bytes);
        return;
      }
    }
    std::free(b->ptr);
    delete b;
  }

  static CachingCpuAllocator* instance(CachingCpuAllocator* set = nullptr) {
    static CachingCpuAllocator* the = nullptr;
    if (set) the = set;
    return the;
  }

  CachingAllocatorStats stats() const {
    std::lock_guard<std::mutex> lk(mu_);
    return {hits_, misses_, cached_};
  }

 private:
  c10::Allocator* fallback_;
  int64_t max_;
  mutable std::mutex mu_;
  mutable std::unordered_map<size_t, std::vector<Block*>> free_;
  mutable int64_t cached_ = 0;
  mutable uint64_t hits_ = 0, misses_ = 0;
};

std::once_flag installed;

}  // namespace

void installCachingCpuAllocator(int64_t maxCachedBytes) {
  std::call_once(installed, [maxCachedBytes] {
    // Never destroyed: blocks handed out may be freed during static destruction.
    auto* a = new CachingCpuAllocator(c10::GetDefaultCPUAllocator(), maxCachedBytes);
    CachingCpuAllocator::instance(a);
    c10::SetCPUAllocator(a, /*priority=*/1);
  });
}

CachingAllocatorStats cachingAllocatorStats() {
  auto* a = CachingCpuAllocator::instance();
  return a ? a->stats() : CachingAllocatorStats{};
}

}  // namespace edit
