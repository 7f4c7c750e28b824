// Structured logging: one JSON object per line on stderr (ts, level, msg, extra fields).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace edit::op::log {

enum class Level { Debug = 0, Info = 1, Warn = 2, Error = 3 };

void setLevel(Level level);
Level parseLevel(const std::string& name);  // debug|info|warn|error; throws on others
bool enabled(Level level);

// Writes {"ts":..., "level":..., "msg":..., <fields>} atomically (one write per line).
void write(Level level, const std::string& msg, const nlohmann::json& fields = nlohmann::json::object());

inline void debug(const std::string& m, const nlohmann::json& f = nlohmann::json::object()) { write(Level::Debug, m, f); }
inline void info(const std::string& m, const nlohmann::json& f = nlohmann::json::object()) { write(Level::Info, m, f); }
inline void warn(const std::string& m, const nlohmann::json& f = nlohmann::json::object()) { write(Level::Warn, m, f); }
inline void error(const std::string& m, const nlohmann::json& f = nlohmann::json::object()) { write(Level::Error, m, f); }

// RFC 3339 UTC timestamp with seconds precision, the format Kubernetes uses in objects.
std::string rfc3339(std::time_t t);
std::string nowRfc3339();
// Parses "2026-01-02T03:04:05Z" (fractions ignored); returns 0 on failure.
std::time_t parseRfc3339(const std::string& s);

}  // namespace edit::op::log
