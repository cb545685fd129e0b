// Token-sliced MoE replicas (moe_replicas, RFC §2.1): a micro-batch's tokens
// in R slices, each through its own dispatch -> experts -> combine on its own
// stream, the exchanges on a comm stream. The slices compute what one block
// computes, and the experts' weight gradients join the slices' rows in the
// unsliced order, so every layout reproduces its R = 1 run bit for bit: each
// step's loss, gradient norm and expert balance, and the final weights
// (every precision, ZeRO-1, expert-TP, graph mode, pipelines: DualPipe runs
// two chunks on two streams, each with its own slice streams).
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
  int dp, ep, tp, zero, replicas;
  model::Precision precision = model::Precision::f32;
  bool graph = false;
  int comm_cores = 0;
  int pp = 1;  // with 4 micro-batches
  parallel::PipelineSchedule schedule = parallel::PipelineSchedule::one_f_one_b;
};

std::vector<Layout> layouts(int n) {
  using model::Precision;
  switch (n) {
    case 1: return {{1, 1, 1, 0, 2}, {1, 1, 1, 0, 4, Precision::fp8}};
    case 2:
      return {{1, 2, 1, 0, 2}, {1, 2, 1, 0, 4, Precision::bf16, false, 1}, {1, 2, 1, 0, 2, Precision::fp8},
              {1, 2, 1, 0, 2, Precision::f32, true}};
    case 4:
      return {{1, 4, 1, 0, 4},
              {2, 2, 1, 1, 2},
              {1, 2, 2, 0, 2},
              {2, 2, 1, 1, 2, Precision::f32, true},
              {1, 2, 1, 0, 2, Precision::f32, false, 0, 2, parallel::PipelineSchedule::zb_h1},
              {1, 2, 1, 0, 2, Precision::f32, false, 0, 2, parallel::PipelineSchedule::dualpipe}};
    default: return {};
  }
}

std::string name(const Layout& L) {
  return fmt::format("dp {} ep {} tp {} pp {}{} zero {}, {}{}{}, {} replicas", L.dp, L.ep, L.tp, L.pp,
                     L.pp > 1 ? " " + parallel::schedule_name(L.schedule) : "", L.zero,
                     model::precision_name(L.precision), L.graph ? ", graph" : "",
                     L.comm_cores ? fmt::format(", comm_cores {}", L.comm_cores) : "", L.replicas);
}

}  // namespace

TEST(MoeReplicas, ReproduceTheUnslicedRunBitForBit) {
  for (const Layout& L : layouts(shmem::n_pes())) {
    SCOPED_TRACE(name(L));
    TrainConfig c = base_config();
    c.parallel.dp = L.dp, c.parallel.ep = L.ep, c.parallel.tp = L.tp, c.parallel.zero = L.zero;
    c.model.precision = L.precision;
    if (L.pp > 1) c.parallel.pp = L.pp, c.parallel.schedule = L.schedule, c.grad_accum = 4;
    c.graph = L.graph;
    c.steps = 6;
    c.out_dir = job_dir("moe_unsliced");
    Trainer one(c, one_core());
    one.run(-1, false);

    c.parallel.moe_replicas = L.replicas, c.parallel.comm_cores = L.comm_cores;
    c.out_dir = job_dir("moe_sliced");
    Trainer sliced(c, one_core());
    sliced.run(-1, false);

    expect_same_run(sliced, one);
    if (shmem::my_pe() == 0)
      std::printf("[moe replicas: %s] %zu steps %s one slice\n", name(L).c_str(), one.records().size(),
                  kRowExactGemm ? "bit-identical to" : "within 1e-6 of");
    shmem::barrier();
  }
}

TEST(MoeReplicas, RefusesWhatItCannotRun) {
  if (shmem::n_pes() != 1) GTEST_SKIP() << "refusals are checked at 1 PE";
  TrainConfig c = base_config();
  c.parallel.comm_cores = 2;
  expect_refused(c, "set moe_replicas to 2 or more");
  c = base_config();
  c.parallel.moe_replicas = 1000;
  expect_refused(c, "choose at most 64");
  c = base_config();
  c.model.n_routed_experts = 0;
  c.parallel.moe_replicas = 2;
  expect_refused(c, "set moe_replicas to 1");
}
