// Model config: JSON round trip, validation messages that say what to
// change, and the size arithmetic of --dry-run.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "coremesh/core/error.hpp"
#include "coremesh/model/config.hpp"
#include "coremesh/model/layout.hpp"

using namespace coremesh;
using namespace coremesh::model;

static std::string problems_of(const ModelConfig& c) {
  try {
    c.validate();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "(valid)";
}

TEST(ModelConfig, DefaultsAreValidAndJsonRoundTrips) {
  ModelConfig c;
  EXPECT_EQ(problems_of(c), "(valid)");
  c.gating = Gating::sigmoid;
  c.drop_policy = DropPolicy::low_score;
  c.capacity_factor = 1.25f;
  c.n_kv_heads = 2;
  EXPECT_EQ(model_config_from_json(to_json(c)), c);
}

TEST(ModelConfig, InvalidConfigsAreRejectedWithWhatToChange) {
  ModelConfig c;
  c.n_heads = 3;  // 256 % 3 != 0
  std::string m = problems_of(c);
  EXPECT_NE(m.find("n_heads = 3 does not divide d_model = 256"), std::string::npos) << m;
  EXPECT_NE(m.find("choose n_heads among the divisors of d_model"), std::string::npos) << m;

  c = ModelConfig{};
  c.top_k = 9;
  m = problems_of(c);
  EXPECT_NE(m.find("top_k = 9 is above n_routed_experts = 8; lower top_k or add experts"), std::string::npos) << m;

  c = ModelConfig{};
  c.n_kv_heads = 3;
  EXPECT_NE(problems_of(c).find("n_kv_heads = 3 does not divide n_heads = 4"), std::string::npos);

  c = ModelConfig{};
  c.n_groups = 3;
  EXPECT_NE(problems_of(c).find("n_groups = 3 must be positive and divide n_routed_experts = 8"), std::string::npos);

  c = ModelConfig{};
  c.n_groups = 4;
  c.topk_groups = 1;  // 1 group of 2 experts < top_k = 2? equal: valid; top_k = 3 is not
  c.top_k = 3;
  EXPECT_NE(problems_of(c).find("hold fewer than top_k = 3"), std::string::npos);

  c = ModelConfig{};
  c.first_k_dense = 7;
  EXPECT_NE(problems_of(c).find("first_k_dense = 7 must be in [0, n_layers = 4]"), std::string::npos);

  c = ModelConfig{};
  c.bias_update = BiasUpdate::margin, c.bias_update_rate = 2.0f;  // a fraction of the balancing shift
  EXPECT_NE(problems_of(c).find("bias_update_rate = 2 is above 1"), std::string::npos);
  c.bias_update_rate = 1.0f;
  EXPECT_EQ(problems_of(c), "(valid)");

  // Several problems are reported together.
  c = ModelConfig{};
  c.d_model = 0;
  c.top_k = 0;
  c.rope_theta = -1;
  m = problems_of(c);
  EXPECT_NE(m.find("d_model = 0 must be positive"), std::string::npos) << m;
  EXPECT_NE(m.find("top_k = 0 must be positive"), std::string::npos) << m;
  EXPECT_NE(m.find("rope_theta = -1 must be > 0"), std::string::npos) << m;
}

TEST(ModelConfig, JsonErrorsNameTheField) {
  auto err = [](const std::string& text) {
    try {
      model_config_from_json(nlohmann::json::parse(text));
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  EXPECT_NE(err(R"({"d_modl": 3})").find("unknown model config field 'd_modl'"), std::string::npos);
  EXPECT_NE(err(R"({"d_model": "big"})").find("'d_model' has the wrong type"), std::string::npos);
  EXPECT_NE(err(R"({"gating": "relu"})").find("unknown gating 'relu'"), std::string::npos);
  // n_kv_heads defaults to n_heads.
  EXPECT_EQ(model_config_from_json(nlohmann::json::parse(R"({"n_heads": 8})")).n_kv_heads, 8);
}

TEST(ModelConfig, ParameterCountFlopsAndMemory) {
  ModelConfig c;
  c.vocab_size = 256, c.d_model = 64, c.n_layers = 2, c.n_heads = 4, c.n_kv_heads = 2;
  c.first_k_dense = 1, c.dense_hidden = 128, c.n_routed_experts = 4, c.n_shared_experts = 1;
  c.top_k = 2, c.expert_hidden = 32, c.tied_embeddings = true;
  const int64_t C = 64, D = 16;
  const int64_t attn = C * 4 * D + 2 * C * 2 * D + 4 * D * C;  // wq, wk, wv, wo
  const int64_t dense = attn + 2 * C + 3 * C * 128;
  const int64_t expert = 3 * C * 32;
  const int64_t moe = attn + 2 * C + C * 4 /*router*/ + expert /*shared*/ + 4 * expert;
  ParamCount p = count_params(c);
  EXPECT_EQ(p.total, 256 * C + C + dense + moe);
  EXPECT_EQ(p.active, p.total - 2 * expert);
  EXPECT_EQ(p.expert, 4 * expert);
  // Tied head: every active parameter is used in one matmul per token.
  EXPECT_DOUBLE_EQ(flops_per_token(c, 32), 6.0 * double(p.active) + 6.0 * 2 * 32 * 64);
  c.tied_embeddings = false;
  EXPECT_EQ(count_params(c).total, p.total + 256 * C);
  MemoryEstimate m = estimate_memory(c, 4, 32);
  EXPECT_EQ(m.weights, count_params(c).total * 4);
  EXPECT_EQ(m.optimizer, 2 * m.weights);
  EXPECT_GT(m.activations, 0);
}

// Under expert parallelism an owner's received rows are sized for every
// source's rows (ep x the one-PE rows, capacity-bounded), and the exchange
// keeps each direction's sends: both grow the estimate, by the formula's terms.
TEST(ModelConfig, MemoryEstimateCountsTheExpertExchange) {
  ModelConfig c;  // 8 experts, top-2
  c.n_layers = 2, c.first_k_dense = 1;
  const int64_t N = 4 * 32, K = c.top_k, C = c.d_model, F = c.expert_hidden;
  const MemoryEstimate one = estimate_memory(c, 4, 32);
  EXPECT_EQ(one.exchange, 0);
  StageLayout half;
  half.expert_begin = 0, half.expert_end = 4;  // ep 2
  const MemoryEstimate ep2 = estimate_memory(c, 4, 32, half);
  const int64_t routed_row = 4 * (2 * F + C) + 4 * C + 4 * F;  // f32: gu, ye, xp, g
  EXPECT_EQ(ep2.exchange, 2 * 4 * C * (N * K + 2 * N * K));  // one MoE layer
  EXPECT_EQ(ep2.activations - one.activations, routed_row * N * K - 8 * 4);  // ep x rows; 4 fewer group offsets
  c.capacity_factor = 1.0f;  // at most 4 experts x capacity rows from each source
  const int64_t capacity = c.expert_capacity(N);
  EXPECT_EQ(estimate_memory(c, 4, 32, half).exchange, 2 * 4 * C * (N * K + 2 * std::min(N * K, 4 * capacity)));
}

TEST(ModelConfig, ExpertCapacity) {
  ModelConfig c;  // 8 experts, top-2
  EXPECT_EQ(c.expert_capacity(100), -1);
  c.capacity_factor = 1.0f;
  EXPECT_EQ(c.expert_capacity(100), 25);
  c.capacity_factor = 1.25f;
  EXPECT_EQ(c.expert_capacity(100), 32);  // ceil(31.25)
  // a huge factor is no drops: every routed row (its cast overflowed to a capacity of 1, dropping nearly all)
  c.capacity_factor = 1e30f;
  EXPECT_EQ(c.expert_capacity(100), 200);
}
