// The LibTorch API differences the runtime meets, in one place. It builds against
//   1.13  Debian bookworm's libtorch-dev (the normal build, CPU, Gloo)
//   2.x   a CUDA PyTorch's LibTorch on GPU machines (2.11 there), checked here against
//         Debian trixie's 2.6 headers by scripts/check-libtorch2.sh
// Everything else is the same API in both.
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/version.h>

#include <cstdint>

#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
#endif

#ifdef EDIT_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace edit {

// What Comm holds for each group: the Gloo or NCCL process group itself.
#if TORCH_VERSION_MAJOR >= 2
// 2.0 split c10d::ProcessGroup into a front end and per-device backends:
// ProcessGroupGloo and ProcessGroupNCCL derive from c10d::Backend, which keeps the
// collectives (allreduce, allgather, _allgather_base, _reduce_scatter_base, send, recv).
using CollectiveGroup = c10d::Backend;
#else
// 1.13: ProcessGroupGloo and ProcessGroupNCCL derive from c10d::ProcessGroup.
using CollectiveGroup = c10d::ProcessGroup;
#endif

#ifdef EDIT_WITH_CUDA
struct DeviceMemoryPeak {
  int64_t allocated = 0;  // tensors (torch.cuda.max_memory_allocated)
  int64_t reserved = 0;   // the allocator's blocks (closer to what nvidia-smi shows)
};

// Peaks since the process started on CUDA device `device`. The statistics' types moved
// from c10::cuda::CUDACachingAllocator (1.13) to c10::CachingDeviceAllocator (2.x);
// index 0 is StatType::AGGREGATE in both, so neither namespace is named.
inline DeviceMemoryPeak deviceMemoryPeak(int device) {
  const auto s = c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(device));
  return {s.allocated_bytes[0].peak, s.reserved_bytes[0].peak};
}
#endif

}  // namespace edit
