// Fuzz inputs through the checkpoint readers (runtime/src/train/checkpoint.h):
//   fuzzCheckpointOne: the bytes as a rank file, read twice: as they are, and with the
//     last four bytes replaced by the right CRC-32 (so that mutations get past the
//     checksum and reach the tensor parser); an accepted file is written back with
//     writeCheckpointFile and must read back bit for bit.
//   fuzzManifestOne: the bytes as <step dir>/MANIFEST, through readManifest.
// Contract checked: nothing but CheckpointError is thrown.
#pragma once

#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>

#include "train/checkpoint.h"
#include "fuzz_util.h"

namespace edit::fuzz {


inline void readOneCheckpoint(const std::string& path, const std::string& bytes) {
  writeFile(path, reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  NamedTensors t;
  try {
    t = readCheckpointFile(path);
  } catch (const CheckpointError&) {
    try {
      verifyCheckpointFile(path);
    } catch (const CheckpointError&) {
    }
    return;
  }
  const uint32_t crc = verifyCheckpointFile(path);
  (void)crc;
  // What was read writes back and reads back identically.
  const std::string again = path + ".again";
  writeCheckpointFile(again, t);
  NamedTensors back = readCheckpointFile(again);
  if (back.size() != t.size()) throw std::logic_error("checkpoint round trip lost tensors");
  for (const auto& [name, x] : t) {
    auto it = back.find(name);
    if (it == back.end()) throw std::logic_error("checkpoint round trip lost " + name);
    const auto& y = it->second;
    if (x.scalar_type() != y.scalar_type() || x.sizes() != y.sizes() || x.nbytes() != y.nbytes() ||
        (x.nbytes() && std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) != 0))
      throw std::logic_error("checkpoint round trip changed " + name);
  }
}

inline void fuzzCheckpointOne(const uint8_t* data, size_t size) {
  const std::string raw(reinterpret_cast<const char*>(data), size);
  const std::string path = scratchDir() + "/rank-00000.ckpt";
  readOneCheckpoint(path, raw);
  if (size >= 4) {
    std::string fixed = raw.substr(0, size - 4);
    const uint32_t c = crc32(fixed.data(), fixed.size());
    fixed.append(reinterpret_cast<const char*>(&c), 4);
    if (fixed != raw) readOneCheckpoint(path, fixed);
  }
}

inline void fuzzManifestOne(const uint8_t* data, size_t size) {
  const std::string dir = scratchDir() + "/step-00000001";
  std::filesystem::create_directories(dir);
  writeFile(dir + "/MANIFEST", data, size);
  try {
    Manifest m = readManifest(dir);
    if (m.world <= 0 || m.crcs.size() != static_cast<size_t>(m.world))
      throw std::logic_error("readManifest accepted a manifest whose ranks do not match world");
    // A manifest readManifest accepts is one writeManifest can reproduce.
    writeManifest(dir, m);
    Manifest back = readManifest(dir);
    if (back.step != m.step || back.world != m.world || back.crcs != m.crcs || back.configYaml != m.configYaml)
      throw std::logic_error("manifest round trip changed it");
  } catch (const CheckpointError&) {
  }
}

}  // namespace edit::fuzz
