// bench_cp_attention: context parallelism on the demo model's shapes at a
// long sequence. Every PE of the job is one CP rank; each builds the demo
// model (bench/train_demo_config.json's: d_model 256, 4 layers, 8 heads, 4
// kv heads, no balance loss) with parallel::ShmemContext as its attention
// seam and runs forward + backward of one micro-batch of B = 1 sequence of T
// tokens, T / cp on each PE. One core per PE.
//   usage: coremesh run -n N bench_cp_attention [ring|ulysses] [T] [iterations]
// Output (PE 0): the step's median time (slowest PE), the bytes this PE put
// per step (counted as the puts are issued) against the formula
// (cp_bytes_per_call x layers), the activations the model saved for the
// backward (Model::saved_bytes: the storages a slot holds) and the
// symmetric bytes of the CP buffers.
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "coremesh/model/model.hpp"
#include "coremesh/parallel/context_parallel.hpp"
#include "coremesh/runtime/device.hpp"
#include "coremesh/runtime/stream.hpp"
#include "coremesh/shmem/shmem.hpp"
#include "bench_util.hpp"
#include "demo_model.hpp"

using namespace coremesh;

using coremesh::bench::demo_model;
using coremesh::bench::median;
using coremesh::bench::seconds;

int main(int argc, char** argv) {
  const std::string comm_name = argc > 1 ? argv[1] : "ring";
  const int T = argc > 2 ? std::atoi(argv[2]) : 4096, iters = argc > 3 ? std::atoi(argv[3]) : 3;
  shmem::Session session;
  const int me = shmem::my_pe(), n = shmem::n_pes();
  coremesh::bench::pin_to_one_core(me);
  runtime::Device device(runtime::DeviceOptions{.cores = 1});
  runtime::Stream stream(device);
  runtime::StreamGuard on(stream);

  const parallel::CpComm comm = comm_name == "ulysses" ? parallel::CpComm::ulysses : parallel::CpComm::ring;
  const model::ModelConfig cfg = demo_model(T);
  const int Tl = T / n;
  std::vector<int> world;
  for (int p = 0; p < n; ++p) world.push_back(p);
  parallel::ShmemContext cp(parallel::Group::of(world, me), comm, comm == parallel::CpComm::ring,
                            {1, Tl, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim()});
  parallel::Seams seams;
  seams.context = &cp;
  model::Model m(cfg, {}, seams);
  m.init_weights(1);
  std::mt19937 rng(uint32_t(7 + me));
  std::vector<int32_t> tokens(static_cast<size_t>(Tl)), targets(static_cast<size_t>(Tl));
  for (int t = 0; t < Tl; ++t) tokens[size_t(t)] = int32_t(rng() % 256), targets[size_t(t)] = int32_t(rng() % 256);

  std::vector<double> times;
  int64_t activations = 0, bytes = 0;
  for (int i = 0; i < iters + 1; ++i) {  // the first is a warm-up
    shmem::barrier();
    const int64_t before = cp.bytes_put();
    const double t0 = seconds();
    m.zero_grad();
    m.forward(0, {tokens.data(), targets.data(), 1, Tl, 1.0f});
    stream.synchronize();
    activations = m.saved_bytes(0).activations;
    m.backward(0);
    stream.synchronize();
    const double dt = seconds() - t0;
    bytes = cp.bytes_put() - before;
    const int64_t slowest = parallel::max_over_world({int64_t(dt * 1e9)})[0];
    if (i > 0) times.push_back(double(slowest) * 1e-9);
  }
  const parallel::CpTraffic f =
      parallel::cp_bytes_per_call(comm, n, 1, Tl, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim());
  const int64_t formula = (f.forward + f.backward) * cfg.n_layers;
  const int64_t buffers = parallel::ShmemContext::symmetric_bytes(
      comm, n, {1, Tl, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim()});
  if (me == 0)
    std::printf("cp %d %s T %d: step %.3f s (median of %d, slowest PE); bytes put per step per PE %lld, formula "
                "%lld (%s); saved activations %.2f MiB; CP buffers %.2f MiB\n",
                n, comm_name.c_str(), T, median(times), iters, (long long)bytes, (long long)formula,
                bytes == formula ? "equal" : "MISMATCH", double(activations) / (1 << 20),
                double(buffers) / (1 << 20));
  shmem::barrier();
  return bytes == formula ? 0 : 1;
}
