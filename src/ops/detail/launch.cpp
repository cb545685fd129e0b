#include "launch.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <memory>

#include "coremesh/runtime/capture.hpp"
#include "coremesh/runtime/op_cache.hpp"
#include "coremesh/runtime/profiler.hpp"

namespace coremesh::ops::detail {

Plan plan_for(runtime::OpKey key, KernelKind kind, const std::function<Tiling(int max_blocks)>& make) {
  auto [id, tiling] = runtime::OpCache::global().get(key, kind, make);
  return Plan{id, tiling, kind, std::move(key)};
}

Plan plan(std::string op, KernelKind kind, std::vector<Shape> shapes, std::vector<DType> dtypes,
          std::string attrs, const std::function<Tiling(int max_blocks)>& make) {
  return plan_for({std::move(op), std::move(shapes), std::move(dtypes),
                   runtime::current_stream().effective_limits(), std::move(attrs)},
                  kind, make);
}

Plan plan_rows_for(runtime::OpKey key, KernelKind kind, int64_t items, int64_t unit_cost) {
  return plan_for(std::move(key), kind, [&](int max_blocks) {
    Tiling t;
    const int64_t cost = std::max<int64_t>(unit_cost, 1);
    t.align = std::max<int64_t>(1, kMinBlockWork / cost);
    t.block_dim = static_cast<int>(std::min<int64_t>(max_blocks, ceil_div(items, t.align)));
    return t;
  });
}

Plan plan_rows(std::string op, KernelKind kind, std::vector<Shape> shapes,
               std::vector<DType> dtypes, std::string attrs, int64_t items, int64_t unit_cost) {
  return plan_rows_for({std::move(op), std::move(shapes), std::move(dtypes),
                        runtime::current_stream().effective_limits(), std::move(attrs)},
                       kind, items, unit_cost);
}

std::vector<Tensor> TensorRefs::copies() const {
  std::vector<Tensor> out;
  out.reserve(size_);
  for (size_t i = 0; i < size_; ++i) out.push_back(i < inline_.size() ? *inline_[i] : *more_[i - inline_.size()]);
  return out;
}

runtime::Kernel make_kernel(Plan plan, const Args& args, runtime::KernelBody body) {
  runtime::LaunchInfo info{plan.key.op, plan.kind, plan.tiling.block_dim, plan.cache_id};
  info.op = std::make_shared<const runtime::OpDesc>(
      runtime::OpDesc{std::move(plan.key), args.in.copies(), args.out.copies()});
  return {std::move(info), std::move(body)};
}

void launch(Plan plan, const Args& args, runtime::KernelBody body) {
  runtime::Stream stream = runtime::current_stream();
  if (runtime::is_capturing(stream) || runtime::profiler_enabled()) {
    runtime::Kernel k = make_kernel(std::move(plan), args, std::move(body));
    stream.launch(k.info, std::move(k.body));
    return;
  }
  stream.launch({std::move(plan.key.op), plan.kind, plan.tiling.block_dim, plan.cache_id}, std::move(body));
}

std::string key_attrs(std::initializer_list<std::pair<const char*, double>> attrs) {
  std::string s;
  for (auto& [name, value] : attrs) s += fmt::format("{}={};", name, value);
  return s;
}

}  // namespace coremesh::ops::detail
