// Shadowed hot experts (expert_balance shadow | static, issue 27): each
// source computes its own rows of the planned hot experts with the owners'
// weights and returns its weight-gradient parts, which the owner sums in
// source order with its own. Every row is computed with the same weights and
// every sum keeps its order, so a balanced run reproduces expert_balance none
// bit for bit: each step's loss, gradient norm and expert balance, and the
// final weights. The planner is told that shadows cost nothing
// (shadow_cost 0), so it shadows wherever the loads are uneven at all.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "coremesh/shmem/shmem.hpp"
#include "coremesh/train/trainer.hpp"
#include "train/pe/tiny_training.hpp"

using namespace coremesh;
using namespace coremesh::train;
using namespace coremesh::test_support;

namespace {

struct Layout {
  int dp, ep, tp, zero;
  parallel::ExpertBalance balance;
  model::Precision precision = model::Precision::f32;
  bool graph = false;
  int pp = 1;  // with 4 micro-batches
  float capacity = 0;  // 0: no drops, the loads stay uneven
};

std::vector<Layout> layouts(int n) {
  using model::Precision;
  using parallel::ExpertBalance;
  switch (n) {
    case 2:
      return {{1, 2, 1, 0, ExpertBalance::shadow},
              {1, 2, 1, 0, ExpertBalance::static_window, Precision::bf16},
              {1, 2, 1, 0, ExpertBalance::shadow, Precision::f32, true},
              {1, 2, 1, 0, ExpertBalance::shadow, Precision::f32, false, 1, 1.0f}};
    case 4:
      return {{1, 4, 1, 0, ExpertBalance::shadow},
              {2, 2, 1, 1, ExpertBalance::shadow},
              {1, 4, 1, 0, ExpertBalance::static_window, Precision::f32, true},
              {1, 2, 2, 0, ExpertBalance::shadow},
              {1, 2, 1, 0, ExpertBalance::shadow, Precision::f32, false, 2}};
    default: return {};
  }
}

std::string name(const Layout& L) {
  return fmt::format("dp {} ep {} tp {} pp {} zero {}, {}, {}{}{}", L.dp, L.ep, L.tp, L.pp, L.zero,
                     L.balance == parallel::ExpertBalance::shadow ? "shadow" : "static",
                     model::precision_name(L.precision), L.graph ? ", graph" : "",
                     L.capacity > 0 ? fmt::format(", capacity factor {}", L.capacity) : "");
}

}  // namespace

TEST(ExpertBalance, ReproducesTheUnbalancedRunBitForBit) {
  for (const Layout& L : layouts(shmem::n_pes())) {
    SCOPED_TRACE(name(L));
    TrainConfig c = base_config();
    c.parallel.dp = L.dp, c.parallel.ep = L.ep, c.parallel.tp = L.tp, c.parallel.zero = L.zero;
    c.model.precision = L.precision;
    c.model.capacity_factor = L.capacity;
    if (L.pp > 1) c.parallel.pp = L.pp, c.grad_accum = 4;
    c.graph = L.graph;
    c.steps = 10;
    c.out_dir = job_dir("balance_none");
    Trainer none(c, one_core());
    none.run(-1, false);

    c.parallel.expert_balance = L.balance, c.parallel.balance_window = 2, c.parallel.shadow_cost = 0;
    c.out_dir = job_dir("balance_on");
    Trainer balanced(c, one_core());
    balanced.run(-1, false);

    expect_same_run(balanced, none);
    if (shmem::my_pe() == 0)
      std::printf("[expert balance: %s] %zu steps %s none\n", name(L).c_str(), none.records().size(),
                  kRowExactGemm ? "bit-identical to" : "within 1e-6 of");
    shmem::barrier();
  }
}

TEST(ExpertBalance, RefusesWhatItCannotRun) {
  if (shmem::n_pes() != 1) GTEST_SKIP() << "refusals are checked at 1 PE";
  TrainConfig c = base_config();
  c.parallel.expert_balance = parallel::ExpertBalance::shadow;
  expect_refused(c, "set ep to 2 or more");
}
