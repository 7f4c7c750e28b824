#include "train/snapshot_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace edit {

namespace {

std::runtime_error ioError(const std::string& what, const std::string& dir) {
  return std::runtime_error("runtime.recoverySnapshotDir " + dir + ": " + what + ": " + std::strerror(errno));
}

}  // namespace

SnapshotFile::SnapshotFile(const std::string& dir) : dir_(dir) {
  std::string path = dir + "/edit-snapshot-XXXXXX";
  fd_ = ::mkstemp(path.data());
  if (fd_ < 0) throw ioError("cannot create a file there (an existing, writable directory on disk)", dir);
  ::unlink(path.c_str());
}

SnapshotFile::~SnapshotFile() {
  if (fd_ >= 0) ::close(fd_);
}

void SnapshotFile::save(const std::vector<OuterUnit>& outer) {
  off_t off = 0;
  for (const auto& o : outer) {
    for (const auto* t : {&o.outer, &o.momentum}) {
      const auto host = t->to(torch::kCPU).contiguous();
      const char* p = static_cast<const char*>(host.data_ptr());
      size_t left = host.numel() * host.element_size();
      while (left > 0) {
        const ssize_t n = ::pwrite(fd_, p, left, off);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) throw ioError("writing the recovery snapshot failed", dir_);
        p += n, left -= static_cast<size_t>(n), off += n;
      }
    }
  }
}

void SnapshotFile::load(std::vector<OuterUnit>& outer) const {
  off_t off = 0;
  for (auto& o : outer) {
    for (auto* t : {&o.outer, &o.momentum}) {
      auto host = torch::empty(t->sizes(), t->options().device(torch::kCPU));
      char* p = static_cast<char*>(host.data_ptr());
      size_t left = host.numel() * host.element_size();
      while (left > 0) {
        const ssize_t n = ::pread(fd_, p, left, off);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) throw ioError("reading the recovery snapshot back failed", dir_);
        p += n, left -= static_cast<size_t>(n), off += n;
      }
      t->copy_(host);
    }
  }
}

}  // namespace edit
