// bench_tp_training: tensor parallelism on the demo model's shapes. Every PE
// of the job is one TP rank; each builds its share of the demo model
// (bench/train_demo_config.json's shapes: d_model 256, 4 layers, 8 heads, 4
// kv heads, dense hidden 768, one shared expert of 384) with
// parallel::ShmemTensor as its tensor seam and runs forward + backward of
// one micro-batch of B sequences of T tokens (the optimizer is not timed).
//   usage: coremesh run -n N bench_tp_training [B] [T] [iterations] [cores]
// One PE (N = 1) runs the whole model on `cores` cores (default 2: the
// 2-core peer of tp = 2 on 2 PEs x 1 core); N > 1 pins each PE to one core.
// Output (PE 0): the median step time (slowest PE), tokens/s, and the bytes
// this PE put per step (ShardedSum counts its puts as they are issued)
// against the formula: all-reduces per step (one per attention and FFN half,
// forward and backward, and one for the vocabulary-parallel embedding
// (forward) and LM head (backward), of B*T*C floats; the cross entropy's
// stats, (tp + 1)*B*T floats; one per MoE layer of the gate weights'
// gradient, B*T*top_k floats) times ShmemTensor::bytes_per_all_reduce.
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "coremesh/model/model.hpp"
#include "coremesh/parallel/tensor_parallel.hpp"
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
  const int B = argc > 1 ? std::atoi(argv[1]) : 8, T = argc > 2 ? std::atoi(argv[2]) : 128,
            iters = argc > 3 ? std::atoi(argv[3]) : 5, cores_one = argc > 4 ? std::atoi(argv[4]) : 2;
  shmem::Session session;
  const int me = shmem::my_pe(), n = shmem::n_pes();
  if (n > 1) coremesh::bench::pin_to_one_core(me);
  runtime::Device device(runtime::DeviceOptions{.cores = n > 1 ? 1 : cores_one});
  runtime::Stream stream(device);
  runtime::StreamGuard on(stream);

  const model::ModelConfig cfg = demo_model(T);
  const int64_t elements = int64_t(B) * T * cfg.d_model;
  std::vector<int> world;
  for (int p = 0; p < n; ++p) world.push_back(p);
  const int64_t tokens_n = int64_t(B) * T, stats = (n + 1) * tokens_n;
  parallel::ShmemTensor tp(parallel::Group::of(world, me), {elements, stats, tokens_n * cfg.top_k});
  parallel::Seams seams;
  seams.tensor = &tp;
  model::StageLayout stage;
  stage.tp = n, stage.tp_rank = me;
  model::Model m(cfg, stage, seams);
  m.init_weights(1);
  std::mt19937 rng(7);  // every TP rank reads the same tokens
  std::vector<int32_t> tokens(size_t(B) * T), targets(size_t(B) * T);
  for (size_t t = 0; t < tokens.size(); ++t) tokens[t] = int32_t(rng() % 256), targets[t] = int32_t(rng() % 256);

  std::vector<double> times;
  int64_t bytes = 0;
  for (int i = 0; i < iters + 1; ++i) {  // the first is a warm-up
    shmem::barrier();
    const int64_t before = tp.bytes_put();
    const double t0 = seconds();
    m.zero_grad();
    m.forward(0, {tokens.data(), targets.data(), B, T, 1.0f});
    m.backward(0);
    stream.synchronize();
    const double dt = seconds() - t0;
    bytes = tp.bytes_put() - before;
    const int64_t slowest = parallel::max_over_world({int64_t(dt * 1e9)})[0];
    if (i > 0) times.push_back(double(slowest) * 1e-9);
  }
  // two tensor-parallel regions per layer (attention, FFN), each one
  // all-reduce of (B*T, C) forward and one backward, and two more for the
  // embedding and the head; the cross entropy's stats (tp + 1, B*T); per MoE
  // layer one more in the backward, of the gate weights' gradient (B*T, top-k)
  const int64_t formula =
      n > 1 ? (4 * cfg.n_layers + 2) * parallel::ShmemTensor::bytes_per_all_reduce(n, elements) +
                  parallel::ShmemTensor::bytes_per_all_reduce(n, stats) +
                  cfg.n_moe_layers() * parallel::ShmemTensor::bytes_per_all_reduce(n, tokens_n * cfg.top_k)
            : 0;
  double load = 0;
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf", &load) != 1) load = 0;
    std::fclose(f);
  }
  const double step = median(times);
  if (me == 0)
    std::printf("tp %d (%s) B %d T %d: step %.4f s (median of %d, slowest PE), %.0f tokens/s; bytes put per step "
                "per PE %lld, formula %lld (%s); load %.2f\n",
                n, n > 1 ? "1 core per PE" : (std::to_string(cores_one) + " cores").c_str(), B, T, step, iters,
                double(B) * T / step, (long long)bytes, (long long)formula, bytes == formula ? "equal" : "MISMATCH",
                load);
  shmem::barrier();
  return bytes == formula ? 0 : 1;
}
