#include "checkpoint.h"

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

void writeFileAtomic(const std::string& path, const std::string& content) {
  const fs::path target(path);
  const fs::path dir = target.parent_path().empty() ? fs::path(".") : target.parent_path();
  fs::create_directories(dir);
  const std::string tmp = (dir / ("." + target.filename().string() + ".tmp-" +
                                  std::to_string(::getpid()))).string();
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw CheckpointError("cannot create " + tmp + ": " + std::strerror(errno));
  size_t off = 0;
  while (off < content.size()) {
    ssize_t w = ::write(fd, content.data() + off, content.size() - off);
    if (w < 0) {
      if (errno == EINTR) continue;
      const std::string err = std::strerror(errno);
      ::close(fd);
      ::unlink(tmp.c_str());
      throw CheckpointError("cannot write " + tmp + ": " + err);
    }
    off += static_cast<size_t>(w);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    ::unlink(tmp.c_str());
    throw CheckpointError("cannot sync " + tmp + ": " + std::strerror(errno));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    throw CheckpointError("cannot rename " + tmp + " to " + path + ": " + std::strerror(errno));
  }
  fsyncDir(dir.string());
}

template <typename T>
static void put(std::string& s, T v) {
  s.append(reinterpret_cast<const char*>(&v), sizeof(T));
}

uint32_t writeCheckpointFile(const std::string& path, const NamedTensors& tensors) {
  std::string s(kMagic, sizeof(kMagic));
  put<uint32_t>(s, static_cast<uint32_t>(tensors.size()));
  for (const auto& [name, t0] : tensors) {
    auto t = t0.detach().contiguous().cpu();
    put<uint32_t>(s, static_cast<uint32_t>(name.size()));
    s += name;
    put<int32_t>(s, static_cast<int32_t>(t.scalar_type()));
    put<uint32_t>(s, static_cast<uint32_t>(t.dim()));
    for (auto d : t.sizes()) put<int64_t>(s, d);
    put<uint64_t>(s, t.nbytes());
    s.append(static_cast<const char*>(t.data_ptr()), t.nbytes());
  }
  const uint32_t crc = crc32(s.data(), s.size());
  put<uint32_t>(s, crc);
  writeFileAtomic(path, s);
  return crc;
}

namespace {
struct Reader {
  const std::string& s;
  const std::string& path;
  size_t off = 0;
  void need(size_t n) {
    if (off + n > s.size()) throw CheckpointError(path + ": truncated checkpoint file");
  }
  template <typename T>
  T get() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, s.data() + off, sizeof(T));
    off += sizeof(T);
    return v;
  }
};

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw CheckpointError(path + ": cannot open checkpoint file");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

uint32_t checkFrame(const std::string& s, const std::string& path) {
  if (s.size() < sizeof(kMagic) + 8 || std::memcmp(s.data(), kMagic, sizeof(kMagic)) != 0)
    throw CheckpointError(path + ": not an EDiT checkpoint file (bad magic or truncated)");
  uint32_t stored;
  std::memcpy(&stored, s.data() + s.size() - 4, 4);
  const uint32_t actual = crc32(s.data(), s.size() - 4);
  if (stored != actual)
    throw CheckpointError(path + ": checksum mismatch (corrupt or truncated checkpoint)");
  return stored;
}
}  // namespace

uint32_t verifyCheckpointFile(const std::string& path) { return checkFrame(slurp(path), path); }

NamedTensors readCheckpointFile(const std::string& path) {
  const std::string s = slurp(path);
  checkFrame(s, path);
  const std::string body = s.substr(0, s.size() - 4);
  Reader r{body, path, sizeof(kMagic)};
  NamedTensors out;
  const auto n = r.get<uint32_t>();
  for (uint32_t i = 0; i < n; ++i) {
    const auto len = r.get<uint32_t>();
    r.need(len);
    std::string name = body.substr(r.off, len);
    r.off += len;
    // Validate everything before allocating: a corrupt header must not ask for terabytes.
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
      const int64_t n = sizes.back();
      if (n < 0 || (n > 0 && numel > std::numeric_limits<int64_t>::max() / n))
        throw CheckpointError(path + ": bad tensor size in " + name);
      numel *= n;
    }
    const auto nbytes = r.get<uint64_t>();
    const uint64_t elem = c10::elementSize(type);
    if (static_cast<uint64_t>(numel) > std::numeric_limits<uint64_t>::max() / elem ||
        nbytes != static_cast<uint64_t>(numel) * elem)
      throw CheckpointError(path + ": size mismatch in " + name);
    r.need(nbytes);
    auto t = torch::empty(sizes, torch::dtype(type));
    if (nbytes > 0) std::memcpy(t.data_ptr(), body.data() + r.off, nbytes);
    r.off += nbytes;
    out[name] = t;
  }
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
