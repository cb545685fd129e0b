// The fused communication-computation operators (fused_comm.hpp) at every PE
// count, the world one TP group:
//   - each equals its unfused sequence over ShmemTensor bit for bit, and the
//     host's own product of every member's inputs summed in member order (an
//     independent reference: the members' inputs are a function of the PE);
//   - calls in any order, the same operator back to back included, reuse the
//     buffers safely (the alternating halves), over rounds with new values;
//   - bf16 inputs for allgather_matmul; the fp8 forms; sizes past the capacity are refused.
// Bit for bit where the GEMM engine is row-exact (kRowExactGemm), else within 1e-6.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <utility>

#include "coremesh/ops/gemm.hpp"
#include "coremesh/ops/grouped_gemm.hpp"
#include "coremesh/ops/quant.hpp"
#include "coremesh/parallel/fused_comm.hpp"
#include "coremesh/parallel/tensor_parallel.hpp"
#include "coremesh/runtime/op_cache.hpp"
#include "coremesh/runtime/op_registry.hpp"
#include "coremesh/runtime/stream.hpp"
#include "coremesh/shmem/shmem.hpp"

using namespace coremesh;
using namespace coremesh::parallel;

namespace {

// PE `pe`'s tensor `what` at round `step`: the same on every PE that asks.
Tensor values(int pe, int what, int step, Shape shape) {
  Tensor t = Tensor::empty(shape);
  std::mt19937 rng(uint32_t(pe * 1000003 + what * 7919 + step * 31));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = u(rng) * float(1 + i % 5);
  return t;
}

Group world() {
  std::vector<int> pes;
  for (int p = 0; p < shmem::n_pes(); ++p) pes.push_back(p);
  return Group::of(pes, shmem::my_pe());
}

// Our GEMM engine (builds with AVX2 and FMA) computes each row of a product
// the same whatever the number of rows; OpenBLAS (the sanitizer builds) may
// block a product by its row count, and there 1e-6 relative is asked.
#if defined(__AVX2__) && defined(__FMA__)
constexpr bool kRowExactGemm = true;
#else
constexpr bool kRowExactGemm = false;
#endif

// Elements that differ: in their bits, or (not row-exact) by more than 1e-6 of the largest.
int64_t mismatches(const Tensor& got, const Tensor& want) {
  EXPECT_EQ(got.shape(), want.shape());
  if (got.nbytes() != want.nbytes()) return -1;
  const Tensor a = got.contiguous(), b = want.contiguous();
  if (!kRowExactGemm && a.dtype() == DType::f32) {
    float largest = 0;
    for (int64_t i = 0; i < b.numel(); ++i) largest = std::max(largest, std::abs(b.data<float>()[i]));
    int64_t bad = 0;
    for (int64_t i = 0; i < a.numel(); ++i) bad += std::abs(a.data<float>()[i] - b.data<float>()[i]) > 1e-6f * largest;
    return bad;
  }
  int64_t bad = 0;
  const int64_t elem = int64_t(dtype_size(a.dtype()));
  for (int64_t i = 0; i < a.numel(); ++i)
    bad += std::memcmp(static_cast<const char*>(a.raw_data()) + i * elem,
                       static_cast<const char*>(b.raw_data()) + i * elem, size_t(elem)) != 0;
  return bad;
}

// Every member's rows `of(pe)` (each (r, c) f32), stacked in member order.
Tensor stacked(int tp, const std::function<Tensor(int)>& of) {
  const Tensor first = of(0);
  const int64_t r = first.size(0), c = first.size(1);
  Tensor all = Tensor::empty({tp * r, c});
  for (int p = 0; p < tp; ++p) std::memcpy(all.data<float>() + p * r * c, of(p).data<float>(), size_t(r * c) * 4);
  return all;
}

// The members' parts of `make(pe)`'s product with w, summed on the host in member order.
Tensor summed_products(int tp, const std::function<Tensor(int)>& make, const Tensor& w) {
  Tensor sum;
  for (int p = 0; p < tp; ++p) {
    Tensor part = ops::matmul(make(p), w, false, true);
    runtime::current_stream().synchronize();
    if (!sum.defined()) {
      sum = part;
      continue;
    }
    for (int64_t i = 0; i < sum.numel(); ++i) sum.data<float>()[i] = sum.data<float>()[i] + part.data<float>()[i];
  }
  return sum;
}

constexpr int64_t kRowsPerPe = 6, K = 24, F = 20, C = 18;  // widths not multiples of 16

// The operators and their unfused sequences over the whole job (collective:
// every PE makes one in the same order), on a stream of the test's own.
struct Operators {
  const int tp = shmem::n_pes(), me = shmem::my_pe();
  const int64_t N = kRowsPerPe * tp;
  ShmemTensor unfused{world(), {N * C, N * K}, /*sequence_parallel=*/true};
  ShmemTensor unfused_ar{world(), {N * C}, /*sequence_parallel=*/false};
  FusedTensorComm fused{world(), N * std::max(K, C), N, {3, 1}};
  runtime::Stream stream;
  runtime::StreamGuard on{stream};
};

}  // namespace

TEST(FusedComm, EachOperatorEqualsItsUnfusedSequenceBitForBit) {
  Operators ops_under_test;
  auto& [tp, me, N, unfused, unfused_ar, fused, stream, on] = ops_under_test;
  const Tensor wk = values(99, 1, 0, {C, K}), wf = values(99, 2, 0, {C, F}), norm = values(99, 3, 0, {C});
  // the order of calls varies by round; the same operator runs back to back
  const std::vector<std::vector<int>> rounds = {{0, 1, 2, 3}, {2, 2, 0, 0, 3, 1}, {3, 3, 1, 1, 2, 0}};
  bool gathered = false, scattered = false;
  for (size_t round = 0; round < rounds.size(); ++round) {
    int call = 0;
    for (int op : rounds[round]) {
      const int step = int(round) * 10 + call++;
      SCOPED_TRACE(fmt::format("round {} call {} op {}", round, call, op));
      auto rows_of = [&](int pe) { return values(pe, 10, step, {kRowsPerPe, K}); };
      auto part_of = [&](int pe) { return values(pe, 11, step, {N, F}); };
      const Tensor x = rows_of(me), h = part_of(me);
      const Tensor residual = values(77, 12, step, {N, C}), update = values(me, 13, step, {N, C});
      // the unfused sequence-parallel halves of one size must alternate: the
      // gathers (N x K) and scatters (N x C) here get a half of the other kind between them
      if (op == 0 && std::exchange(gathered, true)) unfused.reduce_scatter(Tensor::zeros({N, K}));
      if (op == 1 && std::exchange(scattered, true)) unfused.all_gather(Tensor::zeros({kRowsPerPe, C}));
      if (op == 0) {
        const auto got = fused.allgather_matmul(x, wk);
        const auto want = reference::allgather_matmul(unfused, x, wk);
        // host: every member's rows in member order, one product
        const Tensor all = stacked(tp, rows_of);
        const Tensor host = ops::matmul(all, wk, false, true);
        stream.synchronize();
        EXPECT_EQ(mismatches(got.y, want.y), 0);
        EXPECT_EQ(mismatches(got.gathered, want.gathered), 0);
        EXPECT_EQ(mismatches(got.y, host), 0);
        EXPECT_EQ(mismatches(got.gathered, all), 0);
      } else if (op == 1) {
        const Tensor got = fused.matmul_reduce_scatter(h, wf);
        const Tensor want = reference::matmul_reduce_scatter(unfused, h, wf);
        const Tensor host = summed_products(tp, part_of, wf).slice(0, me * kRowsPerPe, (me + 1) * kRowsPerPe);
        stream.synchronize();
        EXPECT_EQ(mismatches(got, want), 0);
        EXPECT_EQ(mismatches(got, host), 0);
      } else if (op == 2) {
        const Tensor got = fused.matmul_allreduce(h, wf);
        const Tensor want = reference::matmul_allreduce(unfused_ar, h, wf);
        const Tensor host = summed_products(tp, part_of, wf);
        stream.synchronize();
        EXPECT_EQ(mismatches(got, want), 0);
        EXPECT_EQ(mismatches(got, host), 0);
      } else {
        const auto got = fused.add_rmsnorm_allreduce(residual, update, norm, 1e-6f);
        const auto want = reference::add_rmsnorm_allreduce(unfused_ar, residual, update, norm, 1e-6f);
        stream.synchronize();
        EXPECT_EQ(mismatches(got.h, want.h), 0);
        EXPECT_EQ(mismatches(got.y, want.y), 0);
        EXPECT_EQ(mismatches(got.rstd, want.rstd), 0);
      }
    }
  }
}

// Row-major naive product in double, for the backward's independent check:
// a (M, K) times b (K, N), or b^T when b is (N, K) (trans_b).
std::vector<double> host_product(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) {
  const int64_t M = trans_a ? a.size(1) : a.size(0), K = trans_a ? a.size(0) : a.size(1);
  const int64_t Nb = trans_b ? b.size(0) : b.size(1);
  std::vector<double> out(size_t(M * Nb), 0.0);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t k = 0; k < K; ++k) {
      const double av = trans_a ? a.data<float>()[k * a.size(1) + i] : a.data<float>()[i * K + k];
      for (int64_t j = 0; j < Nb; ++j)
        out[size_t(i * Nb + j)] += av * (trans_b ? b.data<float>()[j * K + k] : b.data<float>()[k * Nb + j]);
    }
  return out;
}

// Largest difference from the host's values, relative to their largest.
double relative_gap(const Tensor& got, const std::vector<double>& want) {
  double largest = 0, worst = 0;
  for (double v : want) largest = std::max(largest, std::abs(v));
  for (size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::abs(double(got.data<float>()[i]) - want[i]));
  return worst / std::max(largest, 1e-30);
}

// The backward halves: allgather_matmul's dx is a matmul_reduce_scatter of dy
// with w read as (K, O), matmul_reduce_scatter's dh an allgather_matmul of dy
// (its gathered dy gives dw): bit for bit the unfused sequences, and within
// 1e-5 the host's sums over every member's dy and w (each member its own w,
// as TP ranks hold). The kn forward forms against theirs.
TEST(FusedComm, BackwardHalvesEqualTheirUnfusedSequences) {
  Operators ops_under_test;
  auto& [tp, me, N, unfused, unfused_ar, fused, stream, on] = ops_under_test;
  auto weight = [](int pe, int what) { return values(pe, what, 0, {C, K}); };
  const Tensor w = weight(me, 60);
  bool scattered = false, gathered = false;
  for (int step = 0; step < 3; ++step)
    for (int op : {0, 1, 1, 0}) {
      SCOPED_TRACE(fmt::format("step {} op {}", step, op));
      if (op == 0 && std::exchange(scattered, true)) unfused.all_gather(Tensor::zeros({kRowsPerPe, K}));
      if (op == 1 && std::exchange(gathered, true)) unfused.reduce_scatter(Tensor::zeros({N, C}));
      if (op == 0) {  // y = gather(x) w^T, dy (N, C)
        auto dy_of = [&](int pe) { return values(pe, 61, step, {N, C}); };
        const Tensor gathered_x = values(7, 62, step, {N, K}), dy = dy_of(me);
        const auto got = fused.allgather_matmul_backward(dy, gathered_x, w);
        const auto want = reference::allgather_matmul_backward(unfused, dy, gathered_x, w);
        stream.synchronize();
        EXPECT_EQ(mismatches(got.dx, want.dx), 0);
        EXPECT_EQ(mismatches(got.dw, want.dw), 0);
        std::vector<double> dx(size_t(kRowsPerPe * K), 0.0);
        for (int p = 0; p < tp; ++p) {
          const auto part = host_product(dy_of(p), weight(p, 60), false, false);
          for (size_t i = 0; i < dx.size(); ++i) dx[i] += part[size_t(me * kRowsPerPe * K) + i];
        }
        EXPECT_LE(relative_gap(got.dx, dx), 1e-5);
        EXPECT_LE(relative_gap(got.dw, host_product(dy, gathered_x, true, false)), 1e-5);
      } else {  // y = reduce_scatter(h w^T) with w (C, K): dy (n, C)
        auto dy_of = [&](int pe) { return values(pe, 63, step, {kRowsPerPe, C}); };
        const Tensor h = values(me, 64, step, {N, K}), dy = dy_of(me);
        const auto got = fused.matmul_reduce_scatter_backward(dy, h, w);
        const auto want = reference::matmul_reduce_scatter_backward(unfused, dy, h, w);
        stream.synchronize();
        EXPECT_EQ(mismatches(got.dx, want.dx), 0);
        EXPECT_EQ(mismatches(got.dw, want.dw), 0);
        const Tensor all = stacked(tp, dy_of);
        EXPECT_LE(relative_gap(got.dx, host_product(all, w, false, false)), 1e-5);
        EXPECT_LE(relative_gap(got.dw, host_product(all, h, true, false)), 1e-5);
      }
    }
  // matmul_allreduce's backward needs no exchange: dh = dy w, dw = dy^T h
  const Tensor dy = values(me, 65, 0, {N, C}), h = values(me, 66, 0, {N, K});
  const auto local = FusedTensorComm::matmul_allreduce_backward(dy, h, w);
  // the kn forward: y = all_reduce(h w) with w (K, C)
  const Tensor wkn = values(me, 67, 0, {K, C});
  const Tensor got = fused.matmul_allreduce(h, wkn, ops::WeightLayout::kn);
  const Tensor want = reference::matmul_allreduce(unfused_ar, h, wkn, ops::WeightLayout::kn);
  stream.synchronize();
  EXPECT_LE(relative_gap(local.dx, host_product(dy, w, false, false)), 1e-5);
  EXPECT_LE(relative_gap(local.dw, host_product(dy, h, true, false)), 1e-5);
  EXPECT_EQ(mismatches(got, want), 0);
  // a dy that is not the forward's output shape is refused before anything is put
  EXPECT_THROW(fused.allgather_matmul_backward(Tensor::zeros({N, C + 1}), h, w), InvalidArgument);
  EXPECT_THROW(fused.matmul_reduce_scatter_backward(Tensor::zeros({kRowsPerPe + 1, C}), h, w), InvalidArgument);
  stream.synchronize();
}

TEST(FusedComm, AllgatherMatmulTakesBf16Rows) {
  const int tp = shmem::n_pes(), me = shmem::my_pe();
  const int64_t N = kRowsPerPe * tp;
  FusedTensorComm fused(world(), N * K, N);
  runtime::Stream stream;
  runtime::StreamGuard on(stream);
  const Tensor w = values(99, 1, 0, {C, K}).to(DType::bf16);
  for (int step = 0; step < 2; ++step) {
    const auto got = fused.allgather_matmul(values(me, 20, step, {kRowsPerPe, K}).to(DType::bf16), w);
    const Tensor all = stacked(tp, [&](int p) { return values(p, 20, step, {kRowsPerPe, K}); });
    const Tensor all16 = all.to(DType::bf16);
    const Tensor host = ops::matmul(all16, w, false, true);
    stream.synchronize();
    EXPECT_EQ(got.gathered.dtype(), DType::bf16);
    EXPECT_EQ(mismatches(got.gathered, all16), 0);
    EXPECT_EQ(mismatches(got.y, host), 0);
  }
}

// The fp8 forms against the unfused sequences (gather f32 rows, then
// quantize; the fp8 product, then reduce-scatter or all-reduce), over rounds
// in alternating order; the gathered scales and data bit for bit.
TEST(FusedComm, Fp8FormsEqualTheirUnfusedSequences) {
  Operators ops_under_test;
  auto& [tp, me, N, unfused, unfused_ar, fused, stream, on] = ops_under_test;
  const ops::QuantizedTensor wk = ops::quantize_fp8_weight(values(99, 1, 0, {C, K}));
  const ops::QuantizedTensor wf = ops::quantize_fp8_weight(values(99, 2, 0, {C, F}));
  bool gathered = false, scattered = false;
  for (int step = 0; step < 3; ++step) {
    for (int op : {0, 1, 2, 2, 0, 1}) {
      SCOPED_TRACE(fmt::format("step {} op {}", step, op));
      // the unfused sequence-parallel halves of one size alternate (as in the test above)
      if (op == 0 && std::exchange(gathered, true)) unfused.reduce_scatter(Tensor::zeros({N, K}));
      if (op == 1 && std::exchange(scattered, true)) unfused.all_gather(Tensor::zeros({kRowsPerPe, C}));
      const Tensor x = values(me, 30 + op, step, {kRowsPerPe, K});
      const ops::QuantizedTensor h = ops::quantize_fp8_act(values(me, 40 + op, step, {N, F}));
      if (op == 0) {
        const auto got = fused.allgather_matmul(ops::quantize_fp8_act(x), wk);
        const auto want = reference::allgather_matmul(unfused, x, wk);
        stream.synchronize();
        EXPECT_EQ(got.gathered.data.dtype(), DType::f8e4m3);
        EXPECT_EQ(mismatches(got.gathered.data, want.gathered.data), 0);
        EXPECT_EQ(mismatches(got.gathered.scale, want.gathered.scale), 0);
        EXPECT_EQ(mismatches(got.y, want.y), 0);
      } else if (op == 1) {
        const Tensor got = fused.matmul_reduce_scatter(h, wf);
        const Tensor want = reference::matmul_reduce_scatter(unfused, h, wf);
        stream.synchronize();
        EXPECT_EQ(mismatches(got, want), 0);
      } else {
        const Tensor got = fused.matmul_allreduce(h, wf);
        const Tensor want = reference::matmul_allreduce(unfused_ar, h, wf);
        stream.synchronize();
        EXPECT_EQ(mismatches(got, want), 0);
      }
    }
  }
  // a quantized input past the rows it was sized for is refused before anything is put
  EXPECT_THROW(fused.matmul_allreduce(ops::quantize_fp8_act(Tensor::zeros({2 * N, F})), wf), InvalidArgument);
  stream.synchronize();
}

std::vector<double> as_doubles(const Tensor& t) {
  return {t.data<float>(), t.data<float>() + t.numel()};
}

// The fp8 backward halves (dgrad: dy in 1x128 tiles, w^T in 128x128 blocks;
// wgrad: 1x128 tiles along the tokens) against their unfused sequences, and
// within 1e-5 of the host's double sums over the reference quantizers' values
// (w^T's blocks taken as W's blocks transposed: the blocks are square).
TEST(FusedComm, Fp8BackwardHalvesEqualTheirUnfusedSequences) {
  Operators ops_under_test;
  auto& [tp, me, N, unfused, unfused_ar, fused, stream, on] = ops_under_test;
  auto weight = [](int pe) { return values(pe, 70, 0, {C, K}); };
  auto rounded_weight = [&](int pe) {
    return ops::reference::dequantize_fp8_weight(ops::reference::quantize_fp8_weight(weight(pe)));
  };
  auto rounded_rows = [](const Tensor& t) {
    return ops::reference::dequantize_fp8_act(ops::reference::quantize_fp8_act(t));
  };
  const Tensor w = weight(me);
  bool scattered = false, gathered = false;
  for (int step = 0; step < 2; ++step)
    for (int op : {0, 1, 1, 0}) {
      SCOPED_TRACE(fmt::format("step {} op {}", step, op));
      if (op == 0 && std::exchange(scattered, true)) unfused.all_gather(Tensor::zeros({kRowsPerPe, K}));
      if (op == 1 && std::exchange(gathered, true)) unfused.reduce_scatter(Tensor::zeros({N, C}));
      if (op == 0) {  // y = gather(x) w^T: dy (N, C), the gathered x fp8
        auto dy_of = [&](int pe) { return values(pe, 71, step, {N, C}); };
        const Tensor dy = dy_of(me), x = values(7, 72, step, {N, K});
        const ops::QuantizedTensor x8 = ops::quantize_fp8_act(x);
        const auto got = fused.allgather_matmul_backward(dy, x8, w);
        const auto want = reference::allgather_matmul_backward(unfused, dy, x8, w);
        stream.synchronize();
        EXPECT_EQ(mismatches(got.dx, want.dx), 0);
        EXPECT_EQ(mismatches(got.dw, want.dw), 0);
        std::vector<double> dx(size_t(kRowsPerPe * K), 0.0);
        for (int p = 0; p < tp; ++p) {
          const auto part = host_product(rounded_rows(dy_of(p)), rounded_weight(p), false, false);
          for (size_t i = 0; i < dx.size(); ++i) dx[i] += part[size_t(me * kRowsPerPe * K) + i];
        }
        EXPECT_LE(relative_gap(got.dx, dx), 1e-5);
        EXPECT_LE(relative_gap(got.dw, as_doubles(ops::reference::matmul_fp8_wgrad(dy, rounded_rows(x)))), 1e-5);
      } else {  // y = reduce_scatter(h w^T), h fp8 (N, K): dy (n, C)
        auto dy_of = [&](int pe) { return values(pe, 73, step, {kRowsPerPe, C}); };
        const Tensor dy = dy_of(me), h = values(me, 74, step, {N, K});
        const ops::QuantizedTensor h8 = ops::quantize_fp8_act(h);
        const auto got = fused.matmul_reduce_scatter_backward(dy, h8, w);
        const auto want = reference::matmul_reduce_scatter_backward(unfused, dy, h8, w);
        stream.synchronize();
        EXPECT_EQ(mismatches(got.dx, want.dx), 0);
        EXPECT_EQ(mismatches(got.dw, want.dw), 0);
        const Tensor all = stacked(tp, dy_of);
        const Tensor dy8 = rounded_rows(all);
        EXPECT_LE(relative_gap(got.dx, host_product(dy8, rounded_weight(me), false, false)), 1e-5);
        EXPECT_LE(relative_gap(got.dw, as_doubles(ops::reference::matmul_fp8_wgrad(dy8, rounded_rows(h)))), 1e-5);
      }
    }
  // f32 rows where the forward's fp8 rows belong, or a dy of another shape: refused before anything is put
  const ops::QuantizedTensor h8 = ops::quantize_fp8_act(values(me, 74, 0, {N, K}));
  EXPECT_THROW(fused.matmul_reduce_scatter_backward(Tensor::zeros({kRowsPerPe, C + 1}), h8, w), InvalidArgument);
  EXPECT_THROW(fused.allgather_matmul_backward(Tensor::zeros({N + 1, C}), h8, w), InvalidArgument);
  stream.synchronize();
}

// grouped_matmul_allreduce (expert-TP's w2) in f32, bf16 and fp8 against the
// unfused sequence, and (f32) against the host's sum of every member's grouped
// product: groups that straddle the chunks, an empty one, padding rows past
// the last group (zeros), a new group list each round.
TEST(FusedComm, GroupedMatmulAllreduceEqualsItsUnfusedSequence) {
  const int tp = shmem::n_pes(), me = shmem::my_pe();
  const int64_t N = kRowsPerPe * tp, G = 3;
  ShmemTensor unfused(world(), {N * C}, /*sequence_parallel=*/false);
  FusedTensorComm fused(world(), N * C, N, {3, 1});
  runtime::Stream stream;
  runtime::StreamGuard on(stream);
  const Tensor w = values(99, 5, 0, {G, C, F});
  const ops::QuantizedTensor w8 = ops::quantize_fp8_weight(w);
  for (int step = 0; step < 3; ++step) {
    SCOPED_TRACE(fmt::format("step {}", step));
    const Tensor offsets = Tensor::empty({G + 1}, DType::i64);
    const int64_t cut = 1 + step * N / 4;  // group 1 empty in step 0
    const std::vector<int64_t> ends = {0, cut, step == 0 ? cut : std::min(cut + N / 3, N - step), N - step};
    std::copy(ends.begin(), ends.end(), offsets.data<int64_t>());
    auto part_of = [&](int pe) { return values(pe, 50, step, {N, F}); };
    const Tensor h = part_of(me);
    const Tensor got = fused.grouped_matmul_allreduce(h, w, offsets);
    const Tensor want = reference::grouped_matmul_allreduce(unfused, h, w, offsets);
    Tensor host = Tensor::zeros({N, C});
    for (int p = 0; p < tp; ++p) {
      const Tensor part = ops::reference::grouped_matmul(part_of(p), w, offsets);
      stream.synchronize();
      for (int64_t i = 0; i < host.numel(); ++i) host.data<float>()[i] += part.data<float>()[i];
    }
    const Tensor h16 = h.to(DType::bf16);
    const Tensor got16 = fused.grouped_matmul_allreduce(h16, w, offsets);
    const Tensor want16 = reference::grouped_matmul_allreduce(unfused, h16, w, offsets);
    const ops::QuantizedTensor h8 = ops::quantize_fp8_act(h);
    const Tensor got8 = fused.grouped_matmul_allreduce(h8, w8, offsets);
    const Tensor want8 = reference::grouped_matmul_allreduce(unfused, h8, w8, offsets);
    stream.synchronize();
    EXPECT_EQ(mismatches(got, want), 0);
    EXPECT_EQ(mismatches(got16, want16), 0);
    EXPECT_EQ(mismatches(got8, want8), 0);
    // the host's reference sums in another order than the GEMM's rows: within 1e-5 of the largest
    float largest = 0, worst = 0;
    for (int64_t i = 0; i < host.numel(); ++i) largest = std::max(largest, std::abs(host.data<float>()[i]));
    for (int64_t i = 0; i < host.numel(); ++i)
      worst = std::max(worst, std::abs(got.data<float>()[i] - host.data<float>()[i]));
    EXPECT_LE(worst, 1e-5f * largest);
    for (int64_t i = (N - step) * C; i < N * C; ++i) EXPECT_EQ(got.data<float>()[i], 0.0f);  // padding rows
  }
  // a group list of the wrong length is refused before anything is put
  EXPECT_THROW(fused.grouped_matmul_allreduce(Tensor::zeros({N, F}), w, Tensor::zeros({G}, DType::i64)),
               InvalidArgument);
  stream.synchronize();
}

// Unfixed, the chunk count and comm cores are the op cache's tiling of
// "fused_tensor_comm", read at every call (what the tuner forces and a tuning
// cache sets): every choice equals the unfused sum bit for bit. Members whose
// caches disagree are refused at construction, on every PE, before any call.
TEST(FusedComm, TheOpCacheSetsTheChunksAndMembersMustAgree) {
  const int tp = shmem::n_pes(), me = shmem::my_pe();
  const int64_t N = kRowsPerPe * tp;
  ShmemTensor unfused{world(), {N * C}, /*sequence_parallel=*/false};
  FusedTensorComm fused(world(), N * C, N);
  runtime::Stream stream;
  runtime::StreamGuard on(stream);
  EXPECT_EQ(fused.resolved().chunks, 2) << "the heuristic";
  EXPECT_EQ(fused.resolved().comm_cores, 1);
  EXPECT_EQ(runtime::describe_tiling("fused_tensor_comm", {1, 1, 4, 0}), "4 chunks on 1 comm core");
  EXPECT_EQ(runtime::describe_tiling("fused_tensor_comm", {2, 1, 0, 0}), "2 comm cores");
  std::string key;
  for (const runtime::OpCache::Entry& e : runtime::OpCache::global().entries())
    if (e.key.op == "fused_tensor_comm" && e.key.limits == stream.effective_limits() &&
        e.key.shapes == std::vector<Shape>{{tp}, {N * C}, {N}} && e.key.attr("chunked") == "1")
      key = e.key.text();
  ASSERT_FALSE(key.empty());
  const Tensor w = values(99, 2, 0, {C, F});
  int step = 0;
  for (int cores : {1, 2})
    for (int chunks : {1, 3, 8}) {
      SCOPED_TRACE(fmt::format("{} chunks on {} comm cores", chunks, cores));
      runtime::OpCache::global().force(key, {cores, 1, chunks, 0});
      EXPECT_EQ(fused.resolved().chunks, chunks);
      const Tensor h = values(me, 11, ++step, {N, F});
      const Tensor got = fused.matmul_allreduce(h, w);
      const Tensor want = reference::matmul_allreduce(unfused, h, w);
      stream.synchronize();
      EXPECT_EQ(mismatches(got, want), 0);
    }
  runtime::OpCache::global().unforce_all();
  if (tp > 1) {
    if (me == 0) runtime::OpCache::global().force(key, {1, 1, 4, 0});
    EXPECT_THROW(FusedTensorComm(world(), N * C, N), InvalidArgument) << "PE 0 alone would split in 4";
    runtime::OpCache::global().unforce_all();
  }
  // fixed options override the cache
  runtime::OpCache::global().force(key, {1, 1, 4, 0});
  EXPECT_EQ(FusedTensorComm(world(), N * C, N, {3, 2}).resolved().chunks, 3);
  runtime::OpCache::global().unforce_all();
}

TEST(FusedComm, RefusesWhatItWasNotSizedFor) {
  const int tp = shmem::n_pes();
  const int64_t N = kRowsPerPe * tp;
  FusedTensorComm fused(world(), N * C, N);
  runtime::Stream stream;
  runtime::StreamGuard on(stream);
  // more rows than set up for, checked before anything is put: every PE throws
  EXPECT_THROW(fused.matmul_allreduce(Tensor::zeros({2 * N, F}), Tensor::zeros({C, F})), InvalidArgument);
  EXPECT_THROW(fused.allgather_matmul(Tensor::zeros({kRowsPerPe, 8 * C}), Tensor::zeros({C, 8 * C})),
               InvalidArgument);
  EXPECT_THROW(fused.matmul_reduce_scatter(Tensor::zeros({N, F}), Tensor::zeros({C, F + 1})), InvalidArgument);
  EXPECT_THROW(FusedTensorComm(world(), 0, N), InvalidArgument);
  stream.synchronize();
}
