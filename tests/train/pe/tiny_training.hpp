// The small training run the PE tests of parallel training compare with one
// PE: a 2-layer MoE model (capacity drops, balance loss, router-bias updates,
// clipping active) on a generated corpus, one core per PE.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "coremesh/runtime/device.hpp"
#include "coremesh/shmem/shmem.hpp"
#include "coremesh/train/trainer.hpp"
#include "train/test_util.hpp"

namespace coremesh::test_support {
using train::CheckpointState;
using train::NamedTensors;


inline runtime::Device& one_core() {
  static runtime::Device device(runtime::DeviceOptions{.cores = 1, .pin = false});
  return device;
}

// A /tmp directory of this job only: jobs of other worktrees may run the
// same tests at the same time (under mpirun: the PMIx namespace names the
// job). Remove it at the end of the test.
inline std::string job_dir(const std::string& name) {
  const char* id = std::getenv(shmem::kJobIdEnv);
  if (id == nullptr) id = std::getenv("PMIX_NAMESPACE");
  return "/tmp/coremesh_pe_" + name + "_" + (id ? std::string(id).substr(0, 12) : "job");
}

// Written once per job (a file another PE has mapped must not be rewritten).
inline std::string corpus() {
  static bool written = false;
  const std::string path = job_dir("training_corpus") + ".txt";
  if (written) return path;
  written = true;
  if (shmem::my_pe() == 0) {
    write_tiny_corpus(path, 4000);
  }
  shmem::barrier();
  return path;
}

inline train::TrainConfig base_config() {
  train::TrainConfig c;
  c.model.vocab_size = 256, c.model.d_model = 32, c.model.n_layers = 2, c.model.n_heads = 4;
  c.model.n_kv_heads = 2, c.model.max_seq_len = 32, c.model.first_k_dense = 1, c.model.dense_hidden = 64;
  c.model.n_routed_experts = 8, c.model.top_k = 2, c.model.expert_hidden = 16, c.model.n_shared_experts = 1;
  c.model.gating = model::Gating::sigmoid, c.model.capacity_factor = 1.0f;
  // Where the GEMM engine is row-exact (every layout bit for bit) the margin
  // bias step, whose selection margins are summed over the ranks like the
  // loads; elsewhere (OpenBLAS, the sanitizer builds: layouts within 1e-6)
  // the sign step, as the margin step turns a score's last bit at a bin edge
  // into a bias difference that a few steps carry past 1e-6.
#if defined(__AVX2__) && defined(__FMA__)
  c.model.bias_update = model::BiasUpdate::margin, c.model.bias_update_rate = 0.5f;
#else
  c.model.bias_update_rate = 1e-3f;
#endif
  c.model.aux_loss_alpha = 1e-3f;
  c.data = {corpus()};
  c.batch_size = 2, c.seq_len = 32, c.grad_accum = 1, c.steps = 10;
  c.lr = 3e-3, c.min_lr = 3e-4, c.warmup_steps = 2, c.adam.grad_clip = 0.5;  // clipping active
  c.val_every = 0, c.cores = 1, c.progress = false, c.report = false, c.sample_tokens = 0;
  return c;
}

// Building a Trainer from `c` throws InvalidArgument whose text holds `hint`
// (a layout refused at start with what to change).
inline void expect_refused(train::TrainConfig c, const std::string& hint) {
  c.out_dir = job_dir("refused");
  try {
    train::Trainer t(c, one_core());
    ADD_FAILURE() << "accepted a layout that should be refused: " << hint;
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(hint), std::string::npos) << e.what();
  }
}

// ||a - b|| / ||b|| over the elements.
inline double relative_l2(const Tensor& a, const Tensor& b) {
  const auto u = a.to_float_vector(), v = b.to_float_vector();
  EXPECT_EQ(u.size(), v.size());
  double num = 0, den = 0;
  for (size_t k = 0; k < std::min(u.size(), v.size()); ++k)
    num += (u[k] - v[k]) * double(u[k] - v[k]), den += double(v[k]) * v[k];
  return std::sqrt(num / std::max(den, 1e-30));
}

// The largest relative difference of `run`'s per-step losses from `ref`'s;
// each step's must be within `tolerance`.
inline double worst_loss_difference(const train::Trainer& run, const train::Trainer& ref, double tolerance) {
  EXPECT_EQ(run.records().size(), ref.records().size());
  double worst = 0;
  for (size_t s = 0; s < std::min(run.records().size(), ref.records().size()); ++s) {
    const double a = run.records()[s].loss, b = ref.records()[s].loss;
    const double r = std::fabs(a - b) / std::max(std::fabs(b), 1e-30);
    EXPECT_LE(r, tolerance) << "step " << s;
    worst = std::max(worst, r);
  }
  return worst;
}

// Our GEMM engine (builds with AVX2 and FMA) computes each row of a product
// the same whatever the number of rows. OpenBLAS, which builds without it
// use (the sanitizer builds), may block a product by its row count.
#if defined(__AVX2__) && defined(__FMA__)
constexpr bool kRowExactGemm = true;
#else
constexpr bool kRowExactGemm = false;
#endif

// `run` reproduces `ref` step by step (loss, gradient norm, expert balance)
// and in its final weights: bit for bit where kRowExactGemm, else within
// 1e-6 relative. For layouts that only regroup the rows of the experts' GEMMs.
inline void expect_same_run(train::Trainer& run, train::Trainer& ref) {
  auto same = [](double a, double b, const char* what, size_t step) {
    if (kRowExactGemm) EXPECT_EQ(a, b) << what << ", step " << step;
    else EXPECT_NEAR(a, b, 1e-6 * std::abs(b)) << what << ", step " << step;
  };
  ASSERT_EQ(run.records().size(), ref.records().size());
  for (size_t s = 0; s < ref.records().size(); ++s) {
    const train::StepRecord &a = run.records()[s], &b = ref.records()[s];
    same(a.loss, b.loss, "loss", s);
    same(a.grad_norm, b.grad_norm, "gradient norm", s);
    same(a.expert_balance, b.expert_balance, "expert balance", s);
  }
  if (kRowExactGemm)
    EXPECT_EQ(0, std::memcmp(run.model().param_data(), ref.model().param_data(),
                             sizeof(float) * size_t(ref.model().num_params())))
        << "the weights differ from the reference run";
  else
    EXPECT_LE(relative_l2(run.model().param_arena(), ref.model().param_arena()), 1e-6);
}

// The relative L2 error of every tensor of two checkpoints' states.
inline double worst_difference(const CheckpointState& a, const CheckpointState& b) {
  double worst = 0;
  using List = NamedTensors CheckpointState::*;
  for (List list : {&CheckpointState::params, &CheckpointState::adam_m, &CheckpointState::adam_v}) {
    const NamedTensors &x = a.*list, &y = b.*list;
    EXPECT_EQ(x.size(), y.size());
    for (size_t i = 0; i < std::min(x.size(), y.size()); ++i) {
      EXPECT_EQ(x[i].first, y[i].first);
      worst = std::max(worst, relative_l2(x[i].second, y[i].second));
    }
  }
  return worst;
}

}  // namespace coremesh::test_support
