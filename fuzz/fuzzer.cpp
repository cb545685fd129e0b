// libFuzzer harness of one bad-input target (CM_FUZZ_TARGET, see
// bad_input.hpp). Built by fuzz/CMakeLists.txt in a clang tree configured with
// -DCOREMESH_FUZZ=ON; run e.g.
//   build-fuzz/fuzz/fuzz_config -max_total_time=60 -timeout=5 \
//     -dict=build-fuzz/fuzz/seeds/config.dict build-fuzz/fuzz/corpus/config build-fuzz/fuzz/seeds/config
// A refusal returns normally; anything else aborts with the input saved.
#include <cstdint>
#include <cstring>
#include <string>

#include "bad_input.hpp"

namespace {
const coremesh::fuzz::Target& the_target() {
  static const coremesh::fuzz::Target& t = coremesh::fuzz::target(CM_FUZZ_TARGET);
  return t;
}
}  // namespace

extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  the_target().run(std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}

// Targets with a framed part (the safetensors header behind its length)
// mutate that part half of the time and reframe it, so that mutations reach
// the JSON instead of only breaking the length prefix.
extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size, unsigned seed) {
  const auto& t = the_target();
  std::string part, rest;
  if (t.split == nullptr || seed % 2 == 0 ||
      !t.split(std::string_view(reinterpret_cast<const char*>(data), size), part, rest))
    return LLVMFuzzerMutate(data, size, max_size);
  const size_t used = part.size();
  part.resize(used * 2 + 64);
  part.resize(LLVMFuzzerMutate(reinterpret_cast<uint8_t*>(part.data()), used, part.size()));
  const std::string out = t.join(part, rest);
  if (out.size() > max_size) return LLVMFuzzerMutate(data, size, max_size);
  std::memcpy(data, out.data(), out.size());
  return out.size();
}
