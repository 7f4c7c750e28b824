#include "util/log.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <iostream>
#include <mutex>
#include <stdexcept>

namespace edit::op::log {
namespace {
std::atomic<int> g_level{static_cast<int>(Level::Info)};
std::mutex g_mu;

const char* levelName(Level l) {
  switch (l) {
    case Level::Debug: return "debug";
    case Level::Info: return "info";
    case Level::Warn: return "warn";
    default: return "error";
  }
}
}  // namespace

void setLevel(Level level) { g_level = static_cast<int>(level); }

Level parseLevel(const std::string& name) {
  if (name == "debug") return Level::Debug;
  if (name == "info") return Level::Info;
  if (name == "warn" || name == "warning") return Level::Warn;
  if (name == "error") return Level::Error;
  throw std::invalid_argument("--log-level must be debug, info, warn or error, got '" + name + "'");
}

bool enabled(Level level) { return static_cast<int>(level) >= g_level.load(); }

void write(Level level, const std::string& msg, const nlohmann::json& fields) {
  if (!enabled(level)) return;
  auto now = std::chrono::system_clock::now();
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count();
  std::time_t secs = static_cast<std::time_t>(ms / 1000);
  char frac[8];
  std::snprintf(frac, sizeof frac, ".%03dZ", static_cast<int>(ms % 1000));
  std::string ts = rfc3339(secs);
  ts.pop_back();  // drop 'Z', add milliseconds
  nlohmann::json line = {{"ts", ts + frac}, {"level", levelName(level)}, {"msg", msg}};
  if (fields.is_object())
    for (auto it = fields.begin(); it != fields.end(); ++it) line[it.key()] = it.value();
  std::string text = line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  std::lock_guard<std::mutex> lock(g_mu);
  std::fwrite(text.data(), 1, text.size(), stderr);
  std::fflush(stderr);
}

std::string rfc3339(std::time_t t) {
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string nowRfc3339() { return rfc3339(std::time(nullptr)); }

std::time_t parseRfc3339(const std::string& s) {
  std::tm tm{};
  if (s.size() < 19) return 0;
  if (std::sscanf(s.c_str(), "%d-%d-%dT%d:%d:%d", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour,
                  &tm.tm_min, &tm.tm_sec) != 6)
    return 0;
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  return timegm(&tm);
}

}  // namespace edit::op::log
