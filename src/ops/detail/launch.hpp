// The one plan/launch path of every kernel in src/ops:
//   1. plan():   look up the kernel's tiling in OpCache under the current
//                stream's effective limits (the key holds op, shapes, dtypes,
//                limits, attrs), computing it on a miss from
//                max_blocks(limits, kind);
//   2. launch(): enqueue the body on the current stream with that block_dim
//                and the op descriptor (the key and the tensors the kernel
//                reads and writes: Args), which the profiler and graph
//                capture see. The descriptor (copies of the tensor handles)
//                is made only while the stream captures or the profiler
//                records: a plain eager launch would pay ~1 us for it;
//   3. the body: block b of n works on split_range(items, b, n, align).
// Bodies capture Tensor handles by value so storage outlives the kernel, and
// keep no state from one run to the next (a captured graph replays them).
// plan_for/make_kernel do the same under explicit limits without launching:
// the builders that graph passes call through runtime/op_registry.hpp.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "coremesh/core/tensor.hpp"
#include "coremesh/runtime/op_cache.hpp"
#include "coremesh/runtime/op_registry.hpp"
#include "coremesh/runtime/stream.hpp"
#include "split.hpp"

namespace coremesh::ops::detail {

using runtime::BlockContext;
using runtime::KernelKind;

// Tiling of a kernel whose work is `items` independent units (rows, tiles,
// heads): block_dim blocks, each gets a range aligned to `align` units.
using runtime::Tiling;

struct Plan {
  uint64_t cache_id = 0;
  Tiling tiling;
  KernelKind kind = KernelKind::vector;
  runtime::OpKey key;
};

// Tensors named by reference for the length of one launch call (no copies:
// the descriptor copies them when one is made).
class TensorRefs {
 public:
  TensorRefs() = default;
  TensorRefs(std::initializer_list<std::reference_wrapper<const Tensor>> list) {
    for (const Tensor& t : list) add(t);
  }
  TensorRefs(const std::vector<Tensor>& list) {  // NOLINT: implicit, like the list form
    for (const Tensor& t : list) add(t);
  }
  void add(const Tensor& t) {
    if (size_ < inline_.size()) inline_[size_] = &t;
    else more_.push_back(&t);
    ++size_;
  }
  std::vector<Tensor> copies() const;

 private:
  std::array<const Tensor*, 8> inline_{};  // the common case allocates nothing
  std::vector<const Tensor*> more_;
  size_t size_ = 0;
};

// The tensors a kernel reads (in) and writes (out); one updated in place is in both.
struct Args {
  TensorRefs in, out;
};

// The defined tensors of `list` (optional arguments left out).
inline std::vector<Tensor> defined(std::initializer_list<Tensor> list) {
  std::vector<Tensor> out;
  for (const Tensor& t : list)
    if (t.defined()) out.push_back(t);
  return out;
}

// Looks up (or makes) the tiling of `op` under the current stream's limits.
// make(max_blocks) returns the tiling; block_dim is clamped to [1, max_blocks].
Plan plan(std::string op, KernelKind kind, std::vector<Shape> shapes, std::vector<DType> dtypes,
          std::string attrs, const std::function<Tiling(int max_blocks)>& make);
// The same under key.limits.
Plan plan_for(runtime::OpKey key, KernelKind kind, const std::function<Tiling(int max_blocks)>& make);

// The common case: `items` work units of `unit_cost` elements each. Blocks
// get at least ~kMinBlockWork elements so tiny ops do not fan out.
inline constexpr int64_t kMinBlockWork = 2048;
Plan plan_rows(std::string op, KernelKind kind, std::vector<Shape> shapes,
               std::vector<DType> dtypes, std::string attrs, int64_t items, int64_t unit_cost);
Plan plan_rows_for(runtime::OpKey key, KernelKind kind, int64_t items, int64_t unit_cost);

// The kernel of `plan` (LaunchInfo with block_dim, cache id and descriptor).
runtime::Kernel make_kernel(Plan plan, const Args& args, runtime::KernelBody body);
// The kernel, enqueued on the current stream (its descriptor made only while
// the stream captures or the profiler records).
void launch(Plan plan, const Args& args, runtime::KernelBody body);

// Body of a rows kernel: body(begin, end) gets the block's item range.
template <typename Body>
runtime::KernelBody rows_body(int64_t items, int64_t align, Body body) {
  return [items, align, body](const BlockContext& ctx) {
    auto [begin, end] = split_range(items, ctx.block_idx, ctx.block_dim, align);
    if (begin < end) body(begin, end);
  };
}

// plan_rows + launch of a rows body; nothing is launched for no items.
template <typename Body>
void launch_rows(const std::string& op, KernelKind kind, std::vector<Shape> shapes,
                 std::vector<DType> dtypes, std::string attrs, const Args& args, int64_t items,
                 int64_t unit_cost, Body body) {
  if (items <= 0) return;
  Plan p = plan_rows(op, kind, std::move(shapes), std::move(dtypes), std::move(attrs), items,
                     unit_cost);
  const int64_t align = p.tiling.align;
  launch(std::move(p), args, rows_body(items, align, std::move(body)));
}

// "name=value;" for each attribute: the attrs of an OpKey (OpKey::attr reads them).
std::string key_attrs(std::initializer_list<std::pair<const char*, double>> attrs);

}  // namespace coremesh::ops::detail
