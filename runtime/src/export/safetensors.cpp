#include "export/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.cpp writes tensors as they lie in memory: little-endian hosts only"
#endif

namespace edit::st {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {
struct DTypeInfo {
  DType d;
  const char* name;
  size_t size;
  torch::ScalarType type;
};
const DTypeInfo kDTypes[] = {
    {DType::F64, "F64", 8, torch::kFloat64}, {DType::F32, "F32", 4, torch::kFloat32},
    {DType::F16, "F16", 2, torch::kFloat16}, {DType::BF16, "BF16", 2, torch::kBFloat16},
    {DType::I64, "I64", 8, torch::kInt64},   {DType::I32, "I32", 4, torch::kInt32},
};
const DTypeInfo& info(DType d) {
  for (const auto& i : kDTypes)
    if (i.d == d) return i;
  throw FormatError("unknown dtype");
}
}  // namespace

const char* dtypeName(DType d) { return info(d).name; }
size_t dtypeSize(DType d) { return info(d).size; }
torch::ScalarType scalarType(DType d) { return info(d).type; }
bool parseDType(const std::string& name, DType& out) {
  for (const auto& i : kDTypes)
    if (name == i.name) {
      out = i.d;
      return true;
    }
  return false;
}

namespace {

// Items in data order: larger elements first keeps every offset a multiple of the
// element size (all sizes are powers of two); stable, so the caller's order otherwise.
std::vector<size_t> dataOrder(const std::vector<Item>& items) {
  std::vector<size_t> order(items.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return dtypeSize(items[a].dtype) > dtypeSize(items[b].dtype);
  });
  return order;
}

torch::Tensor converted(const Item& it) {
  const auto target = scalarType(it.dtype);
  if (it.tensor.is_floating_point() != c10::isFloatingType(target))
    throw FormatError(it.name + ": cannot store a " + std::string(c10::toString(it.tensor.scalar_type())) +
                      " tensor as " + dtypeName(it.dtype));
  return it.tensor.detach().to(torch::kCPU).to(target).contiguous();
}

}  // namespace

std::string buildHeader(const std::vector<Item>& items,
                        const std::map<std::string, std::string>& metadata,
                        std::vector<Entry>* layout) {
  json h = json::object();
  if (!metadata.empty()) {
    json m = json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    h["__metadata__"] = m;
  }
  std::set<std::string> seen;
  uint64_t off = 0;
  std::vector<Entry> entries;
  for (size_t i : dataOrder(items)) {
    const Item& it = items[i];
    if (it.name.empty() || it.name == "__metadata__")
      throw FormatError("invalid tensor name \"" + it.name + "\"");
    if (!seen.insert(it.name).second) throw FormatError("duplicate tensor name " + it.name);
    Entry e;
    e.name = it.name;
    e.dtype = it.dtype;
    e.shape.assign(it.tensor.sizes().begin(), it.tensor.sizes().end());
    e.begin = off;
    e.end = off + static_cast<uint64_t>(it.tensor.numel()) * dtypeSize(it.dtype);
    off = e.end;
    h[it.name] = {{"dtype", dtypeName(it.dtype)},
                  {"shape", e.shape},
                  {"data_offsets", {e.begin, e.end}}};
    entries.push_back(std::move(e));
  }
  std::string text = h.dump();
  // Pad with spaces (JSON whitespace) so the data section starts 8-byte aligned.
  text.append((8 - text.size() % 8) % 8, ' ');
  if (text.size() > kMaxHeaderBytes)
    throw FormatError("safetensors header of " + std::to_string(text.size()) +
                      " bytes exceeds the format's limit of 100 MB (too many tensors)");
  if (layout) *layout = std::move(entries);
  return text;
}

namespace {
void writeAll(int fd, const void* data, size_t n, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      throw std::runtime_error("cannot write " + path + ": " + std::strerror(errno));
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}
}  // namespace

uint64_t writeFile(const std::string& path, const std::vector<Item>& items,
                   const std::map<std::string, std::string>& metadata) {
  std::vector<Entry> layout;
  const std::string header = buildHeader(items, metadata, &layout);
  std::map<std::string, const Item*> byName;
  for (const auto& it : items) byName[it.name] = &it;

  const fs::path target(path);
  const fs::path dir = target.parent_path().empty() ? fs::path(".") : target.parent_path();
  const std::string tmp =
      (dir / ("." + target.filename().string() + ".tmp-" + std::to_string(::getpid()))).string();
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw std::runtime_error("cannot create " + tmp + ": " + std::strerror(errno));
  try {
    const uint64_t n = header.size();
    writeAll(fd, &n, sizeof(n), tmp);
    writeAll(fd, header.data(), header.size(), tmp);
    for (const auto& e : layout) {
      const auto t = converted(*byName.at(e.name));
      writeAll(fd, t.data_ptr(), t.nbytes(), tmp);
    }
    if (::fsync(fd) != 0) throw std::runtime_error("cannot sync " + tmp + ": " + std::strerror(errno));
    if (::close(fd) != 0) {
      fd = -1;
      throw std::runtime_error("cannot close " + tmp + ": " + std::strerror(errno));
    }
    fd = -1;
    if (::rename(tmp.c_str(), path.c_str()) != 0)
      throw std::runtime_error("cannot rename " + tmp + " to " + path + ": " + std::strerror(errno));
  } catch (...) {
    if (fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  if (int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY); dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return 8 + header.size() + (layout.empty() ? 0 : layout.back().end);
}

Header parseHeader(const std::string& bytes, uint64_t fileSize, const std::string& what) {
  auto bad = [&](const std::string& why) { return FormatError(what + ": " + why); };
  if (fileSize < 8 || bytes.size() < 8) throw bad("shorter than the 8-byte header length (not a safetensors file)");
  Header h;
  std::memcpy(&h.headerBytes, bytes.data(), 8);
  if (h.headerBytes > kMaxHeaderBytes) throw bad("header length " + std::to_string(h.headerBytes) + " exceeds 100 MB");
  if (8 + h.headerBytes > fileSize) throw bad("header length " + std::to_string(h.headerBytes) + " runs past the end of the file (truncated?)");
  if (bytes.size() < 8 + h.headerBytes) throw bad("header not fully read");
  h.dataBytes = fileSize - 8 - h.headerBytes;
  json j;
  try {
    j = json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<std::ptrdiff_t>(h.headerBytes));
  } catch (const json::exception& e) {
    throw bad(std::string("header is not valid JSON: ") + e.what());
  }
  if (!j.is_object()) throw bad("header is not a JSON object");
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) throw bad("__metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) throw bad("__metadata__." + m.key() + " is not a string");
        h.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets"))
      throw bad(name + ": needs dtype, shape and data_offsets");
    Entry e;
    e.name = name;
    if (!v["dtype"].is_string() || !parseDType(v["dtype"].get<std::string>(), e.dtype))
      throw bad(name + ": unsupported dtype " + v["dtype"].dump());
    if (!v["shape"].is_array()) throw bad(name + ": shape is not an array");
    uint64_t numel = 1;
    for (const auto& d : v["shape"]) {
      if (!d.is_number_unsigned()) throw bad(name + ": shape holds " + d.dump());
      const uint64_t n = d.get<uint64_t>();
      if (n > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
          (n > 0 && numel > std::numeric_limits<uint64_t>::max() / n))
        throw bad(name + ": shape overflows");
      numel *= n;
      e.shape.push_back(static_cast<int64_t>(n));
    }
    const json& o = v["data_offsets"];
    if (!o.is_array() || o.size() != 2 || !o[0].is_number_unsigned() || !o[1].is_number_unsigned())
      throw bad(name + ": data_offsets must be [begin, end]");
    e.begin = o[0].get<uint64_t>();
    e.end = o[1].get<uint64_t>();
    const uint64_t size = dtypeSize(e.dtype);
    if (e.end < e.begin || numel > std::numeric_limits<uint64_t>::max() / size ||
        e.end - e.begin != numel * size)
      throw bad(name + ": data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
                "] do not hold " + std::to_string(numel) + " " + dtypeName(e.dtype) + " values");
    h.entries.push_back(std::move(e));
  }
  std::sort(h.entries.begin(), h.entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t off = 0;
  for (const auto& e : h.entries) {
    if (e.begin != off)
      throw bad(e.name + ": starts at byte " + std::to_string(e.begin) + ", expected " + std::to_string(off) +
                " (tensors must tile the data section without gaps or overlaps)");
    off = e.end;
  }
  if (off != h.dataBytes)
    throw bad("tensors cover " + std::to_string(off) + " bytes but the data section has " +
              std::to_string(h.dataBytes) + " (truncated or trailing bytes)");
  return h;
}

Header readFile(const std::string& path, std::map<std::string, torch::Tensor>& tensors) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw FormatError(path + ": cannot open");
  std::error_code ec;
  const uint64_t size = fs::file_size(path, ec);
  if (ec) throw FormatError(path + ": cannot stat: " + ec.message());
  std::string head(8, '\0');
  in.read(head.data(), 8);
  if (size >= 8 && in) {
    uint64_t n = 0;
    std::memcpy(&n, head.data(), 8);
    if (n <= kMaxHeaderBytes && 8 + n <= size) {
      head.resize(8 + n);
      in.read(head.data() + 8, static_cast<std::streamsize>(n));
    }
  }
  Header h = parseHeader(head, size, path);
  tensors.clear();
  for (const auto& e : h.entries) {
    auto t = torch::empty(e.shape, torch::dtype(scalarType(e.dtype)));
    in.seekg(static_cast<std::streamoff>(8 + h.headerBytes + e.begin));
    in.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(e.end - e.begin));
    if (!in) throw FormatError(path + ": cannot read " + e.name);
    tensors[e.name] = t;
  }
  return h;
}

}  // namespace edit::st
