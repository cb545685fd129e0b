// What a kernel computes, carried with it from launch to the profiler and to
// graph capture: the op cache key (op, shapes, dtypes, core limits, attrs)
// and the tensors it reads and writes. A graph pass matches ops on it ("a
// matmul whose output an add then adds into") instead of on opaque closures.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "coremesh/core/dtype.hpp"
#include "coremesh/core/tensor.hpp"
#include "coremesh/runtime/device.hpp"

namespace coremesh::runtime {

// The RFC's tiling hash key extended with cube_num and vector_num.
struct OpKey {
  std::string op;
  std::vector<Shape> shapes;
  std::vector<DType> dtypes;
  CoreLimits limits;
  std::string attrs;  // op-specific attributes, "name=value;..." (transposes, flags, ...)

  std::string text() const;
  // The value of `name` in attrs ("beta" in "ta=false;beta=1" is "1"); none if absent.
  std::optional<std::string> attr(std::string_view name) const;
};

// An op as launched: its key and its tensor arguments. A tensor updated in
// place is in both lists. The handles keep the storages alive as long as
// the descriptor lives.
struct OpDesc {
  OpKey key;
  std::vector<Tensor> inputs;   // read
  std::vector<Tensor> outputs;  // written

  // "matmul(t0[64,32]f32, t1[32,16]f32) -> t2[64,16]f32 {ta=false;...}" with
  // tensors named by `name_of` (storage -> short name).
  std::string describe(const std::function<std::string(const Tensor&)>& name_of) const;
};

}  // namespace coremesh::runtime
