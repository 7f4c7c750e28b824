// The labels of the runtime's communication counters, (op, group): what /metrics, the
// summary and the worker's telemetry reports carry, and the only values the operator's
// telemetry service accepts. One list for both sides.
#pragma once

#include <array>
#include <cstddef>
#include <string>
#include <string_view>

namespace edit {

// What a rank was doing: a collective, or waiting for work on its communication thread
// that is more than one collective (a layer-wise round's unit; a compressed average).
enum class CommOp { AllGather, AllReduce, AllToAll, Barrier, Broadcast, ReduceScatter, Sync, CompressedMean };
inline constexpr std::array<const char*, 8> kCommOpNames = {
    "allgather", "allreduce", "alltoall", "barrier", "broadcast", "reduce_scatter", "sync", "compressed_mean"};

// The process groups of the 2D mesh (dist/comm.h): a replica's shards, the replicas'
// same shard, everyone.
inline constexpr std::array<const char*, 3> kCommGroupNames = {"shard", "sync", "world"};

inline const char* commOpName(CommOp op) { return kCommOpNames[static_cast<size_t>(op)]; }

template <size_t N>
bool oneOf(const std::array<const char*, N>& names, std::string_view v) {
  for (const char* n : names)
    if (v == n) return true;
  return false;
}
inline bool isCommOp(std::string_view op) { return oneOf(kCommOpNames, op); }
inline bool isCommGroup(std::string_view group) { return oneOf(kCommGroupNames, group); }

template <size_t N>
std::string listOf(const std::array<const char*, N>& names) {
  std::string out;
  for (const char* n : names) out += (out.empty() ? "" : ", ") + std::string(n);
  return out;
}

}  // namespace edit
