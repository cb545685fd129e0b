// bench_fused_comm: each fused comm+GEMM operator (parallel/fused_comm.hpp)
// against its unfused sequence over ShmemTensor (reference::), every PE of
// the job one TP rank (one core each, as `coremesh train` pins them), on
// the shapes of an MLP block: N = B x T rows, width C, hidden H split over
// tp (column-parallel w13 (2H/tp, C), row-parallel w2 (C, H/tp); expert-TP's
// grouped w2 (4, C, H/tp)).
//   usage: coremesh run -n N bench_fused_comm [C] [H] [rows] [iterations] [chunks]
// Also times, on the same PE, the GEMM alone (no exchange: the compute) and
// the exchange alone (ShmemTensor's all-gather / reduce-scatter /
// all-reduce of the same tensor), so that
//   hidden = 1 - (fused - compute) / exchange
// is the fraction of the exchange the fused operator hides behind its GEMMs
// (1: all of it; 0: none, the unfused sum). Output (PE 0), one line per
// operator: name, then the medians over iterations of the slowest PE (us)
// of unfused, fused, compute, exchange; then whether the fused result equals
// the unfused bit for bit (a mismatch exits 1).
#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "bench_util.hpp"
#include "coremesh/ops/gemm.hpp"
#include "coremesh/ops/grouped_gemm.hpp"
#include "coremesh/ops/norm.hpp"
#include "coremesh/parallel/comm.hpp"
#include "coremesh/parallel/fused_comm.hpp"
#include "coremesh/parallel/tensor_parallel.hpp"
#include "coremesh/runtime/stream.hpp"
#include "coremesh/shmem/shmem.hpp"

using namespace coremesh;
using coremesh::bench::median;
using coremesh::bench::seconds;

namespace {

Tensor random(Shape shape, uint32_t seed) {
  Tensor t = Tensor::empty(shape);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = u(rng);
  return t;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && !std::memcmp(a.raw_data(), b.raw_data(), a.nbytes());
}

struct Timer {
  runtime::Stream& stream;
  parallel::WorldGather gather{1};
  // The slowest PE's seconds for one run of `body` (synchronized), all PEs starting together.
  double operator()(const std::function<void()>& body) {
    shmem::barrier();
    const double t0 = seconds();
    body();
    stream.synchronize();
    const std::vector<double> all = gather.gather(std::vector<double>{seconds() - t0});
    return *std::max_element(all.begin(), all.end());
  }
};

}  // namespace

int main(int argc, char** argv) {
  shmem::Session session;
  const int64_t C = argc > 1 ? std::atoll(argv[1]) : 256, H = argc > 2 ? std::atoll(argv[2]) : 768,
                N = argc > 3 ? std::atoll(argv[3]) : 1024;
  const int iters = argc > 4 ? std::atoi(argv[4]) : 20, chunks = argc > 5 ? std::atoi(argv[5]) : 2;
  const int me = shmem::my_pe(), tp = shmem::n_pes();
  if (N % tp || H % tp) {
    std::fprintf(stderr, "rows %lld and hidden %lld must divide by %d PEs\n", (long long)N, (long long)H, tp);
    return 2;
  }
  bench::pin_to_one_core(me);
  std::vector<int> pes;
  for (int p = 0; p < tp; ++p) pes.push_back(p);
  const parallel::Group group = parallel::Group::of(pes, me);
  const int64_t F = H / tp, O = 2 * H / tp;
  parallel::ShmemTensor sp(group, {N * C}, /*sequence_parallel=*/true, /*overlap=*/false);
  parallel::ShmemTensor ar(group, {N * C}, /*sequence_parallel=*/false, /*overlap=*/false);
  parallel::FusedTensorComm fused(group, N * C, N, {chunks, 1});
  runtime::Stream stream;
  runtime::StreamGuard on(stream);
  Timer time{stream};
  const Tensor x = random({N / tp, C}, 1 + me), w13 = random({O, C}, 100 + me), h = random({N, F}, 200 + me),
               w2 = random({C, F}, 300 + me), resid = random({N, C}, 400), upd = random({N, C}, 500 + me),
               norm = random({C}, 600);
  struct Op {
    std::string name;
    std::function<Tensor()> unfused, fused, compute, exchange;
  };
  const Tensor whole = random({N, C}, 700 + me);
  // expert-TP's w2: 4 experts' rows of h, unevenly (a tenth, then the rest in thirds)
  constexpr int64_t G = 4;
  const Tensor we = random({G, C, F}, 800 + me), groups = Tensor::empty({G + 1}, DType::i64);
  for (int64_t g = 0; g <= G; ++g) groups.data<int64_t>()[g] = g == 0 ? 0 : N / 10 + (N - N / 10) * (g - 1) / (G - 1);
  const std::vector<Op> ops = {
      {"allgather_matmul", [&] { return parallel::reference::allgather_matmul(sp, x, w13).y; },
       [&] { return fused.allgather_matmul(x, w13).y; }, [&] { return ops::matmul(whole, w13, false, true); },
       [&] { return sp.all_gather(x); }},
      {"matmul_reduce_scatter", [&] { return parallel::reference::matmul_reduce_scatter(sp, h, w2); },
       [&] { return fused.matmul_reduce_scatter(h, w2); }, [&] { return ops::matmul(h, w2, false, true); },
       [&] { return sp.reduce_scatter(whole); }},
      {"matmul_allreduce", [&] { return parallel::reference::matmul_allreduce(ar, h, w2); },
       [&] { return fused.matmul_allreduce(h, w2); }, [&] { return ops::matmul(h, w2, false, true); },
       [&] { return ar.all_reduce(whole); }},
      {"grouped_matmul_allreduce", [&] { return parallel::reference::grouped_matmul_allreduce(ar, h, we, groups); },
       [&] { return fused.grouped_matmul_allreduce(h, we, groups); },
       [&] { return ops::grouped_matmul(h, we, groups); }, [&] { return ar.all_reduce(whole); }},
      {"add_rmsnorm_allreduce",
       [&] { return parallel::reference::add_rmsnorm_allreduce(ar, resid, upd, norm, 1e-6f).y; },
       [&] { return fused.add_rmsnorm_allreduce(resid, upd, norm, 1e-6f).y; },
       [&] { return ops::rmsnorm_residual(resid, upd, norm, 1e-6f).y; }, [&] { return ar.all_reduce(whole); }},
  };
  // allgather_matmul and matmul_reduce_scatter alternate (ShmemTensor's
  // sequence-parallel halves must): every iteration runs each op's four forms once
  std::vector<std::vector<double>> t(ops.size() * 4);
  bool exact = true;
  for (int i = 0; i < iters + 1; ++i)  // the first a warm-up
    for (size_t o = 0; o < ops.size(); ++o) {
      Tensor a, b;
      const double tu = time([&] { a = ops[o].unfused(); }), tf = time([&] { b = ops[o].fused(); });
      const double tc = time([&] { ops[o].compute(); });
      // the exchange alone: SP gathers and scatters alternate, so the pair runs and half is charged
      double tx = 0;
      if (o == 0) tx = time([&] { sp.reduce_scatter(whole); sp.all_gather(x); }) / 2;
      else if (o == 1) tx = time([&] { sp.all_gather(x); sp.reduce_scatter(whole); }) / 2;
      else tx = time([&] { ops[o].exchange(); });
      exact = exact && same_bits(a, b);
      if (i == 0) continue;
      const std::array<double, 4> four{tu, tf, tc, tx};
      for (size_t k = 0; k < 4; ++k) t[o * 4 + k].push_back(four[k]);
    }
  if (me == 0) {
    std::printf("# tp %d C %lld H %lld rows %lld chunks %d\n", tp, (long long)C, (long long)H, (long long)N, chunks);
    for (size_t o = 0; o < ops.size(); ++o)
      std::printf("%s %.1f %.1f %.1f %.1f\n", ops[o].name.c_str(), median(t[o * 4]) * 1e6, median(t[o * 4 + 1]) * 1e6,
                  median(t[o * 4 + 2]) * 1e6, median(t[o * 4 + 3]) * 1e6);
    std::printf("exact %s\n", exact ? "yes" : "NO");
  }
  return exact ? 0 : 1;
}
