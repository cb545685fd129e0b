#include "coremesh/train/safetensors.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "coremesh/core/error.hpp"

namespace coremesh::train {
namespace fs = std::filesystem;

const Tensor& SafetensorsFile::at(const std::string& name) const {
  auto it = tensors.find(name);
  CM_CHECK(it != tensors.end(), "check the tensor name (see names)",
           "tensor '{}' is not in the file", name);
  return it->second;
}

std::string safetensors_dtype(DType dtype) {
  switch (dtype) {
    case DType::f32: return "F32";
    case DType::bf16: return "BF16";
    case DType::f8e4m3: return "F8_E4M3";
    case DType::f8e5m2: return "F8_E5M2";
    case DType::i32: return "I32";
    case DType::i64: return "I64";
  }
  return "?";
}

DType parse_safetensors_dtype(const std::string& name) {
  for (DType d : {DType::f32, DType::bf16, DType::f8e4m3, DType::f8e5m2, DType::i32, DType::i64})
    if (safetensors_dtype(d) == name) return d;
  CM_THROW(InvalidArgument, "coremesh reads F32, BF16, F8_E4M3, F8_E5M2, I32 and I64",
           "unsupported safetensors dtype '{}'", name);
}

namespace {
// The 8-byte length and the JSON header (padded to 8 bytes) that precede the data.
std::string safetensors_header(const std::vector<std::pair<std::string, Tensor>>& tensors,
                               const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  size_t offset = 0;
  for (const auto& [name, t] : tensors) {
    CM_CHECK(name != "__metadata__" && !header.contains(name), "give every tensor a unique name",
             "duplicate or reserved tensor name '{}'", name);
    header[name] = {{"dtype", safetensors_dtype(t.dtype())},
                    {"shape", t.shape()},
                    {"data_offsets", {offset, offset + t.nbytes()}}};
    offset += t.nbytes();
  }
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');
  std::string out;
  const uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) out.push_back(char((n >> (8 * i)) & 0xff));
  return out + json;
}

// The header, then each tensor's bytes where they lie (views made contiguous
// into `keep`): a file is written without a copy of it in memory.
std::vector<std::string_view> safetensors_pieces(const std::string& header,
                                                 const std::vector<std::pair<std::string, Tensor>>& tensors,
                                                 std::vector<Tensor>& keep) {
  std::vector<std::string_view> pieces{header};
  for (const auto& [name, t] : tensors) {
    keep.push_back(t.is_contiguous() ? t : t.contiguous());
    pieces.emplace_back(static_cast<const char*>(keep.back().raw_data()), keep.back().nbytes());
  }
  return pieces;
}
}  // namespace

std::string safetensors_serialize(const std::vector<std::pair<std::string, Tensor>>& tensors,
                                  const std::map<std::string, std::string>& metadata) {
  const std::string header = safetensors_header(tensors, metadata);
  std::vector<Tensor> keep;
  std::string out;
  for (std::string_view piece : safetensors_pieces(header, tensors, keep)) out += piece;
  return out;
}

namespace {
// Bytes of a damaged file, safe to print: control and non-ASCII bytes as \xNN.
std::string printable(std::string_view text) {
  std::string out;
  for (unsigned char c : text)
    out += c >= 0x20 && c < 0x7f ? std::string(1, char(c)) : fmt::format("\\x{:02x}", c);
  return out;
}
}  // namespace

SafetensorsFile safetensors_parse(const char* data, size_t size, const std::string& what) {
  const char* hint = "the file is damaged or not a safetensors file; use another copy";
  CM_CHECK(size >= 8, hint, "{}: {} bytes is too short for a safetensors header", what, size);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(uint8_t(data[i])) << (8 * i);
  CM_CHECK(n <= size - 8, hint, "{}: header declares {} bytes but only {} follow (truncated?)",
           what, n, size - 8);
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(data + 8, data + 8 + n);
  } catch (const nlohmann::json::exception& e) {
    CM_THROW(InvalidArgument, hint, "{}: header is not valid JSON: {}", what, printable(e.what()));
  }
  CM_CHECK(header.is_object(), hint, "{}: header is not a JSON object", what);
  const char* base = data + 8 + n;
  const size_t data_size = size - 8 - n;
  SafetensorsFile file;
  std::vector<std::pair<size_t, std::string>> order;
  std::map<std::string, std::pair<size_t, size_t>> ranges;
  try {
    for (const auto& [name, entry] : header.items()) {
      if (name == "__metadata__") {
        for (const auto& [k, v] : entry.items()) {
          CM_CHECK(v.is_string(), hint, "{}: metadata '{}' is not a string", what, k);
          file.metadata[k] = v.get<std::string>();
        }
        continue;
      }
      DType dtype{};
      try {
        dtype = parse_safetensors_dtype(entry.at("dtype").get<std::string>());
      } catch (const InvalidArgument& e) {
        CM_THROW(InvalidArgument, e.hint(), "{}: tensor '{}': {}", what, printable(name), e.message());
      }
      const auto integers = [](const nlohmann::json& a) {  // nlohmann converts 2.5 to 2: integers only
        return a.is_array() && std::all_of(a.begin(), a.end(), [](const nlohmann::json& d) { return d.is_number_integer(); });
      };
      CM_CHECK(integers(entry.at("shape")) && integers(entry.at("data_offsets")), hint,
               "{}: tensor '{}' has a shape or data_offsets that are not lists of integers", what, printable(name));
      Shape shape = entry.at("shape").get<Shape>();
      for (int64_t d : shape) CM_CHECK(d >= 0, hint, "{}: tensor '{}' has a negative dimension", what, name);
      auto offs = entry.at("data_offsets").get<std::vector<size_t>>();
      CM_CHECK(offs.size() == 2 && offs[0] <= offs[1], hint,
               "{}: tensor '{}' has malformed data_offsets", what, name);
      // The byte count in size_t with overflow checks: a product that wraps
      // (shape [2^32, 2^32]) could match an empty range and make a tensor
      // whose shape claims more than its storage holds.
      size_t expect = dtype_size(dtype);
      for (int64_t d : shape)
        CM_CHECK(!__builtin_mul_overflow(expect, size_t(d), &expect), hint,
                 "{}: tensor '{}' of shape {} has more elements than memory can address", what, name,
                 shape_str(shape));
      CM_CHECK(offs[1] - offs[0] == expect, hint,
               "{}: tensor '{}' of shape {} {} needs {} bytes but its range holds {}", what, name,
               shape_str(shape), safetensors_dtype(dtype), expect, offs[1] - offs[0]);
      CM_CHECK(offs[1] <= data_size, hint,
               "{}: tensor '{}' ends at byte {} of a {}-byte data section (truncated?)", what,
               name, offs[1], data_size);
      Tensor t = Tensor::empty(shape, dtype);
      if (expect) std::memcpy(t.raw_data(), base + offs[0], expect);
      file.tensors[name] = t;
      order.emplace_back(offs[0], name);
      ranges[name] = {offs[0], offs[1]};
    }
  } catch (const nlohmann::json::exception& e) {
    CM_THROW(InvalidArgument, hint, "{}: malformed header entry: {}", what, e.what());
  }
  std::sort(order.begin(), order.end());
  size_t cursor = 0;
  for (const auto& [begin, name] : order) {
    CM_CHECK(ranges[name].first == cursor, hint,
             "{}: tensor '{}' starts at byte {} but the previous tensor ends at {} (overlap or hole)",
             what, name, ranges[name].first, cursor);
    cursor = ranges[name].second;
    file.names.push_back(name);
  }
  CM_CHECK(cursor == data_size, hint, "{}: {} bytes of data follow the last tensor", what,
           data_size - cursor);
  return file;
}

SafetensorsFile read_safetensors(const std::string& path) {
  // O_NONBLOCK: a FIFO opens at once (and is refused below) instead of waiting for a writer
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  CM_CHECK(fd >= 0, "check the path", "cannot open '{}': {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    CM_THROW(InvalidArgument, "check the path", "cannot stat '{}'", path);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    CM_THROW(InvalidArgument, "pass a .safetensors file", "'{}' is {}", path,
             S_ISDIR(st.st_mode) ? "a directory" : "not a regular file");
  }
  size_t size = size_t(st.st_size);
  void* map = size ? ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0) : nullptr;
  ::close(fd);
  CM_CHECK(size == 0 || map != MAP_FAILED, "check the file", "cannot map '{}': {}", path,
           std::strerror(errno));
  try {
    SafetensorsFile f = safetensors_parse(static_cast<const char*>(map), size, path);
    if (size) ::munmap(map, size);
    return f;
  } catch (...) {
    if (size) ::munmap(map, size);
    throw;
  }
}

void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  const std::string header = safetensors_header(tensors, metadata);
  std::vector<Tensor> keep;
  write_file_atomic(path, safetensors_pieces(header, tensors, keep));
}

}  // namespace coremesh::train
