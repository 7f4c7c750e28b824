// The safetensors file format (Hugging Face's; what transformers' from_pretrained and
// safetensors.torch.load_file read), written and read without the safetensors package:
//
//   u64 little-endian N | N bytes of JSON header, padded with spaces | raw tensor bytes
//
// The header maps each tensor name to {"dtype": "F32"|"BF16"|..., "shape": [...],
// "data_offsets": [begin, end]} (offsets relative to the first byte after the header) and
// may hold "__metadata__": a string -> string map. The tensors tile the data section with
// no gaps or overlaps (the reference reader rejects holes). Tensor bytes are little-endian,
// row-major.
//
// We pad the header to a multiple of 8 and place tensors by decreasing element size, so
// every tensor starts at an offset that is a multiple of its element size (readers may
// map the file and view tensors in place).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace edit::st {

// A malformed file or an impossible request; the message names the file or tensor.
struct FormatError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

enum class DType { F64, F32, F16, BF16, I64, I32 };

const char* dtypeName(DType d);           // "F32", "BF16", ... as in the header
size_t dtypeSize(DType d);
bool parseDType(const std::string& name, DType& out);  // false for names we do not read
torch::ScalarType scalarType(DType d);

// The reference implementation refuses headers above 100 MB; so do we, both ways.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

struct Entry {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte offsets in the data section
};

struct Header {
  std::vector<Entry> entries;  // in data order
  std::map<std::string, std::string> metadata;
  uint64_t headerBytes = 0;    // N: the JSON text including padding
  uint64_t dataBytes = 0;
};

// A tensor to write: a CPU tensor of any dtype, stored as `dtype` (converted with
// PyTorch's rounding: round to nearest even for BF16).
struct Item {
  std::string name;
  torch::Tensor tensor;
  DType dtype = DType::F32;
};

// The header that writeFile writes for these items: JSON padded with spaces to a
// multiple of 8 bytes (without the 8-byte length prefix), and the entries in data order.
// Throws FormatError for an empty or duplicate name, "__metadata__" as a tensor name or
// an unsupported conversion.
std::string buildHeader(const std::vector<Item>& items,
                        const std::map<std::string, std::string>& metadata,
                        std::vector<Entry>* layout = nullptr);

// Writes the file atomically: a temporary file in the same directory, streamed tensor by
// tensor (no copy of the whole file in memory), fsync, rename, fsync of the directory.
// Returns the file's size in bytes. I/O failures throw std::runtime_error naming the path.
uint64_t writeFile(const std::string& path, const std::vector<Item>& items,
                   const std::map<std::string, std::string>& metadata);

// Parses and validates a header from the first bytes of a file of `fileSize` bytes
// (`bytes` holds at least the 8-byte prefix; the whole header when it is long enough).
// Checks: the length fits the file and the limit, the JSON is an object of well-formed
// entries with known dtypes, every byte range matches its dtype and shape, the ranges
// tile the data section exactly. `what` names the file in errors.
Header parseHeader(const std::string& bytes, uint64_t fileSize, const std::string& what);

// Reads a whole file: its header and every tensor in its stored dtype (BF16 stays
// kBFloat16). Throws FormatError naming the file.
Header readFile(const std::string& path, std::map<std::string, torch::Tensor>& tensors);

}  // namespace edit::st
