// The model in parts: micro-batch slots, the input/weight-gradient split,
// chunks and stages, expert shards. Each is compared with the plain
// one-micro-batch-after-the-other run of the whole model: bit for bit where
// the arithmetic is the same.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>

#include "coremesh/model/model.hpp"
#include "coremesh/model/rng.hpp"
#include "coremesh/runtime/stream.hpp"
#include "reference_fixture.hpp"

using namespace coremesh;
using namespace coremesh::model;

namespace {

// MoE with capacity drops, aux loss and bias updates; an untied head.
ModelConfig config(bool tied = false) {
  ModelConfig c = xcheck::small_reference_config();
  c.capacity_factor = 1.0f, c.aux_loss_alpha = 0.01f, c.bias_update_rate = 1e-3f;
  c.gating = Gating::sigmoid, c.tied_embeddings = tied;
  return c;
}

struct Batches {
  static constexpr int B = 2, T = 16, M = 3;
  std::vector<int32_t> tok, tgt;
  explicit Batches(int V) {
    Rng rng(5);
    for (int i = 0; i < M * B * T; ++i) tok.push_back(int32_t(rng.below(uint64_t(V))));
    for (int i = 0; i < M * B * T; ++i) tgt.push_back(int32_t(rng.below(uint64_t(V))));
  }
  MicroBatch at(int m) const { return {tok.data() + m * B * T, tgt.data() + m * B * T, B, T, 1.0f / M}; }
};

void wait_stream() { runtime::current_stream().synchronize(); }

std::vector<float> grads(Model& m) {
  wait_stream();
  return {m.grad_data(), m.grad_data() + m.num_params()};
}

// The plain order: forward, backward, forward, backward, ...
std::vector<float> sequential(Model& m, const Batches& b) {
  m.zero_grad();
  for (int i = 0; i < Batches::M; ++i) m.forward(i, b.at(i)), m.backward(i);
  EXPECT_EQ(m.open_slots(), 0) << "a backward frees its slot";
  return grads(m);
}

void poison(Model& m) {
  std::fill_n(m.grad_data(), m.num_params(), std::numeric_limits<float>::quiet_NaN());
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST(ModelSlots, ForwardsBeforeBackwardsGiveTheSameGradients) {
  const ModelConfig c = config();
  const Batches b(c.vocab_size);
  Model ref(c), m(c);
  ref.init_weights(3), m.init_weights(3);
  const std::vector<float> want = sequential(ref, b);
  poison(m);
  m.zero_grad();
  for (int i = 0; i < Batches::M; ++i) m.forward(i, b.at(i));  // GPipe: every slot in flight
  EXPECT_EQ(m.open_slots(), Batches::M);
  for (int i = 0; i < Batches::M; ++i) m.backward(i);
  EXPECT_TRUE(same_bits(grads(m), want));
  // The statistics of the step are the same too (losses, expert load).
  const StepStats x = ref.read_stats(), y = m.read_stats();
  EXPECT_EQ(x.loss, y.loss);
  EXPECT_EQ(x.aux_loss, y.aux_loss);
  EXPECT_EQ(x.expert_load, y.expert_load);
  EXPECT_EQ(x.dropped, y.dropped);
  EXPECT_GT(x.dropped, 0) << "the capacity should drop assignments";
}

TEST(ModelSlots, WeightGradientsWaitForBackwardWeight) {
  const ModelConfig c = config();
  const Batches b(c.vocab_size);
  Model ref(c), m(c);
  ref.init_weights(4), m.init_weights(4);
  const std::vector<float> want = sequential(ref, b);
  poison(m);
  m.zero_grad();
  for (int i = 0; i < Batches::M; ++i) {
    m.forward(i, b.at(i));
    m.backward_chunk(i, 0, {}, /*defer_weight_grads=*/true);  // I only
  }
  wait_stream();
  EXPECT_EQ(m.open_slots(), 0) << "the slot is freed after its input gradients";
  // No weight-gradient GEMM has run yet: the matrices' gradients are NaN.
  for (const ParamInfo& p : m.params()) {
    const std::vector<float> g = m.grad(p.name).to_float_vector();
    EXPECT_TRUE(std::all_of(g.begin(), g.end(), [](float v) { return std::isnan(v); })) << p.name;
  }
  for (int i = 0; i < Batches::M; ++i) m.backward_weight(i, 0);  // W, in micro-batch order
  EXPECT_TRUE(same_bits(grads(m), want));
  EXPECT_EQ(m.seal_gradients(), 0);
  EXPECT_THROW(m.backward_weight(0, 0), InvalidArgument);
}

// A whole model cut into two chunks on one stage: the residual stream is
// added into one tensor at the cut, the same bits as the fused add. (Tied,
// the head's chunk holds a replica of the table, as on another stage.)
TEST(ModelSlots, TwoChunksOfOneStageMatchOneChunk) {
  const ModelConfig c = config();
  const Batches b(c.vocab_size);
  Model ref(c);
  ref.init_weights(5);
  const std::vector<float> want = sequential(ref, b);
  for (int cut : {1, 2, 3, 4, 6}) {
    SCOPED_TRACE(::testing::Message() << "cut before part " << cut);
    Model m(c, StageLayout{{{0, cut}, {cut, num_parts(c)}}});
    m.init_weights(5);
    EXPECT_TRUE(same_bits(sequential(m, b), want));
  }
  Model tied(config(true), StageLayout{{{0, 3}, {3, num_parts(c)}}});
  EXPECT_TRUE(tied.params().back().tied_replica);
}

// Two stages as a pipeline would hold them: the activation crosses from the
// first to the second, its gradient back. Parameters are laid out per part, so
// the stages hold exactly the whole model's values (and a replica of the tied
// table on the last stage, whose gradient is the head's part).
TEST(ModelSlots, TwoStagesReproduceTheWholeModel) {
  for (bool tied : {false, true}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    const ModelConfig c = config(tied);
    const Batches b(c.vocab_size);
    Model whole(c);
    whole.init_weights(6);
    sequential(whole, b);
    const int P = num_parts(c), cut = 3;
    Model first(c, StageLayout{{{0, cut}}}), last(c, StageLayout{{{cut, P}}});
    first.init_weights(6), last.init_weights(6);
    EXPECT_FALSE(first.holds_head());
    EXPECT_FALSE(last.holds_embedding());
    first.zero_grad(), last.zero_grad();
    for (int i = 0; i < Batches::M; ++i) {
      first.open_slot(i, b.at(i)), last.open_slot(i, b.at(i));
      const Tensor h = first.forward_chunk(i, 0);
      EXPECT_FALSE(last.forward_chunk(i, 0, h).defined());
      first.backward_chunk(i, 0, last.backward_chunk(i, 0));
    }
    wait_stream();
    int64_t held = 0;
    for (Model* stage : {&first, &last})
      for (const ParamInfo& p : stage->params()) {
        held += p.tied_replica ? 0 : p.numel;
        const Tensor mine = stage->param(p.name), ref = whole.param(p.name);
        EXPECT_EQ(0, std::memcmp(mine.raw_data(), ref.raw_data(), mine.nbytes())) << p.name << " initial value";
        const Tensor g = stage->grad(p.name), rg = whole.grad(p.name);
        if (p.name == "wte" && tied) continue;  // split between the stages, summed below
        EXPECT_EQ(0, std::memcmp(g.raw_data(), rg.raw_data(), g.nbytes())) << p.name << " gradient";
      }
    EXPECT_EQ(held, count_params(c).total);
    if (tied) {  // table part + head part = the whole model's gradient (summed in another order)
      std::vector<float> sum = first.grad("wte").to_float_vector(), head = last.grad("wte").to_float_vector();
      for (size_t i = 0; i < sum.size(); ++i) sum[i] += head[i];
      const std::vector<float> want = whole.grad("wte").to_float_vector();
      EXPECT_LT(xcheck::rel_err(sum.data(), want.data(), int64_t(sum.size())), 1e-6);
    }
  }
}

TEST(ModelSlots, AnExpertShardHoldsItsExpertsValues) {
  const ModelConfig c = config();
  Model whole(c), shard(c, StageLayout{{}, 2, 6});
  whole.init_weights(7), shard.init_weights(7);
  const Tensor w = shard.param("layers.1.experts.w13"), all = whole.param("layers.1.experts.w13");
  ASSERT_EQ(w.size(0), 4);
  EXPECT_EQ(shard.params()[size_t(shard.layout().index_of("layers.1.experts.w13"))].expert_begin, 2);
  EXPECT_EQ(0, std::memcmp(w.raw_data(), all.select(0, 2).raw_data(), w.nbytes()));
  EXPECT_EQ(count_params(c, StageLayout{{}, 2, 6}).expert, count_params(c).expert / 2);
}

TEST(ModelSlots, ParametersCarryWhatParallelismNeeds) {
  const ModelConfig c = config();
  const ParamLayout l = layout_params(c);
  auto info = [&](const std::string& n) { return l.params[size_t(l.index_of(n))]; };
  EXPECT_EQ(info("wte").group, ParamGroup::embedding);
  EXPECT_EQ(info("wte").tp_axis, TpAxis::vocab);
  EXPECT_EQ(info("layers.0.wq").tp_axis, TpAxis::column);
  EXPECT_EQ(info("layers.0.wo").tp_axis, TpAxis::row);
  EXPECT_EQ(info("layers.1.router").group, ParamGroup::router);
  EXPECT_EQ(info("layers.1.experts.w2").group, ParamGroup::expert);
  EXPECT_EQ(info("layers.1.shared.w1").group, ParamGroup::dense);
  EXPECT_EQ(info("final_norm").group, ParamGroup::norm);
  // Each part's parameters form one region of the arena, in part order.
  int64_t end = 0;
  for (int part = 0; part < num_parts(c); ++part) {
    EXPECT_EQ(l.region_offset[size_t(part)], end) << part_name(c, part);
    for (int i = l.regions[size_t(part)].begin; i < l.regions[size_t(part)].end; ++i)
      EXPECT_EQ(l.params[size_t(i)].part, part);
    end += l.region_size[size_t(part)];
  }
  EXPECT_EQ(end, l.arena_size);
  EXPECT_THROW(Model(c, StageLayout{{{0, 3}, {2, 5}}}), InvalidArgument);  // overlapping chunks
  EXPECT_THROW(Model(c, StageLayout{{}, 3, 9}), InvalidArgument);          // 8 experts
}

// Tensor parallelism: the TP ranks' slices of every parameter, pasted into
// whole tensors, are the 1-PE weights (split q/kv heads, hidden units and
// expert hidden units; kv heads shared by tp / n_kv_heads ranks at tp = 4);
// each element counts once over the ranks that are first to hold it.
TEST(ModelSlots, TensorParallelSlicesTileTheWholeModel) {
  const ModelConfig c = config();
  Model whole(c);
  whole.init_weights(7);
  for (int tp : {2, 4}) {
    std::map<std::string, Tensor> pasted;
    std::map<std::string, int64_t> counted;
    for (int r = 0; r < tp; ++r) {
      StageLayout stage;
      stage.tp = tp, stage.tp_rank = r;
      Model m(c, stage);
      m.init_weights(7);
      for (const ParamInfo& p : m.params()) {
        Tensor& w = pasted.try_emplace(p.name, Tensor::zeros(p.whole_shape)).first->second;
        place_part(p, m.param(p.name), w);
        if (p.tp_first) counted[p.name] += p.numel;
        const Tensor back = held_part(p, whole.param(p.name));
        EXPECT_EQ(0, std::memcmp(back.raw_data(), m.param(p.name).raw_data(), back.nbytes())) << p.name << " tp " << tp;
      }
    }
    for (const auto& [name, w] : whole.named_params()) {
      EXPECT_EQ(0, std::memcmp(pasted.at(name).raw_data(), w.raw_data(), w.nbytes())) << name << " tp " << tp;
      EXPECT_EQ(counted.at(name), w.numel()) << name << " tp " << tp;
    }
  }
  StageLayout four;
  four.tp = 4, four.tp_rank = 3;
  const TpShape t = tp_shape(c, four);
  EXPECT_EQ(t.heads, 1);
  EXPECT_EQ(t.kv_sharing, 2);
  EXPECT_EQ(t.kv_head_begin, 1);
  EXPECT_EQ(t.expert_hidden, c.expert_hidden / 4);
  StageLayout three;
  three.tp = 3;
  EXPECT_THROW(Model(c, three), InvalidArgument);  // 4 heads
}
