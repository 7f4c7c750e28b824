// edit-data: make, inspect and read token files with the byte-level tokenizer.
//   edit-data encode --in TEXT --train OUT.bin --val OUT.bin [--val-fraction 0.05]
//                    [--format llmc16|llmc32|nanogpt]
//   edit-data info FILE
//   edit-data decode FILE [--offset K] [--count N]
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "data/data.h"

namespace {

using edit::data::ByteTokenizer;
using edit::data::DataError;
using edit::data::TokenFile;
using edit::data::TokenFormat;

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

const char* kUsage =
    "usage:\n"
    "  edit-data encode --in TEXT --train OUT.bin --val OUT.bin [--val-fraction 0.05]\n"
    "                   [--format llmc16|llmc32|nanogpt]\n"
    "  edit-data info FILE\n"
    "  edit-data decode FILE [--offset K] [--count N]\n";

// "--name value" pairs after the subcommand; positional arguments kept in order.
struct Args {
  std::map<std::string, std::string> opts;
  std::vector<std::string> positional;
  Args(int argc, char** argv, int first) {
    for (int i = first; i < argc; ++i) {
      std::string a = argv[i];
      if (a.rfind("--", 0) == 0) {
        size_t eq = a.find('=');
        if (eq != std::string::npos) {
          opts[a.substr(2, eq - 2)] = a.substr(eq + 1);
        } else {
          if (i + 1 >= argc) throw UsageError(a + " needs a value");
          opts[a.substr(2)] = argv[++i];
        }
      } else {
        positional.push_back(a);
      }
    }
  }
  std::string get(const std::string& k, const std::string& def = "") const {
    auto it = opts.find(k);
    return it == opts.end() ? def : it->second;
  }
  void allow(const std::vector<std::string>& known) const {
    for (auto& [k, v] : opts) {
      bool ok = false;
      for (auto& n : known) ok = ok || n == k;
      if (!ok) throw UsageError("unknown option --" + k);
    }
  }
};

TokenFormat parseFormat(const std::string& s) {
  if (s == "llmc16") return TokenFormat::LlmcU16;
  if (s == "llmc32") return TokenFormat::LlmcU32;
  if (s == "nanogpt") return TokenFormat::NanoGptU16;
  throw UsageError("--format must be llmc16, llmc32 or nanogpt (got \"" + s + "\")");
}

const char* formatName(TokenFormat f) {
  switch (f) {
    case TokenFormat::LlmcU16: return "llmc16 (llm.c header, uint16 tokens)";
    case TokenFormat::LlmcU32: return "llmc32 (llm.c header, uint32 tokens)";
    case TokenFormat::NanoGptU16: return "nanogpt (headerless uint16 tokens)";
  }
  return "?";
}

uint64_t parseCount(const std::string& name, const std::string& s) {
  char* end = nullptr;
  errno = 0;
  unsigned long long v = std::strtoull(s.c_str(), &end, 10);
  if (s.empty() || s[0] == '-' || *end || errno) throw UsageError("--" + name + " must be a non-negative integer");
  return v;
}

int encode(const Args& a) {
  a.allow({"in", "train", "val", "val-fraction", "format"});
  const std::string in = a.get("in"), train = a.get("train"), val = a.get("val");
  if (in.empty() || train.empty()) throw UsageError("encode needs --in and --train");
  char* end = nullptr;
  const std::string fracText = a.get("val-fraction", "0.05");
  const double frac = std::strtod(fracText.c_str(), &end);
  if (fracText.empty() || *end || !(frac >= 0 && frac < 1))
    throw UsageError("--val-fraction must be a number in [0, 1) (got \"" + fracText + "\")");
  if (frac > 0 && val.empty()) throw UsageError("encode needs --val (or --val-fraction 0)");
  const TokenFormat format = parseFormat(a.get("format", "llmc16"));

  std::ifstream f(in, std::ios::binary);
  if (!f) throw DataError(in + ": cannot open the input text");
  std::ostringstream ss;
  ss << f.rdbuf();
  const std::string text = ss.str();
  if (text.empty()) throw DataError(in + ": the input text is empty");

  // Split at the first line boundary after (1 - frac) of the text, so no line is cut.
  size_t split = text.size();
  if (frac > 0) {
    size_t target = static_cast<size_t>(static_cast<double>(text.size()) * (1.0 - frac));
    size_t nl = text.find('\n', target);
    split = nl == std::string::npos ? target : nl + 1;
    if (split == 0 || split >= text.size())
      throw DataError(in + ": too short to split off a validation part of " + fracText);
  }
  const auto trainTokens = ByteTokenizer::encode(text.substr(0, split));
  edit::data::writeTokenFile(train, trainTokens, format);
  std::cout << "train: " << trainTokens.size() << " tokens -> " << train << "\n";
  if (frac > 0) {
    const auto valTokens = ByteTokenizer::encode(text.substr(split));
    edit::data::writeTokenFile(val, valTokens, format);
    std::cout << "val: " << valTokens.size() << " tokens -> " << val << "\n";
  }
  return 0;
}

int info(const Args& a) {
  a.allow({});
  if (a.positional.size() != 1) throw UsageError("info takes one FILE");
  const TokenFile f = TokenFile::open(a.positional[0]);
  std::cout << "file: " << f.path() << "\n"
            << "format: " << formatName(f.format()) << "\n"
            << "tokens: " << f.size() << "\n"
            << "max token: " << (f.size() ? std::to_string(f.maxToken()) : "-") << "\n";
  return 0;
}

int decode(const Args& a) {
  a.allow({"count", "offset"});
  if (a.positional.size() != 1) throw UsageError("decode takes one FILE");
  const TokenFile f = TokenFile::open(a.positional[0]);
  const uint64_t offset = a.opts.count("offset") ? parseCount("offset", a.get("offset")) : 0;
  if (offset > f.size()) throw DataError(f.path() + ": --offset past the end (" + std::to_string(f.size()) + " tokens)");
  uint64_t count = f.size() - offset;
  if (a.opts.count("count")) count = std::min<uint64_t>(count, parseCount("count", a.get("count")));
  std::vector<uint32_t> toks(count);
  for (uint64_t i = 0; i < count; ++i) toks[i] = f.at(offset + i);
  const std::string text = ByteTokenizer::decode(toks);
  std::fwrite(text.data(), 1, text.size(), stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string cmd = argv[1];
  try {
    Args args(argc, argv, 2);
    if (cmd == "encode") return encode(args);
    if (cmd == "info") return info(args);
    if (cmd == "decode") return decode(args);
    throw UsageError("unknown command \"" + cmd + "\"");
  } catch (const UsageError& e) {
    std::cerr << "edit-data: " << e.what() << "\n" << kUsage;
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "edit-data: " << e.what() << "\n";
    return 1;
  }
}
