// Sequence parallelism (Megatron-LM SP on top of tensor parallelism).
//
// Seam level, at every PE count (the world is one TP group): the halves of
// ShmemTensor against a host reference -- reduce_scatter gives this rank's
// rows [r*N/tp, (r+1)*N/tp) of the members' sum added in member order (bit
// for bit), all_gather every rank's rows in rank order -- over rounds that
// reuse the buffers, at a width whose shards are not multiples of 16; the
// seam's calls map onto them; bytes put follow the formula; two gathers in a
// row are refused.
//
// Model level: tp = 2 with sequence parallelism (and at 4 PEs tp 2 x ep 2
// with ZeRO-1, tp 2 x cp 2, tp 2 x dp 2; at 8 cp 2 x ep 2 x tp 2 with ZeRO-1) reproduce the 1-PE run over 10 steps (per-step losses within 1e-5
// relative, final weights within 1e-4), and layouts it cannot run are
// refused at start with what to change. The backward's TP sums overlapping
// the weight gradients on the comm stream give every bit of the in-order run.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cstring>
#include <random>

#include "coremesh/parallel/tensor_parallel.hpp"
#include "coremesh/runtime/stream.hpp"
#include "coremesh/shmem/shmem.hpp"
#include "coremesh/train/checkpoint.hpp"
#include "coremesh/train/trainer.hpp"
#include "train/pe/tiny_training.hpp"

using namespace coremesh;
using namespace coremesh::train;
using namespace coremesh::test_support;

namespace {

// PE `pe`'s element i at round `step`.
float value_of(int pe, int64_t i, int step) {
  std::mt19937 rng(uint32_t(pe * 100003 + i * 7 + step * 31));
  return std::uniform_real_distribution<float>(-1.0f, 1.0f)(rng) * float(1 + i % 5);
}

Tensor values(int pe, int64_t rows, int64_t cols, int step, int64_t first = 0) {
  Tensor t = Tensor::empty({rows, cols});
  for (int64_t i = 0; i < rows * cols; ++i) t.data<float>()[i] = value_of(pe, first + i, step);
  return t;
}

int mismatches(const Tensor& got, const std::vector<float>& want) {
  EXPECT_EQ(got.numel(), int64_t(want.size()));
  int bad = 0;
  for (int64_t i = 0; i < std::min<int64_t>(got.numel(), int64_t(want.size())); ++i)
    bad += std::memcmp(got.data<float>() + i, &want[size_t(i)], 4) != 0;
  return bad;
}

}  // namespace

TEST(SequenceParallel, GathersAndScattersTheRanksRows) {
  const int me = shmem::my_pe(), tp = shmem::n_pes();
  const int64_t rows = 3 * tp, C = 5, N = rows, other = 2 * N;  // shards of 15 floats: not cut at 16
  std::vector<int> world;
  for (int p = 0; p < tp; ++p) world.push_back(p);
  parallel::ShmemTensor seam(parallel::Group::of(world, me), {N * C, other}, /*sequence_parallel=*/true);
  runtime::Stream stream;
  runtime::StreamGuard on(stream);
  const int64_t lo = me * N / tp, hi = (me + 1) * N / tp;
  for (int step = 0; step < 3; ++step) {
    SCOPED_TRACE(fmt::format("round {}", step));
    // exit = reduce-scatter: my rows of the members' parts summed in member order
    const Tensor part = values(me, N, C, step);
    const int64_t before = seam.bytes_put();
    const Tensor mine = step % 2 ? seam.reduce_scatter(part) : seam.exit(part);
    const int64_t scattered = seam.bytes_put() - before;
    // all_reduce of another size between the halves leaves them alone
    const Tensor summed = seam.all_reduce(values(me, other, 1, step));
    // enter = all-gather: every rank's rows, in rank order
    const Tensor shard = values(me, hi - lo, C, step + 10, lo * C);
    const Tensor whole = step % 2 ? seam.all_gather(shard) : seam.enter(shard);
    const int64_t gathered = seam.bytes_put() - before - scattered - parallel::ShmemTensor::bytes_per_all_reduce(tp, other);
    stream.synchronize();

    std::vector<float> want_mine, want_whole, want_sum;
    for (int64_t i = lo * C; i < hi * C; ++i) {
      float s = value_of(0, i, step);
      for (int p = 1; p < tp; ++p) s += value_of(p, i, step);
      want_mine.push_back(s);
    }
    for (int p = 0; p < tp; ++p)
      for (int64_t i = p * N / tp * C; i < (p + 1) * N / tp * C; ++i) want_whole.push_back(value_of(p, i, step + 10));
    for (int64_t i = 0; i < other; ++i) {
      float s = value_of(0, i, step);
      for (int p = 1; p < tp; ++p) s += value_of(p, i, step);
      want_sum.push_back(s);
    }
    EXPECT_EQ(mine.shape(), Shape({N / tp, C}));
    EXPECT_EQ(whole.shape(), Shape({N, C}));
    EXPECT_EQ(mismatches(mine, want_mine), 0);
    EXPECT_EQ(mismatches(whole, want_whole), 0);
    EXPECT_EQ(mismatches(summed, want_sum), 0);
    EXPECT_EQ(scattered, parallel::ShmemTensor::bytes_per_half(tp, N * C));
    EXPECT_EQ(gathered, parallel::ShmemTensor::bytes_per_half(tp, N * C));
    // the backward's mirrors: enter_backward scatters, exit_backward gathers
    const Tensor dx = seam.enter_backward(part), dy = seam.exit_backward(shard);
    stream.synchronize();
    EXPECT_EQ(mismatches(dx, want_mine), 0);
    EXPECT_EQ(mismatches(dy, want_whole), 0);
    // sequence_shard: my rows of a tensor every rank holds whole
    const Tensor rows_of = seam.sequence_shard(part);
    EXPECT_EQ(rows_of.shape(), Shape({N / tp, C}));
    EXPECT_EQ(std::memcmp(rows_of.data<float>(), part.data<float>() + lo * C, size_t(rows_of.numel()) * 4), 0);
  }
  if (tp > 1) {
    // a gather right after a gather would overwrite rows a peer has not read
    EXPECT_THROW(seam.exit_backward(values(me, hi - lo, C, 0)), InvalidArgument);
    EXPECT_THROW(seam.reduce_scatter(values(me, N + 1, C, 0)), InvalidArgument);  // a size it was not set up for
  }
  shmem::barrier();
}

namespace {

struct Layout {
  int dp = 1, cp = 1, ep = 1, tp = 1, zero = 0;
};

TrainConfig sp_config(const Layout& L, const std::string& dir) {
  TrainConfig c = base_config();
  if (L.cp > 1) c.model.capacity_factor = 0.0f, c.model.aux_loss_alpha = 0.0f;  // CP refuses them
  c.parallel.dp = L.dp, c.parallel.cp = L.cp, c.parallel.ep = L.ep, c.parallel.tp = L.tp, c.parallel.zero = L.zero;
  c.parallel.sequence_parallel = L.tp > 1;
  c.out_dir = dir;
  return c;
}

}  // namespace

TEST(SequenceParallel, ReproducesTheOnePeRun) {
  const int n = shmem::n_pes();
  std::vector<Layout> layouts;
  if (n == 2) layouts = {{.tp = 2}};
  if (n == 4) layouts = {{.ep = 2, .tp = 2, .zero = 1}, {.cp = 2, .tp = 2}, {.dp = 2, .tp = 2}};
  if (n == 8) layouts = {{.cp = 2, .ep = 2, .tp = 2, .zero = 1}};
  if (layouts.empty()) GTEST_SKIP() << "layouts at 2, 4 and 8 PEs";
  for (const Layout& L : layouts) {
    const std::string what =
        fmt::format("dp {} cp {} ep {} tp {} zero {}, sequence parallel", L.dp, L.cp, L.ep, L.tp, L.zero);
    SCOPED_TRACE(what);
    TrainConfig one = sp_config({.cp = L.cp}, job_dir("sp_training_one") + "_" + std::to_string(shmem::my_pe()));
    one.parallel.cp = 1, one.grad_accum = L.dp * L.ep;  // the dp and ep ranks read different micro-batches
    Trainer ref(one, one_core());
    ref.run(-1, false);
    Trainer t(sp_config(L, job_dir("sp_training_par")), one_core());
    t.run(-1, false);
    const double worst_loss = worst_loss_difference(t, ref, 1e-5);
    double worst_w = 0;
    for (const model::ParamInfo& p : t.model().params()) {
      const double e = relative_l2(t.model().param(p.name), model::held_part(p, ref.model().param(p.name)));
      EXPECT_LE(e, 1e-4) << p.name;
      worst_w = std::max(worst_w, e);
    }
    if (shmem::my_pe() == 0)
      std::printf("[%s] 10 steps: worst loss rel diff %.2e, worst weight rel err %.2e\n", what.c_str(), worst_loss,
                  worst_w);
    shmem::barrier();
  }
}

TEST(SequenceParallel, RefusesWhatItCannotSplit) {
  if (shmem::n_pes() != 2) GTEST_SKIP() << "one set of checks at 2 PEs";
  const auto refused = expect_refused;
  TrainConfig c = sp_config({.tp = 2}, "");
  c.parallel.tp = 1, c.parallel.dp = 2;
  refused(c, "sequence_parallel splits the tokens over the tensor-parallel ranks: set tp to 2 or more");
  c = sp_config({.tp = 2}, ""), c.batch_size = 1, c.seq_len = 31;
  refused(c, "sequence_parallel splits a micro-batch's 31 tokens (batch_size 1 x seq_len 31 / cp 1) over tp 2");
  c = sp_config({.tp = 2}, ""), c.parallel.pp = 2;
  refused(c, "set sequence_parallel false or pp to 1");  // pipelines take tp, not SP
  shmem::barrier();
}

// The backward's TP sums on the comm stream, overlapping the weight
// gradients (tp_comm_overlap, the default), compute exactly what they compute
// in order: every loss and every weight bit for bit, with and without SP.
TEST(TensorParallelOverlap, IsBitIdenticalToInOrder) {
  if (shmem::n_pes() != 2) GTEST_SKIP() << "at 2 PEs";
  struct Run {
    std::vector<double> losses;
    std::vector<float> weights;  // every parameter this PE holds, in layout order
  };
  auto run = [](bool sp, bool overlap) {
    TrainConfig c = sp_config({.tp = 2}, job_dir(overlap ? "tp_overlap_on" : "tp_overlap_off"));
    c.parallel.sequence_parallel = sp, c.parallel.tp_comm_overlap = overlap, c.steps = 4;
    Trainer t(c, one_core());
    t.run(-1, false);
    Run r;
    for (const auto& s : t.records()) r.losses.push_back(s.loss);
    for (const model::ParamInfo& p : t.model().params()) {
      const auto w = t.model().param(p.name).to_float_vector();
      r.weights.insert(r.weights.end(), w.begin(), w.end());
    }
    return r;
  };
  for (bool sp : {false, true}) {
    SCOPED_TRACE(sp ? "sequence parallel" : "tensor parallel");
    const Run overlapped = run(sp, true), in_order = run(sp, false);
    ASSERT_EQ(overlapped.losses.size(), in_order.losses.size());
    for (size_t s = 0; s < in_order.losses.size(); ++s)
      EXPECT_EQ(overlapped.losses[s], in_order.losses[s]) << "step " << s;
    ASSERT_EQ(overlapped.weights.size(), in_order.weights.size());
    EXPECT_EQ(std::memcmp(overlapped.weights.data(), in_order.weights.data(), in_order.weights.size() * 4), 0)
        << "the weights differ";
    shmem::barrier();
  }
}

// A checkpoint written under sequence parallelism with ZeRO-1 (the norms'
// and routers' AdamW moments sharded over the TP ranks) holds the 1-PE
// model's tensors.
TEST(SequenceParallel, CheckpointsHoldTheWholeModel) {
  if (shmem::n_pes() != 2) GTEST_SKIP() << "at 2 PEs";
  TrainConfig one = sp_config({}, job_dir("sp_ckpt_ref") + "_" + std::to_string(shmem::my_pe()));
  one.steps = 3;
  Trainer ref(one, one_core());
  const std::string ref3 = ref.run(3, true).checkpoint;
  TrainConfig c = sp_config({.tp = 2, .zero = 1}, job_dir("sp_ckpt"));
  c.steps = 3;
  Trainer t(c, one_core());
  const std::string ckpt = t.run(3, true).checkpoint;
  const double saved = worst_difference(load_checkpoint(ckpt), load_checkpoint(ref3));
  EXPECT_LE(saved, 1e-5) << "the SP checkpoint differs from the 1-PE checkpoint";
  if (shmem::my_pe() == 0) std::printf("[tp 2 zero 1, sequence parallel] checkpoint %.1e from the 1-PE one\n", saved);
  shmem::barrier();
}
