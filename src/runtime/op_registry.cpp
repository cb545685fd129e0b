#include "coremesh/runtime/op_registry.hpp"

#include <algorithm>
#include <mutex>
#include <unordered_map>

#include "coremesh/core/error.hpp"

namespace coremesh::runtime {
namespace {

struct Registry {
  std::mutex mutex;
  std::unordered_map<std::string, OpTraits> ops;
};

Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

bool register_op(const std::string& op, OpTraits traits) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  r.ops[op] = std::move(traits);
  return true;
}

OpTraits op_traits(const std::string& op) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  auto it = r.ops.find(op);
  return it == r.ops.end() ? OpTraits{} : it->second;
}

std::vector<Tiling> candidate_tilings(const OpKey& key, const Tiling& heuristic, int max_blocks) {
  std::vector<Tiling> all;
  if (const OpTraits traits = op_traits(key.op); traits.tilings) {
    all = traits.tilings(key, heuristic, max_blocks);
  } else {
    for (int b = 1; b <= heuristic.block_dim; ++b) all.push_back({b, heuristic.align, heuristic.tile_m, heuristic.tile_n});
  }
  std::vector<Tiling> out{heuristic};
  for (Tiling t : all) {
    t.block_dim = std::clamp(t.block_dim, 1, std::max(1, max_blocks));
    t.align = std::max<int64_t>(t.align, 1);
    if (std::find(out.begin(), out.end(), t) == out.end()) out.push_back(t);
  }
  return out;
}

std::string describe_tiling(const std::string& op, const Tiling& t) {
  const OpTraits traits = op_traits(op);
  return traits.describe ? traits.describe(t) : describe(t);
}

Kernel build_kernel(const OpDesc& desc) {
  const OpTraits traits = op_traits(desc.key.op);
  CM_CHECK(traits.build != nullptr,
           "link the library that defines the op (ops registers its builders), or keep the captured kernel",
           "no kernel builder is registered for op '{}'", desc.key.op);
  Kernel k = traits.build(desc);
  CM_ASSERT(k.info.op != nullptr && k.body != nullptr);
  return k;
}

}  // namespace coremesh::runtime
