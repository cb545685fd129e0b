// What the ops layer tells the layers beside it (graph) about its ops: which
// are element-wise, and how to build a kernel from a descriptor. graph may
// not include ops (they are siblings), so a pass that fuses nodes names the
// fused op in a new OpDesc and asks this registry for its kernel; ops
// registers the builders when its object files are loaded.
//
// Thread safety: registration and lookup may run concurrently.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "coremesh/runtime/op_cache.hpp"
#include "coremesh/runtime/op_desc.hpp"
#include "coremesh/runtime/stream.hpp"

namespace coremesh::runtime {

struct OpTraits {
  // Element-wise over equal-shaped contiguous f32 tensors with this many
  // inputs and one output (0: not element-wise).
  int elementwise_arity = 0;
  // Builds the kernel of a descriptor of this op under desc.key.limits
  // (tiling through the op cache); empty if the op cannot be rebuilt.
  std::function<Kernel(const OpDesc& desc)> build;
  // The tilings worth measuring for `key` (the tuner's search space; any
  // order, duplicates and the heuristic allowed). Unset: block_dim from 1 to
  // the heuristic's, the rest kept (fewer blocks never breaks a kernel whose
  // blocks split their work by ctx.block_dim).
  std::function<std::vector<Tiling>(const OpKey& key, const Tiling& heuristic, int max_blocks)> tilings;
  // The tiling sets a protocol between PEs (a collective's chunk count):
  // every PE must use the same one, so the tuner searches it over whole
  // runs, every PE trying the same candidate at once, not launch by launch.
  bool agreed = false;
  // How a tiling reads to a user ("4 chunks on 1 comm core"); unset:
  // runtime::describe(Tiling).
  std::function<std::string(const Tiling&)> describe;
};
// `t` as op's traits describe it.
std::string describe_tiling(const std::string& op, const Tiling& t);
// The search space of `key` under traits (deduplicated, valid, heuristic first).
std::vector<Tiling> candidate_tilings(const OpKey& key, const Tiling& heuristic, int max_blocks);

// Registers (or replaces) the traits of `op`; returns true (for static init).
bool register_op(const std::string& op, OpTraits traits);
// Traits of `op`; default traits (not element-wise, no builder) if unknown.
OpTraits op_traits(const std::string& op);
// Builds the kernel of `desc`; throws InvalidArgument if no builder is registered.
Kernel build_kernel(const OpDesc& desc);

}  // namespace coremesh::runtime
