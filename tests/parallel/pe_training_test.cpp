// Parallel training reproduces the 1-PE run (DESIGN.md §7): at this job's PE
// count, every data/expert-parallel layout (ZeRO-1 off and on) trains 10
// steps and is compared with one PE accumulating the same global batch
// (grad_accum = data ranks), computed on every PE. The model has capacity
// drops, the sequence-wise balance loss and router-bias updates.
//   bit-identical: data parallelism, with or without ZeRO-1 (the same sums in
//     the same order, the norm from the same chunk partials);
//   within 1e-6 (losses) and 1e-5 (weights): expert parallelism, whose
//     gradient norm sums the arena's chunks of another layout.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>

#include "coremesh/runtime/device.hpp"
#include "coremesh/shmem/shmem.hpp"
#include "coremesh/train/trainer.hpp"

using namespace coremesh;
using namespace coremesh::train;

namespace {

runtime::Device& one_core() {
  static runtime::Device device(runtime::DeviceOptions{.cores = 1, .pin = false});
  return device;
}

// Written once per job (a file another PE has mapped must not be rewritten).
std::string corpus() {
  static bool written = false;
  const std::string path = "/tmp/coremesh_pe_training_corpus_" + std::to_string(shmem::n_pes()) + ".txt";
  if (written) return path;
  written = true;
  if (shmem::my_pe() == 0) {
    std::ofstream out(path);
    const char* words[] = {"in the beginning ", "god created ", "the heaven ", "and the earth. ",
                           "and the earth was ", "without form, ", "and void; ", "and darkness "};
    uint64_t x = 7;
    for (int i = 0; i < 4000; ++i) {
      x = x * 6364136223846793005ULL + 1442695040888963407ULL;
      out << words[(x >> 33) % 8];
    }
  }
  shmem::barrier();
  return path;
}

TrainConfig base_config() {
  TrainConfig c;
  c.model.vocab_size = 256, c.model.d_model = 32, c.model.n_layers = 2, c.model.n_heads = 4;
  c.model.n_kv_heads = 2, c.model.max_seq_len = 32, c.model.first_k_dense = 1, c.model.dense_hidden = 64;
  c.model.n_routed_experts = 8, c.model.top_k = 2, c.model.expert_hidden = 16, c.model.n_shared_experts = 1;
  c.model.gating = model::Gating::sigmoid, c.model.capacity_factor = 1.0f;
  c.model.bias_update_rate = 1e-3f, c.model.aux_loss_alpha = 1e-3f;
  c.data = {corpus()};
  c.batch_size = 2, c.seq_len = 32, c.grad_accum = 1, c.steps = 10;
  c.lr = 3e-3, c.min_lr = 3e-4, c.warmup_steps = 2, c.adam.grad_clip = 0.5;  // clipping active
  c.val_every = 0, c.cores = 1, c.progress = false, c.report = false, c.sample_tokens = 0;
  return c;
}

struct Layout {
  int dp, ep, zero;
  bool exact;
};

std::vector<Layout> layouts(int n) {
  switch (n) {
    case 2: return {{2, 1, 0, true}, {2, 1, 1, true}, {1, 2, 0, false}, {1, 2, 1, false}};
    case 3: return {{3, 1, 0, true}, {3, 1, 1, true}};
    case 4: return {{1, 4, 0, false}, {2, 2, 0, false}, {2, 2, 1, false}, {4, 1, 1, true}};
    default: return {};
  }
}

double rel(double a, double b) { return std::fabs(a - b) / std::max(std::fabs(b), 1e-30); }

}  // namespace

TEST(ParallelTraining, ReproducesTheOnePeRun) {
  const int n = shmem::n_pes();
  for (const Layout& L : layouts(n)) {
    SCOPED_TRACE(::testing::Message() << "dp " << L.dp << " ep " << L.ep << " zero " << L.zero);
    TrainConfig one = base_config();
    one.grad_accum = L.dp * L.ep;  // the same global batch on one PE
    one.out_dir = "/tmp/coremesh_pe_training_one_" + std::to_string(shmem::my_pe());
    Trainer ref(one, one_core());
    ref.run(-1, false);

    TrainConfig par = base_config();
    par.parallel.dp = L.dp, par.parallel.ep = L.ep, par.parallel.zero = L.zero;
    par.out_dir = "/tmp/coremesh_pe_training_par";
    Trainer t(par, one_core());
    t.run(-1, false);

    ASSERT_EQ(t.records().size(), ref.records().size());
    double worst_loss = 0;
    for (size_t s = 0; s < ref.records().size(); ++s) {
      const StepRecord &a = t.records()[s], &b = ref.records()[s];
      if (L.exact) {
        EXPECT_EQ(a.loss, b.loss) << "step " << s;
        EXPECT_EQ(a.grad_norm, b.grad_norm) << "step " << s;
      }
      worst_loss = std::max(worst_loss, rel(a.loss, b.loss));
      EXPECT_LE(rel(a.loss, b.loss), 1e-6) << "step " << s;
      EXPECT_EQ(a.expert_balance, b.expert_balance) << "step " << s << ": the global expert load";
    }
    // Every parameter this PE holds (its experts' slice) against the 1-PE weights.
    double worst_weight = 0;
    int different = 0;
    for (const auto& p : t.model().params()) {
      Tensor mine = t.model().param(p.name), want = ref.model().param(p.name);
      if (p.expert()) want = want.slice(0, p.expert_begin, p.expert_begin + p.shape[0]).contiguous();
      different += std::memcmp(mine.raw_data(), want.raw_data(), mine.nbytes()) != 0;
      const auto x = mine.to_float_vector(), y = want.to_float_vector();
      double num = 0, den = 0;
      for (size_t i = 0; i < x.size(); ++i) num += (x[i] - y[i]) * double(x[i] - y[i]), den += double(y[i]) * y[i];
      worst_weight = std::max(worst_weight, std::sqrt(num / std::max(den, 1e-30)));
    }
    if (L.exact) {
      EXPECT_EQ(different, 0) << "parameters differ from the 1-PE run";
    }
    EXPECT_LE(worst_weight, 1e-5);
    // Router biases: the same global load on every PE, the same update.
    const auto want_buffers = ref.model().named_buffers(), buffers = t.model().named_buffers();
    ASSERT_EQ(buffers.size(), want_buffers.size());
    for (size_t i = 0; i < want_buffers.size(); ++i) {
      const auto& [name, b] = buffers[i];
      EXPECT_EQ(name, want_buffers[i].first);
      EXPECT_EQ(0, std::memcmp(b.raw_data(), want_buffers[i].second.raw_data(), b.nbytes())) << name;
    }
    if (shmem::my_pe() == 0)
      std::printf("[dp %d ep %d zero %d] 10 steps: worst loss rel diff %.2e, worst weight rel err %.2e, "
                  "%d tensors not bit-identical; loss %.4f -> %.4f, grad norm %.3f -> %.3f (clip 0.5)\n",
                  L.dp, L.ep, L.zero, worst_loss, worst_weight, different, ref.records().front().loss,
                  ref.records().back().loss, ref.records().front().grad_norm, ref.records().back().grad_norm);
    shmem::barrier();
  }
}

namespace {

// The relative L2 error of every tensor of two checkpoints' states.
double worst_difference(const CheckpointState& a, const CheckpointState& b) {
  double worst = 0;
  using List = NamedTensors CheckpointState::*;
  for (List list : {&CheckpointState::params, &CheckpointState::adam_m, &CheckpointState::adam_v}) {
    const NamedTensors &x = a.*list, &y = b.*list;
    EXPECT_EQ(x.size(), y.size());
    for (size_t i = 0; i < std::min(x.size(), y.size()); ++i) {
      EXPECT_EQ(x[i].first, y[i].first);
      const auto u = x[i].second.to_float_vector(), v = y[i].second.to_float_vector();
      double num = 0, den = 0;
      for (size_t k = 0; k < u.size(); ++k) num += (u[k] - v[k]) * double(u[k] - v[k]), den += double(v[k]) * v[k];
      worst = std::max(worst, std::sqrt(num / std::max(den, 1e-30)));
    }
  }
  return worst;
}

struct Resume {
  Layout from, to;  // to.dp == 0: one PE (inside the job), accumulating the same global batch
};

std::vector<Resume> resumes(int n) {
  switch (n) {
    case 2: return {{{2, 1, 1, true}, {1, 2, 0, false}}, {{1, 2, 1, false}, {0, 0, 0, false}}, {{1, 2, 1, false}, {1, 2, 1, false}}};
    case 3: return {{{3, 1, 1, true}, {0, 0, 0, true}}};
    case 4: return {{{2, 2, 1, false}, {1, 4, 0, false}}, {{2, 2, 1, false}, {0, 0, 0, false}}, {{2, 2, 1, false}, {2, 2, 1, false}}};
    default: return {};
  }
}

TrainConfig layout_config(const Layout& L, int ranks, const std::string& dir) {
  TrainConfig c = base_config();
  if (L.dp > 0) c.parallel.dp = L.dp, c.parallel.ep = L.ep, c.parallel.zero = L.zero;
  else c.grad_accum = ranks;  // one PE
  c.out_dir = dir;
  return c;
}

}  // namespace

// A checkpoint written under one layout holds the 1-PE model's tensors (the
// same names and values as one PE's checkpoint) and resumes under another.
TEST(ParallelTraining, CheckpointsMoveBetweenLayouts) {
  const int n = shmem::n_pes(), me = shmem::my_pe();
  for (const Resume& R : resumes(n)) {
    SCOPED_TRACE(::testing::Message() << "dp " << R.from.dp << " ep " << R.from.ep << " zero " << R.from.zero
                                      << " -> " << (R.to.dp ? "" : "one PE ") << "dp " << R.to.dp << " ep " << R.to.ep
                                      << " zero " << R.to.zero);
    const int ranks = R.from.dp * R.from.ep;
    const std::string local = "/tmp/coremesh_pe_ckpt_" + std::to_string(me);
    // The 1-PE reference: 10 steps straight, and its checkpoint at step 5.
    Trainer ref(layout_config({0, 0, 0, true}, ranks, local + "_ref"), one_core());
    const std::string ref5 = ref.run(5, true).checkpoint;
    ref.run(-1, false);
    // Layout `from` for 5 steps: its checkpoint is the 1-PE one.
    std::string ckpt;
    {
      Trainer a(layout_config(R.from, ranks, "/tmp/coremesh_pe_ckpt_from"), one_core());
      ckpt = a.run(5, true).checkpoint;
    }
    const double saved = worst_difference(load_checkpoint(ckpt), load_checkpoint(ref5));
    if (R.from.exact) {
      EXPECT_EQ(saved, 0.0) << "the checkpoint differs from the 1-PE checkpoint";
    }
    EXPECT_LE(saved, 1e-5);
    // Layout `to` resumes it and trains 5 more steps.
    const bool one = R.to.dp == 0;
    Trainer b(layout_config(R.to, ranks, one ? local + "_to" : "/tmp/coremesh_pe_ckpt_to"), one_core());
    b.resume(ckpt);
    EXPECT_EQ(b.step(), 5);
    b.run(-1, false);
    ASSERT_EQ(b.records().size(), 5u);
    double worst = 0;
    for (size_t s = 0; s < 5; ++s) {
      const double x = b.records()[s].loss, y = ref.records()[5 + s].loss;
      if (R.from.exact && R.to.exact) {
        EXPECT_EQ(x, y) << "step " << 5 + s;
      }
      worst = std::max(worst, rel(x, y));
    }
    EXPECT_LE(worst, 1e-6);
    // The same layout resumes bit-exactly: against that layout's own straight run.
    if (R.to.dp == R.from.dp && R.to.ep == R.from.ep && R.to.zero == R.from.zero) {
      Trainer straight(layout_config(R.from, ranks, "/tmp/coremesh_pe_ckpt_straight"), one_core());
      straight.run(-1, false);
      for (size_t s = 0; s < 5; ++s) EXPECT_EQ(b.records()[s].loss, straight.records()[5 + s].loss) << "step " << 5 + s;
      for (const auto& p : b.model().params())
        EXPECT_EQ(0, std::memcmp(b.model().param(p.name).raw_data(), straight.model().param(p.name).raw_data(),
                                 size_t(p.numel) * 4))
            << p.name;
    }
    if (me == 0)
      std::printf("checkpoint of dp %d ep %d zero %d: %.1e from the 1-PE one; resumed as %s dp %d ep %d: losses "
                  "within %.1e of the 1-PE run\n",
                  R.from.dp, R.from.ep, R.from.zero, saved, one ? "one PE," : "", R.to.dp, R.to.ep, worst);
    shmem::barrier();
  }
}
