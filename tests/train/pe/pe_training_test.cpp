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

#include "coremesh/shmem/shmem.hpp"
#include "coremesh/train/trainer.hpp"
#include "train/pe/tiny_training.hpp"

using namespace coremesh;
using namespace coremesh::train;
using namespace coremesh::test_support;

namespace {

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
    one.out_dir = job_dir("training_one") + "_" + std::to_string(shmem::my_pe());
    Trainer ref(one, one_core());
    ref.run(-1, false);

    TrainConfig par = base_config();
    par.parallel.dp = L.dp, par.parallel.ep = L.ep, par.parallel.zero = L.zero;
    par.out_dir = job_dir("training_par");
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
      worst_weight = std::max(worst_weight, relative_l2(mine, want));
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

// A setting that differs between PEs (a Python script's seed per PE) is
// refused on every PE with its name; paths and core counts may differ; the
// PEs stay in step (a run after the refusal trains).
TEST(ParallelTraining, RefusesSettingsThatDifferBetweenPes) {
  if (shmem::n_pes() != 2) GTEST_SKIP() << "at 2 PEs";
  const int me = shmem::my_pe();
  TrainConfig c = base_config();
  c.parallel.dp = 2, c.steps = 2;
  c.seed = 7 + me, c.lr = me ? 3e-3 : 2e-3;
  expect_refused(c, "train.seed (here " + std::to_string(7 + me) + ")");
  expect_refused(c, "train.lr");
  c.seed = 7, c.lr = 3e-3;
  c.log_every = 10 + me;
  c.data = {me ? "/tmp/./" + corpus().substr(5) : corpus()};  // another path to the same file
  c.out_dir = job_dir("differing_settings");
  Trainer t(c, one_core());
  t.run(-1, false);
  EXPECT_EQ(t.records().size(), 2u);
}

// A checkpoint written under one layout holds the 1-PE model's tensors (the
// same names and values as one PE's checkpoint) and resumes under another.
TEST(ParallelTraining, CheckpointsMoveBetweenLayouts) {
  const int n = shmem::n_pes(), me = shmem::my_pe();
  int round = 0;
  for (const Resume& R : resumes(n)) {
    // each round's runs in their own directories: a run refuses another run's checkpoints
    const auto dir = [&](const std::string& name) { return job_dir(name + std::to_string(round)); };
    ++round;
    SCOPED_TRACE(::testing::Message() << "dp " << R.from.dp << " ep " << R.from.ep << " zero " << R.from.zero
                                      << " -> " << (R.to.dp ? "" : "one PE ") << "dp " << R.to.dp << " ep " << R.to.ep
                                      << " zero " << R.to.zero);
    const int ranks = R.from.dp * R.from.ep;
    const std::string local = dir("ckpt") + "_" + std::to_string(me);
    // The 1-PE reference: 10 steps straight, and its checkpoint at step 5.
    Trainer ref(layout_config({0, 0, 0, true}, ranks, local + "_ref"), one_core());
    const std::string ref5 = ref.run(5, true).checkpoint;
    ref.run(-1, false);
    // Layout `from` for 5 steps: its checkpoint is the 1-PE one.
    std::string ckpt;
    {
      Trainer a(layout_config(R.from, ranks, dir("ckpt_from")), one_core());
      ckpt = a.run(5, true).checkpoint;
    }
    const double saved = worst_difference(load_checkpoint(ckpt), load_checkpoint(ref5));
    if (R.from.exact) {
      EXPECT_EQ(saved, 0.0) << "the checkpoint differs from the 1-PE checkpoint";
    }
    EXPECT_LE(saved, 1e-5);
    // Layout `to` resumes it and trains 5 more steps.
    const bool one = R.to.dp == 0;
    Trainer b(layout_config(R.to, ranks, one ? local + "_to" : dir("ckpt_to")), one_core());
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
      Trainer straight(layout_config(R.from, ranks, dir("ckpt_straight")), one_core());
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
