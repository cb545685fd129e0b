// Graph mode under the parallel layouts (issue: graph mode): the captured
// step holds the on-stream communication (data-parallel sums on the comm
// stream, expert dispatch and combine, ZeRO-1's all-gather), and replaying
// it is the eager run bit for bit: every loss, gradient norm and expert
// balance, the weights and router biases, over 8 steps with an eager
// validation between replays.
#include <gtest/gtest.h>

#include <cstring>

#include "coremesh/shmem/shmem.hpp"
#include "coremesh/train/trainer.hpp"
#include "train/pe/tiny_training.hpp"

using namespace coremesh;
using namespace coremesh::train;
using namespace coremesh::test_support;

namespace {

struct Layout {
  int dp, ep, zero;
};

std::vector<Layout> graph_layouts(int n) {
  switch (n) {
    case 2: return {{2, 1, 0}, {1, 2, 0}, {2, 1, 1}};
    case 3: return {{3, 1, 1}};
    case 4: return {{2, 2, 1}};
    default: return {};
  }
}

}  // namespace

TEST(GraphTraining, ReplaysTheEagerRunBitForBit) {
  for (const Layout& L : graph_layouts(shmem::n_pes())) {
    SCOPED_TRACE(::testing::Message() << "dp " << L.dp << " ep " << L.ep << " zero " << L.zero);
    TrainConfig c = base_config();
    c.parallel.dp = L.dp, c.parallel.ep = L.ep, c.parallel.zero = L.zero;
    c.steps = 8, c.val_every = 4, c.val_batches = 2;
    c.out_dir = job_dir("graph_eager");
    Trainer eager(c, one_core());
    eager.run(-1, false);

    c.graph = true;
    c.out_dir = job_dir("graph_replay");
    Trainer graph(c, one_core());
    graph.run(-1, false);
    EXPECT_EQ(graph.graph_summary().step, 2);
    EXPECT_GT(graph.graph_summary().captured_kernels, 100);

    ASSERT_EQ(graph.records().size(), eager.records().size());
    for (size_t s = 0; s < eager.records().size(); ++s) {
      const StepRecord &a = graph.records()[s], &b = eager.records()[s];
      EXPECT_EQ(a.loss, b.loss) << "step " << s;
      EXPECT_EQ(a.grad_norm, b.grad_norm) << "step " << s;
      EXPECT_EQ(a.expert_balance, b.expert_balance) << "step " << s;
    }
    ASSERT_EQ(graph.validation().size(), eager.validation().size());
    for (size_t v = 0; v < eager.validation().size(); ++v)
      EXPECT_EQ(graph.validation()[v].loss, eager.validation()[v].loss);
    EXPECT_EQ(0, std::memcmp(graph.model().param_data(), eager.model().param_data(),
                             sizeof(float) * size_t(eager.model().num_params())))
        << "the weights differ from the eager run";
    const auto want = eager.model().named_buffers(), got = graph.model().named_buffers();
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i)
      EXPECT_EQ(0, std::memcmp(got[i].second.raw_data(), want[i].second.raw_data(), got[i].second.nbytes()))
          << got[i].first;
    if (shmem::my_pe() == 0)
      std::printf("[graph dp %d ep %d zero %d] %s; 8 steps bit-identical to eager\n", L.dp, L.ep, L.zero,
                  describe(graph.graph_summary()).c_str());
    shmem::barrier();
  }
}
