// A caching CPU allocator for LibTorch: a training step allocates the same activation and
// gradient sizes every time, and with glibc's malloc the medium and large ones come back
// as fresh pages (mmap, or a heap trimmed between steps): tens of MB of page faults per
// step, each zeroed by the kernel. This allocator keeps freed blocks of 64 KiB to 64 MiB
// in free lists by (page-rounded) size and hands them back on the next request of that
// size, up to a cap on the bytes it holds; smaller and larger requests go to the default
// allocator. edit-train installs it at start-up (runtime.cachingAllocator).
#pragma once

#include <cstddef>
#include <cstdint>

namespace edit {

struct CachingAllocatorStats {
  uint64_t hits = 0, misses = 0;  // requests served from the cache / newly allocated
  int64_t cachedBytes = 0;        // free bytes held now
};

// Replaces LibTorch's CPU allocator (c10::SetCPUAllocator) for the rest of the process.
// Tensors allocated before keep their own deleter. Idempotent.
void installCachingCpuAllocator(int64_t maxCachedBytes);
CachingAllocatorStats cachingAllocatorStats();

}  // namespace edit
