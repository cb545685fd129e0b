#include "coremesh/runtime/op_registry.hpp"

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
