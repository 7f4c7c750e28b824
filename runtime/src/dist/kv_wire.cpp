#include "dist/kv_wire.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

namespace edit::kv {

Bytes frame(const Bytes& body) {
  Writer w;
  w.u32(static_cast<uint32_t>(body.size()));
  w.b.insert(w.b.end(), body.begin(), body.end());
  return w.b;
}

std::string printable(const std::string& s, size_t max) {
  std::string out;
  for (size_t i = 0; i < s.size() && i < max; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      static const char* hex = "0123456789abcdef";
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  if (s.size() > max) out += "...(" + std::to_string(s.size()) + " bytes)";
  return out;
}

std::string keyList(const std::vector<std::string>& keys) {
  std::string s;
  for (size_t i = 0; i < keys.size() && i < 8; ++i) s += (i ? ", " : "") + printable(keys[i]);
  if (keys.size() > 8) s += ", and " + std::to_string(keys.size() - 8) + " more";
  return "[" + s + "]";
}

Clock::time_point deadlineAfter(int64_t ms, Clock::time_point now) {
  constexpr int64_t kYear = int64_t{365} * 24 * 3600 * 1000;
  return ms <= 0 || ms > kYear ? Clock::time_point::max() : now + std::chrono::milliseconds(ms);
}

void setNoDelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

}  // namespace edit::kv
