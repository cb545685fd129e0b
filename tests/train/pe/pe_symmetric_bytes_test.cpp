// ParallelPlan::symmetric_bytes, the heap a layout's PEs are started with
// (`coremesh train` sizes the job by it, --dry-run prints it), covers what
// the layout allocates in the symmetric heap: the model's arenas, AdamW's
// state, gradient sync, the executor's buffers and signals, the seams'.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "coremesh/shmem/heap.hpp"
#include "coremesh/shmem/shmem.hpp"
#include "coremesh/train/trainer.hpp"
#include "train/pe/tiny_training.hpp"

using namespace coremesh;
using namespace coremesh::train;
using namespace coremesh::test_support;

namespace {

struct Layout {
  std::string name;
  parallel::ParallelConfig p;
};

std::vector<Layout> layouts(int n) {
  auto with = [](auto edit) {
    parallel::ParallelConfig p;
    edit(p);
    return p;
  };
  if (n == 2)
    return {{"dp 2", with([](auto& p) { p.dp = 2; })},
            {"dp 2 zero 1", with([](auto& p) { p.dp = 2, p.zero = 1; })},
            {"ep 2", with([](auto& p) { p.ep = 2; })},
            {"tp 2 sp", with([](auto& p) { p.tp = 2, p.sequence_parallel = true; })},
            {"cp 2", with([](auto& p) { p.cp = 2; })},
            {"pp 2 1f1b", with([](auto& p) { p.pp = 2; })},
            {"pp 2 dualpipe", with([](auto& p) { p.pp = 2, p.schedule = parallel::PipelineSchedule::dualpipe; })}};
  if (n == 4)
    return {{"dp 2 ep 2 zero 1", with([](auto& p) { p.dp = 2, p.ep = 2, p.zero = 1; })},
            {"pp 2 tp 2", with([](auto& p) { p.pp = 2, p.tp = 2; })},
            {"pp 2 ep 2", with([](auto& p) { p.pp = 2, p.ep = 2; })}};
  return {};
}

}  // namespace

TEST(SymmetricBytes, CoverWhatTheLayoutAllocates) {
  const int n = shmem::n_pes();
  const std::vector<Layout> all = layouts(n);
  if (all.empty()) GTEST_SKIP() << "layouts at 2 and 4 PEs";
  for (const Layout& L : all) {
    SCOPED_TRACE(L.name);
    TrainConfig c = base_config();
    c.parallel = L.p;
    c.steps = 2, c.grad_accum = L.p.pp > 1 ? 4 : 1, c.out_dir = job_dir("symmetric_bytes");
    if (L.p.cp > 1) c.model.aux_loss_alpha = 0;
    const int64_t need = parallel::ParallelPlan::symmetric_bytes(plan_config(c), n);
    shmem::barrier();
    const auto& heap = shmem::SymmetricHeap::instance();
    const int64_t before = int64_t(heap.stats().used);
    int64_t most = 0;
    {
      Trainer t(c, one_core());
      most = int64_t(heap.stats().used) - before;
      t.run(-1, false);
      most = std::max(most, int64_t(heap.stats().used) - before);
      shmem::barrier();
    }
    const int64_t counted = need - parallel::ParallelPlan::kHeapSlack;  // what the size's terms count
    EXPECT_LE(most, counted) << "the layout allocated " << most << " bytes, symmetric_bytes() counts " << counted;
    if (shmem::my_pe() == 0)
      std::printf("[%s] symmetric heap: %.2f MiB allocated, %.2f MiB counted (+ %lld MiB slack)\n", L.name.c_str(),
                  double(most) / (1 << 20), double(counted) / (1 << 20),
                  static_cast<long long>(parallel::ParallelPlan::kHeapSlack >> 20));
  }
}
