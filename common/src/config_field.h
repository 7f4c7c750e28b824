// The worker configuration's field table, private to common/src: a field's path, type,
// rule and description (config_table.cpp lists them), and how a field parses, checks and
// prints one scalar. worker_config.cpp drives parsing, overrides, validation and the
// schema from the table.
#pragma once

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "worker_config.h"

namespace edit::config {

constexpr int64_t kI64Max = std::numeric_limits<int64_t>::max();
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr size_t kMaxPath = 4096;  // file paths, addresses, tokens
constexpr size_t kMaxHost = 253;   // DNS name limit

enum class Kind { I64, I32, U64, F64, Bool, Str, Enum };

// How an enumeration field reads and writes its member (an enum class whose enumerators
// are the indices of its names, worker_config.h's EnumNames).
struct EnumAccess {
  int (*get)(const void*) = nullptr;
  void (*set)(void*, int) = nullptr;
};
template <class E>
EnumAccess enumAccess() {
  return {[](const void* p) { return static_cast<int>(*static_cast<const E*>(p)); },
          [](void* p, int i) { *static_cast<E*>(p) = static_cast<E>(i); }};
}

// What a value must be. Numbers: [lo, hi] with optional open ends; strings: a length cap,
// optionally non-empty or one of `choices`.
struct Rule {
  int64_t ilo = std::numeric_limits<int64_t>::min(), ihi = kI64Max;
  double dlo = -kInf, dhi = kInf;
  bool loOpen = false, hiOpen = false;
  size_t maxLen = kMaxPath;
  bool nonEmpty = false;
  bool secret = false;  // never echo the value in an error
  std::vector<std::string> choices;
  std::string text;     // the allowed values in words, when the range alone says it wrong
};

inline Rule ints(int64_t lo, int64_t hi = kI64Max) { return Rule{lo, hi}; }
inline Rule nums(double lo, double hi, bool loOpen, bool hiOpen) {
  return Rule{std::numeric_limits<int64_t>::min(), kI64Max, lo, hi, loOpen, hiOpen};
}
inline Rule positive() { return nums(0, kInf, true, false); }
inline Rule nonNegative() { return nums(0, kInf, false, false); }
inline Rule str(size_t maxLen, bool nonEmpty = false, bool secret = false) {
  Rule r;
  std::tie(r.maxLen, r.nonEmpty, r.secret) = std::make_tuple(maxLen, nonEmpty, secret);
  return r;
}
inline Rule oneOf(const std::vector<std::string>& c) {
  Rule r;
  r.choices = c;
  return r;
}
inline Rule none() { return Rule{}; }

// "a.b.c" -> {"a", "b", "c"}
inline std::vector<std::string> splitPath(const std::string& path) {
  std::vector<std::string> segs;
  size_t start = 0, dot;
  while ((dot = path.find('.', start)) != std::string::npos) {
    segs.push_back(path.substr(start, dot - start));
    start = dot + 1;
  }
  segs.push_back(path.substr(start));
  return segs;
}

inline std::string join(const std::vector<std::string>& v, const char* sep = ", ") {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? sep : "") + v[i];
  return out;
}

inline std::string fmtDouble(double v) {
  // Shortest text that reads back as the same double (round-trip through toYaml).
  char buf[64];
  for (int prec = 6; prec <= 17; ++prec) {
    std::snprintf(buf, sizeof buf, "%.*g", prec, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  std::string s = buf;
  // Keep a float looking like a float to YAML readers ("1" would read back as an int).
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}

struct Field {
  std::string path;
  Kind kind;
  void* ptr;
  Rule rule;
  const char* doc;  // the description users read (--print-schema, the CRD)
  EnumAccess enumerated{};  // Kind::Enum: rule.choices are the enumerators' names

  std::string describe() const {
    if (!rule.text.empty()) return rule.text;
    auto bound = [](double v) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%g", v);
      return std::string(buf);
    };
    switch (kind) {
      case Kind::Bool: return "true or false";
      case Kind::U64: return "a non-negative integer";
      case Kind::I64:
      case Kind::I32:
        if (rule.ihi == kI64Max) return "an integer >= " + std::to_string(rule.ilo);
        return "an integer in [" + std::to_string(rule.ilo) + ", " + std::to_string(rule.ihi) + "]";
      case Kind::F64: {
        bool hasLo = std::isfinite(rule.dlo), hasHi = std::isfinite(rule.dhi);
        if (hasLo && !hasHi) return std::string("a number ") + (rule.loOpen ? "> " : ">= ") + bound(rule.dlo);
        if (!hasLo && hasHi) return std::string("a number ") + (rule.hiOpen ? "< " : "<= ") + bound(rule.dhi);
        if (!hasLo && !hasHi) return "a finite number";
        return std::string("a number in ") + (rule.loOpen ? "(" : "[") + bound(rule.dlo) + ", " +
               bound(rule.dhi) + (rule.hiOpen ? ")" : "]");
      }
      case Kind::Enum:
      case Kind::Str:
        if (!rule.choices.empty()) return "one of " + join(rule.choices);
        return std::string(rule.nonEmpty ? "a non-empty" : "a") + " string of at most " +
               std::to_string(rule.maxLen) + " characters";
    }
    return "";
  }

  [[noreturn]] void fail(const std::string& got) const {
    throw ConfigError(path + ": must be " + describe() + " (got " + got + ")");
  }
  std::string quoted(const std::string& raw) const {
    if (rule.secret) return "<hidden>";
    std::string shown = raw.size() > 64 ? raw.substr(0, 64) + "...(" + std::to_string(raw.size()) + " characters)" : raw;
    return "\"" + shown + "\"";
  }

  // Parses scalar text into the field, checking type and range.
  void set(const std::string& raw) const {
    switch (kind) {
      case Kind::Bool: {
        std::string t;
        for (char c : raw) t += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        if (t == "true" || t == "yes" || t == "on") *static_cast<bool*>(ptr) = true;
        else if (t == "false" || t == "no" || t == "off") *static_cast<bool*>(ptr) = false;
        else fail(quoted(raw));
        return;
      }
      case Kind::U64: {
        errno = 0;
        char* end = nullptr;
        unsigned long long v = std::strtoull(raw.c_str(), &end, 10);
        if (raw.empty() || raw[0] == '-' || raw[0] == ' ' || *end || errno) fail(quoted(raw));
        *static_cast<uint64_t*>(ptr) = v;
        return;
      }
      case Kind::I64:
      case Kind::I32: {
        errno = 0;
        char* end = nullptr;
        long long v = std::strtoll(raw.c_str(), &end, 10);
        if (raw.empty() || *end || errno) {
          // Accept integral floats such as 1e6, nothing fractional.
          errno = 0;
          double d = std::strtod(raw.c_str(), &end);
          if (raw.empty() || *end || errno || !std::isfinite(d) || d != std::floor(d) ||
              std::fabs(d) > 9.0e18)
            fail(quoted(raw));
          v = static_cast<long long>(d);
        }
        if (v < rule.ilo || v > rule.ihi) fail(quoted(raw));
        if (kind == Kind::I32) *static_cast<int*>(ptr) = static_cast<int>(v);
        else *static_cast<int64_t*>(ptr) = v;
        return;
      }
      case Kind::F64: {
        errno = 0;
        char* end = nullptr;
        double d = std::strtod(raw.c_str(), &end);
        if (raw.empty() || *end || errno == ERANGE || !std::isfinite(d) || !inRange(d)) fail(quoted(raw));
        *static_cast<double*>(ptr) = d;
        return;
      }
      case Kind::Str: {
        if (raw.size() > rule.maxLen) fail(rule.secret ? "<hidden>" : std::to_string(raw.size()) + " characters");
        if (rule.nonEmpty && raw.empty()) fail("an empty string");
        if (!rule.choices.empty() && std::find(rule.choices.begin(), rule.choices.end(), raw) == rule.choices.end())
          fail(quoted(raw));
        *static_cast<std::string*>(ptr) = raw;
        return;
      }
      case Kind::Enum: {
        const auto it = std::find(rule.choices.begin(), rule.choices.end(), raw);
        if (it == rule.choices.end()) fail(quoted(raw));
        enumerated.set(ptr, static_cast<int>(it - rule.choices.begin()));
        return;
      }
    }
  }

  bool inRange(double d) const {
    return (rule.loOpen ? d > rule.dlo : d >= rule.dlo) && (rule.hiOpen ? d < rule.dhi : d <= rule.dhi);
  }

  // Current value as scalar text (what set() accepts).
  std::string text() const {
    switch (kind) {
      case Kind::Bool: return *static_cast<bool*>(ptr) ? "true" : "false";
      case Kind::U64: return std::to_string(*static_cast<uint64_t*>(ptr));
      case Kind::I64: return std::to_string(*static_cast<int64_t*>(ptr));
      case Kind::I32: return std::to_string(*static_cast<int*>(ptr));
      case Kind::F64: return fmtDouble(*static_cast<double*>(ptr));
      case Kind::Str: return *static_cast<std::string*>(ptr);
      case Kind::Enum: return rule.choices.at(static_cast<size_t>(enumerated.get(ptr)));
    }
    return "";
  }

  // Re-checks a value set in code (validate() on a Config built without the parser):
  // text() is exact, so parsing it back applies the same rule to the same value.
  void check() const { set(text()); }
};

// Every key of the file, in the order they are applied and emitted (config_table.cpp).
std::vector<Field> fieldsOf(Config& c);

// Each section's description and the cross-field rules the runtime checks in validate(),
// as the CEL rules the CRD must carry (config_table.cpp).
struct SectionDoc {
  const char* path;
  const char* doc;
  std::vector<std::pair<const char*, const char*>> rules;  // (CEL, message)
};
const std::vector<SectionDoc>& sectionDocs();

// Sizes a preset sets (applyModelPreset): no schema default, or it would override the preset.
bool presetFilled(const std::string& path);

// The model presets, in the order --print-schema lists them.
const std::vector<std::string>& presetNames();

}  // namespace edit::config
