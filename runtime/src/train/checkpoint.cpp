#include "train/checkpoint.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

namespace edit {
namespace fs = std::filesystem;

static const char kMagic[8] = {'E', 'D', 'I', 'T', 'C', 'K', 'P', '1'};

uint32_t crc32(const void* data, size_t n, uint32_t crc) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  crc = ~crc;
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) crc = table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

static void fsyncDir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

bool CheckpointWriteError::noSpace() const { return error == ENOSPC || error == EDQUOT; }

std::string describeErrno(int err) {
  const char* name = err == ENOSPC   ? "ENOSPC"
                     : err == EDQUOT ? "EDQUOT"
                     : err == EIO    ? "EIO"
                     : err == EROFS  ? "EROFS"
                     : err == EACCES ? "EACCES"
                     : err == ENOTDIR ? "ENOTDIR"
                                      : nullptr;
  return name ? std::string(name) + " (" + std::strerror(err) + ")" : std::string(std::strerror(err));
}

namespace {
[[noreturn]] void writeFailed(const std::string& what, const std::string& path, int err) {
  throw CheckpointWriteError("cannot " + what + " " + path + ": " + describeErrno(err), err);
}

// A file written under a temporary name in its directory and renamed into place on
// commit (after fsync of the file, then of the directory); removed if never committed.
// The CRC-32 of everything written is kept as it goes, so no copy of the content is needed.
class AtomicFile {
 public:
  explicit AtomicFile(const std::string& path) : path_(path) {
    const fs::path target(path);
    dir_ = target.parent_path().empty() ? fs::path(".") : target.parent_path();
    std::error_code ec;
    fs::create_directories(dir_, ec);
    if (ec) writeFailed("create the directory", dir_.string(), ec.value());
    tmp_ = (dir_ / ("." + target.filename().string() + ".tmp-" + std::to_string(::getpid()))).string();
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd_ < 0) writeFailed("create", tmp_, errno);
  }
  ~AtomicFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(tmp_.c_str());
  }
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t n) {
    crc_ = crc32(data, n, crc_);
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
      const ssize_t w = ::write(fd_, p, n);
      if (w < 0) {
        if (errno == EINTR) continue;
        writeFailed("write", tmp_, errno);
      }
      p += w;
      n -= static_cast<size_t>(w);
    }
  }
  template <typename T>
  void put(T v) { write(&v, sizeof(T)); }
  uint32_t crc() const { return crc_; }

  void commit() {
    const int fd = fd_;
    fd_ = -1;
    // NFS reports a full disk at fsync or close, not at write.
    if (::fsync(fd) != 0) {
      const int err = errno;
      ::close(fd);
      writeFailed("sync", tmp_, err);
    }
    if (::close(fd) != 0) writeFailed("close", tmp_, errno);
    if (::rename(tmp_.c_str(), path_.c_str()) != 0) writeFailed("rename " + tmp_ + " to", path_, errno);
    committed_ = true;
    fsyncDir(dir_.string());
  }

 private:
  std::string path_, tmp_;
  fs::path dir_;
  int fd_ = -1;
  uint32_t crc_ = 0;
  bool committed_ = false;
};
}  // namespace

void writeFileAtomic(const std::string& path, const std::string& content) {
  AtomicFile f(path);
  f.write(content.data(), content.size());
  f.commit();
}

uint32_t writeCheckpointFile(const std::string& path, const NamedTensors& tensors) {
  // Streamed tensor by tensor: no copy of the rank's state is built in memory.
  AtomicFile f(path);
  f.write(kMagic, sizeof(kMagic));
  f.put<uint32_t>(static_cast<uint32_t>(tensors.size()));
  for (const auto& [name, t0] : tensors) {
    auto t = t0.detach().contiguous().cpu();  // no copy for a contiguous host tensor
    f.put<uint32_t>(static_cast<uint32_t>(name.size()));
    f.write(name.data(), name.size());
    f.put<int32_t>(static_cast<int32_t>(t.scalar_type()));
    f.put<uint32_t>(static_cast<uint32_t>(t.dim()));
    for (auto d : t.sizes()) f.put<int64_t>(d);
    f.put<uint64_t>(t.nbytes());
    f.write(t.data_ptr(), t.nbytes());
  }
  const uint32_t crc = f.crc();
  f.put<uint32_t>(crc);
  f.commit();
  return crc;
}

namespace {
// Reads a checkpoint file front to back through a small buffer, checking the CRC-32 as it
// goes; the stored CRC is the last 4 bytes. Tensors are read straight into their memory.
class CheckedReader {
 public:
  explicit CheckedReader(const std::string& path) : path_(path), in_(path, std::ios::binary) {
    if (!in_) throw CheckpointError(path + ": cannot open checkpoint file");
    in_.seekg(0, std::ios::end);
    const auto size = static_cast<int64_t>(in_.tellg());
    in_.seekg(0);
    if (size < static_cast<int64_t>(sizeof(kMagic)) + 8)
      throw CheckpointError(path + ": not an EDiT checkpoint file (bad magic or truncated)");
    left_ = static_cast<uint64_t>(size) - 4;  // payload bytes before the stored CRC
    char magic[sizeof(kMagic)];
    read(magic, sizeof(magic));
    if (std::memcmp(magic, kMagic, sizeof(kMagic)) != 0)
      throw CheckpointError(path + ": not an EDiT checkpoint file (bad magic or truncated)");
  }
  void need(uint64_t n) const {
    if (n > left_) throw CheckpointError(path_ + ": truncated checkpoint file");
  }
  void read(void* out, uint64_t n) {
    need(n);
    in_.read(static_cast<char*>(out), static_cast<std::streamsize>(n));
    if (!in_) throw CheckpointError(path_ + ": truncated checkpoint file");
    crc_ = crc32(out, n, crc_);
    left_ -= n;
  }
  template <typename T>
  T get() {
    T v;
    read(&v, sizeof(T));
    return v;
  }
  void skip(uint64_t n) {
    char buf[1 << 16];
    while (n > 0) {
      const uint64_t k = std::min<uint64_t>(n, sizeof(buf));
      read(buf, k);
      n -= k;
    }
  }
  uint64_t left() const { return left_; }
  // Checks the stored CRC against what was read; the whole payload must have been read.
  uint32_t finish() {
    skip(left_);
    uint32_t stored = 0;
    in_.read(reinterpret_cast<char*>(&stored), 4);
    if (!in_ || stored != crc_)
      throw CheckpointError(path_ + ": checksum mismatch (corrupt or truncated checkpoint)");
    return stored;
  }

 private:
  std::string path_;
  std::ifstream in_;
  uint64_t left_ = 0;
  uint32_t crc_ = 0;
};
}  // namespace

uint32_t verifyCheckpointFile(const std::string& path) {
  CheckedReader r(path);
  return r.finish();
}

NamedTensors readCheckpointFile(const std::string& path) {
  CheckedReader r(path);
  NamedTensors out;
  // The CRC covers the header too, but is only known at the end: a corrupt header is
  // caught by the checks below (which never allocate from an unchecked size), corrupt
  // tensor bytes by finish().
  const auto n = r.get<uint32_t>();
  for (uint32_t i = 0; i < n; ++i) {
    const auto len = r.get<uint32_t>();
    r.need(len);
    std::string name(len, '\0');
    r.read(name.data(), len);
    const auto code = r.get<int32_t>();
    if (code != static_cast<int32_t>(torch::kFloat32) && code != static_cast<int32_t>(torch::kFloat64) &&
        code != static_cast<int32_t>(torch::kInt64))
      throw CheckpointError(path + ": unsupported tensor type in " + name);
    const auto type = static_cast<c10::ScalarType>(code);
    const auto dim = r.get<uint32_t>();
    if (dim > 8) throw CheckpointError(path + ": bad tensor rank in " + name);
    std::vector<int64_t> sizes;
    int64_t numel = 1;
    for (uint32_t d = 0; d < dim; ++d) {
      sizes.push_back(r.get<int64_t>());
      const int64_t k = sizes.back();
      if (k < 0 || (k > 0 && numel > std::numeric_limits<int64_t>::max() / k))
        throw CheckpointError(path + ": bad tensor size in " + name);
      numel *= k;
    }
    const auto nbytes = r.get<uint64_t>();
    const uint64_t elem = c10::elementSize(type);
    if (static_cast<uint64_t>(numel) > std::numeric_limits<uint64_t>::max() / elem ||
        nbytes != static_cast<uint64_t>(numel) * elem)
      throw CheckpointError(path + ": size mismatch in " + name);
    r.need(nbytes);  // the file really holds the bytes before they are allocated
    auto t = torch::empty(sizes, torch::dtype(type));
    if (nbytes > 0) r.read(t.data_ptr(), nbytes);
    out[name] = t;
  }
  r.finish();
  return out;
}

std::string stepDirName(const std::string& root, int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "step-%08lld", static_cast<long long>(step));
  return (fs::path(root) / buf).string();
}

std::string rankFileName(const std::string& stepDir, int rank) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "rank-%05d.ckpt", rank);
  return (fs::path(stepDir) / buf).string();
}

void writeManifest(const std::string& stepDir, const Manifest& m) {
  std::ostringstream o;
  o << "edit-checkpoint v1\nstep " << m.step << "\nworld " << m.world << "\n";
  for (size_t r = 0; r < m.crcs.size(); ++r) o << "rank " << r << " crc32 " << m.crcs[r] << "\n";
  o << "config\n" << m.configYaml;
  writeFileAtomic((fs::path(stepDir) / "MANIFEST").string(), o.str());
}

Manifest readManifest(const std::string& stepDir) {
  const std::string path = (fs::path(stepDir) / "MANIFEST").string();
  std::ifstream in(path);
  if (!in) throw CheckpointError(path + ": missing (incomplete checkpoint)");
  Manifest m;
  std::string line, word;
  std::getline(in, line);
  if (line != "edit-checkpoint v1") throw CheckpointError(path + ": unknown manifest format");
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    ls >> word;
    if (word == "step") ls >> m.step;
    else if (word == "world") ls >> m.world;
    else if (word == "rank") {
      size_t r = 0;
      uint32_t crc = 0;
      if (!(ls >> r >> word >> crc) || word != "crc32")
        throw CheckpointError(path + ": malformed line \"" + line + "\"");
      if (r != m.crcs.size()) throw CheckpointError(path + ": ranks out of order");
      m.crcs.push_back(crc);
    } else if (word == "config") {
      std::ostringstream rest;
      rest << in.rdbuf();
      m.configYaml = rest.str();
      break;
    }
  }
  if (m.world <= 0 || static_cast<int>(m.crcs.size()) != m.world)
    throw CheckpointError(path + ": malformed manifest");
  return m;
}

std::vector<int64_t> completeCheckpointSteps(const std::string& root) {
  std::vector<int64_t> steps;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return steps;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const auto name = e.path().filename().string();
    if (name.rfind("step-", 0) != 0 || !fs::exists(e.path() / "MANIFEST")) continue;
    try {
      steps.push_back(std::stoll(name.substr(5)));
    } catch (...) {
    }
  }
  std::sort(steps.rbegin(), steps.rend());
  return steps;
}

void pruneCheckpoints(const std::string& root, int64_t keep) {
  auto steps = completeCheckpointSteps(root);
  std::error_code ec;
  for (size_t i = static_cast<size_t>(std::max<int64_t>(keep, 1)); i < steps.size(); ++i)
    fs::remove_all(stepDirName(root, steps[i]), ec);
  if (steps.empty()) return;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const auto name = e.path().filename().string();
    if (name.rfind("step-", 0) != 0 || fs::exists(e.path() / "MANIFEST")) continue;
    try {
      if (std::stoll(name.substr(5)) < steps.front()) fs::remove_all(e.path(), ec);
    } catch (...) {
    }
  }
}

}  // namespace edit
