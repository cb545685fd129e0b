// Safetensors files (https://huggingface.co/docs/safetensors):
//
//   [8 bytes] N, little-endian u64: length of the JSON header
//   [N bytes] JSON: {"__metadata__": {str: str}, name: {"dtype": "F32",
//             "shape": [..], "data_offsets": [begin, end]}, ...}
//             padded with spaces to a multiple of 8
//   [...]     data; offsets are relative to the end of the header
//
// The reader checks everything it can and says what is wrong: a header that
// runs past the file, bad JSON, unknown dtypes, a shape that disagrees with
// the byte range, ranges out of bounds, overlapping or leaving holes.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "coremesh/core/file.hpp"
#include "coremesh/core/tensor.hpp"

namespace coremesh::train {

struct SafetensorsFile {
  // Tensor names in file order (sorted by data offset).
  std::vector<std::string> names;
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> metadata;

  const Tensor& at(const std::string& name) const;
  bool contains(const std::string& name) const { return tensors.count(name) != 0; }
};

// "F32", "BF16", "F8_E4M3", "F8_E5M2", "I32", "I64".
std::string safetensors_dtype(DType dtype);
DType parse_safetensors_dtype(const std::string& name);

// Serializes to bytes; tensors are written in the order given (any view is
// made contiguous).
std::string safetensors_serialize(const std::vector<std::pair<std::string, Tensor>>& tensors,
                                  const std::map<std::string, std::string>& metadata = {});
// Parses bytes; `what` names the source in error messages.
SafetensorsFile safetensors_parse(const char* data, size_t size, const std::string& what);

// Reads a file (memory-mapped; tensors are copied out, 64-byte aligned).
SafetensorsFile read_safetensors(const std::string& path);
// Writes atomically: a temporary file in the same directory, fsync, rename
// over `path`, fsync of the directory. On failure `path` is untouched.
void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

using coremesh::write_file_atomic;  // core/file.hpp: the mechanism write_safetensors uses

}  // namespace coremesh::train
