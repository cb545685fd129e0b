// bench_ep_exchange: coremesh's expert-parallel dispatch + combine
// (parallel::ShmemExperts: every source puts its rows into their owners'
// receive slots with a signal, the owners regroup them; the way back alike) for the demo model's token layout
// (ep_exchange_layout.h), timed like its MPI peer bench/ep_exchange_mpi.c:
// barrier, dispatch (to the stream's end), combine (ditto), the slowest PE's
// time per iteration, medians. Identity experts: combine returns what
// dispatch received, which must be the rows sent. One core per PE.
//   usage: coremesh run -n 2 bench_ep_exchange [iterations]
// Output: "cm_<phase>_us <median>" (phase dispatch, combine, total) and, per
// PE, "checksum <pe> <received rows> <returned rows>".
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "coremesh/parallel/expert_parallel.hpp"
#include "coremesh/runtime/device.hpp"
#include "coremesh/runtime/stream.hpp"
#include "coremesh/shmem/shmem.hpp"
#include "ep_exchange_layout.h"
#include "bench_util.hpp"

using namespace coremesh;
namespace shmem = coremesh::shmem;

using coremesh::bench::median;
using coremesh::bench::seconds;

int main(int argc, char** argv) {
  const int iters = argc > 1 ? std::atoi(argv[1]) : 300, warmup = 20;
  shmem::Session session;
  const int me = shmem::my_pe(), n = shmem::n_pes();
  coremesh::bench::pin_to_one_core(me);
  runtime::Device device(runtime::DeviceOptions{.cores = 1});
  runtime::Stream stream(device);
  runtime::StreamGuard on(stream);

  std::vector<int> world;
  for (int p = 0; p < n; ++p) world.push_back(p);
  parallel::ShmemExperts experts(parallel::Group::of(world, me), {EPX_EXPERTS, EPX_WIDTH, EPX_ROWS, -1, {0}});
  const Tensor xp = Tensor::empty({EPX_ROWS, EPX_WIDTH});
  const Tensor offsets = Tensor::empty({EPX_EXPERTS + 1}, DType::i64);
  epx_make(me, offsets.data<int64_t>(), xp.data<float>());

  // per iteration: dispatch, combine, both (seconds; max over PEs below)
  auto* t = static_cast<double*>(shmem::sym_malloc(sizeof(double) * 3 * size_t(iters)));
  auto* worst = static_cast<double*>(shmem::sym_malloc(sizeof(double) * 3 * size_t(iters)));
  double recv_sum = 0, back_sum = 0;
  for (int it = -warmup; it < iters; ++it) {
    shmem::barrier();
    const double t0 = seconds();
    const auto d = experts.dispatch(xp, offsets, {0}, {});
    stream.synchronize();
    const double t1 = seconds();
    // the identity experts' outputs (untimed: expert work, not exchange)
    const Tensor y = Tensor::empty({d.rows.size(0), EPX_WIDTH});
    std::memcpy(y.data<float>(), d.rows.data<float>(), d.rows.nbytes());
    const double t1b = seconds();
    const Tensor back = experts.combine(y, d);
    stream.synchronize();
    const double t2 = seconds();
    if (it >= 0) t[3 * it] = t1 - t0, t[3 * it + 1] = t2 - t1b, t[3 * it + 2] = t1 - t0 + t2 - t1b;
    if (it == iters - 1) {
      recv_sum = epx_checksum(d.rows.data<float>(), d.offsets.data<int64_t>()[experts.local_experts()] * EPX_WIDTH);
      back_sum = epx_checksum(back.data<float>(), back.numel());
      if (back_sum != epx_checksum(xp.data<float>(), xp.numel())) {
        std::fprintf(stderr, "PE %d: combine did not return the rows it sent\n", me);
        return 1;
      }
    }
  }
  // positive doubles order like their bits: the max over PEs as i64
  shmem::allreduce(shmem::Team::world(), reinterpret_cast<int64_t*>(worst), reinterpret_cast<const int64_t*>(t),
                   3 * size_t(iters), shmem::ReduceOp::max);
  std::printf("checksum %d %.17g %.17g\n", me, recv_sum, back_sum);
  std::fflush(stdout);
  shmem::barrier();
  if (me == 0) {
    const char* names[3] = {"dispatch", "combine", "total"};
    for (int k = 0; k < 3; ++k) {
      std::vector<double> v;
      for (int it = 0; it < iters; ++it) v.push_back(worst[3 * it + k] * 1e6);
      std::printf("cm_%s_us %.1f\n", names[k], median(v));
    }
    std::fflush(stdout);
  }
  shmem::sym_free(worst);
  shmem::sym_free(t);
  return 0;
}
