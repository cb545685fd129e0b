// Op descriptors and the op registry: the key's attributes read back, the
// text form names tensors as asked, and kernels are built from registered
// builders (a missing one is a clear error).
#include "coremesh/runtime/op_registry.hpp"
#include "helpers.hpp"

namespace coremesh::runtime {
namespace {

TEST(OpDesc, AttrReadsNameValuePairs) {
  OpKey key{"matmul", {{2, 3}}, {DType::f32}, {1, 1}, "ta=false;tb=true;beta=1"};
  EXPECT_EQ(key.attr("ta"), "false");
  EXPECT_EQ(key.attr("tb"), "true");
  EXPECT_EQ(key.attr("beta"), "1");
  EXPECT_FALSE(key.attr("t").has_value());
  const OpKey gelu{"gelu", {}, {}, {}, "tanh"};
  EXPECT_FALSE(gelu.attr("tanh").has_value());
  EXPECT_EQ(OpKey({"x", {}, {}, {}, "chain=silu(i0) mul(t,i1)"}).attr("chain"), "silu(i0) mul(t,i1)");
}

TEST(OpDesc, DescribeNamesInputsThenOutputs) {
  Tensor a = Tensor::zeros({2, 3}), b = Tensor::zeros({3});
  OpDesc d{{"add_bias", {{2, 3}}, {DType::f32}, {1, 1}, ""}, {a, b}, {a}};
  int next = 0;
  std::map<const Storage*, int> names;
  const std::string text = d.describe([&](const Tensor& t) {
    auto [it, added] = names.emplace(t.storage().get(), next);
    next += added;
    return "t" + std::to_string(it->second);
  });
  EXPECT_EQ(text, "add_bias(t0[2, 3]f32, t1[3]f32) -> t0[2, 3]f32");
}

TEST(OpRegistry, BuildsFromARegisteredBuilderAndNamesAMissingOne) {
  register_op("test_fill", {1, [](const OpDesc& d) {
                              Tensor out = d.outputs[0];
                              LaunchInfo info{"test_fill", KernelKind::vector, 1, 0};
                              info.op = std::make_shared<const OpDesc>(d);
                              return Kernel{info, [out](const BlockContext&) mutable { out.fill(7.0f); }};
                            }});
  EXPECT_EQ(op_traits("test_fill").elementwise_arity, 1);
  EXPECT_EQ(op_traits("no_such_op").elementwise_arity, 0);
  Tensor out = Tensor::zeros({4});
  Kernel k = build_kernel(OpDesc{{"test_fill", {{4}}, {DType::f32}, {1, 1}, ""}, {}, {out}});
  Device device({.cores = 1});
  Stream s(device);
  s.launch(k.info, k.body);
  s.synchronize();
  EXPECT_EQ(out.item({3}), 7.0f);
  EXPECT_THROW(build_kernel(OpDesc{{"no_such_op", {}, {}, {1, 1}, ""}, {}, {}}), InvalidArgument);
}

}  // namespace
}  // namespace coremesh::runtime
