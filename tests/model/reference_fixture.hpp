// What the PyTorch cross-checks (test_crosscheck.cpp, test_precision.cpp)
// share: the small model they run, the weights they hand to the reference
// (tests/reference/*.py, run with /usr/bin/python3) and the error measure.
#pragma once

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "coremesh/model/model.hpp"
#include "coremesh/model/rng.hpp"
#include "coremesh/runtime/stream.hpp"
#include "coremesh/train/safetensors.hpp"

namespace coremesh::model::xcheck {

inline std::string repo_root() {
  return std::filesystem::path(__FILE__).parent_path().parent_path().parent_path().string();
}

// Runs tests/reference/<script> on `dir`; returns its exit status.
inline int run_reference(const std::string& script, const std::string& dir) {
  const std::string cmd = "OPENBLAS_NUM_THREADS=1 OMP_WAIT_POLICY=passive /usr/bin/python3 " +
                          repo_root() + "/tests/reference/" + script + " " + dir;
  return std::system(cmd.c_str());
}

// ||a - b||_2 / ||b||_2 (the absolute norm when b is zero).
inline double rel_err(const float* a, const float* b, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    num += double(a[i] - b[i]) * double(a[i] - b[i]);
    den += double(b[i]) * double(b[i]);
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

// d_model 32, 3 layers (1 dense), GQA 4/2, 8 routed experts top-2 + 1 shared.
inline ModelConfig small_reference_config() {
  ModelConfig c;
  c.vocab_size = 96, c.d_model = 32, c.n_layers = 3, c.n_heads = 4, c.n_kv_heads = 2;
  c.max_seq_len = 16, c.first_k_dense = 1, c.dense_hidden = 64, c.n_routed_experts = 8;
  c.n_shared_experts = 1, c.top_k = 2, c.expert_hidden = 16, c.init_std = 0.1f;
  return c;
}

// The sigmoid-gating variant: MHA, untied head, 2 shared experts, capacity 1
// with low-score drops (zero rows at the end of the permuted buffer), aux loss.
inline ModelConfig sigmoid_capacity_config(ModelConfig c) {
  c.n_kv_heads = 4;
  c.tied_embeddings = false;
  c.gating = Gating::sigmoid;
  c.n_shared_experts = 2;
  c.capacity_factor = 1.0f;
  c.drop_policy = DropPolicy::low_score;
  c.aux_loss_alpha = 0.003f;
  return c;
}

// Initializes `model` (seed 1234; router biases N(0, 0.02) so that the biased
// selection is exercised) and writes its parameters and buffers to
// <dir>/weights.safetensors as "param/<name>" and "buffer/<name>".
inline void write_reference_weights(Model& model, const std::string& dir) {
  model.init_weights(1234);
  Rng rng(99);
  for (auto& [n, b] : model.named_buffers())
    for (int64_t i = 0; i < b.numel(); ++i) b.data<float>()[i] = 0.02f * rng.normal();
  std::vector<std::pair<std::string, Tensor>> w;
  for (auto& [n, t] : model.named_params()) w.emplace_back("param/" + n, t);
  for (auto& [n, t] : model.named_buffers()) w.emplace_back("buffer/" + n, t.clone());
  train::write_safetensors(dir + "/weights.safetensors", w);
}

// One forward of a whole-model stage on the current stream, then a
// synchronization: this micro-batch's mean cross entropy and balance loss
// (times alpha). The slot stays open for backward(slot) or logits(slot).
struct Forward {
  double ce = 0, aux = 0;
};
inline Forward forward_sync(Model& m, int slot, const int32_t* tokens, const int32_t* targets, int B, int T,
                            float loss_scale = 1.0f) {
  runtime::current_stream().synchronize();
  const double aux_before = m.read_stats().aux_loss;
  m.forward(slot, {tokens, targets, B, T, loss_scale});
  runtime::current_stream().synchronize();
  Forward f;
  const std::vector<float> l = m.token_losses(slot).to_float_vector();
  for (float v : l) f.ce += v;
  f.ce /= double(l.size());
  f.aux = (m.read_stats().aux_loss - aux_before) / loss_scale;
  return f;
}

// The gradient norm of clip_gradients(), read after a synchronization.
template <class Opt>
double clip_and_read(Opt& opt) {
  const Tensor sq = opt.clip_gradients();
  runtime::current_stream().synchronize();
  return Opt::grad_norm(sq);
}

}  // namespace coremesh::model::xcheck
