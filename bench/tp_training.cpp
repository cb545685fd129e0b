// bench_tp_training: tensor parallelism on the demo model's shapes. Every PE
// of the job is one TP rank; each builds its share of the demo model
// (bench/train_demo_config.json's shapes: d_model 256, 4 layers, 8 heads, 4
// kv heads, dense hidden 768, one shared expert of 384) with
// parallel::ShmemTensor as its tensor seam and runs forward + backward of
// one micro-batch of B sequences of T tokens (the optimizer is not timed).
//   usage: coremesh run -n N bench_tp_training [B] [T] [iterations] [cores]
// One PE (N = 1) runs the whole model on `cores` cores (default 2: the
// 2-core peer of tp = 2 on 2 PEs x 1 core); N > 1 pins each PE to one core.
// With N > 1 it runs the model twice, without and with sequence parallelism
// (each TP rank keeps 1/tp of the tokens outside the TP regions).
// Output (PE 0), per mode: the median step time (slowest PE), tokens/s, the
// bytes this PE put per step (ShardedSum counts its puts as they are issued)
// against the formula (a mismatch exits 1), and the bytes of the activations
// this PE saves for the backward (Model::saved_bytes; estimate_memory's
// figure beside it). The formula: the
// residual stream (B*T*C floats) crosses the TP ranks twice per attention and
// FFN half (forward exit, backward enter_backward) and once each for the
// vocabulary-parallel embedding (forward exit) and LM head (backward
// enter_backward): without SP an all-reduce each
// (ShmemTensor::bytes_per_all_reduce); with SP a reduce-scatter there and an
// all-gather at each mirror (enter, exit_backward), two halves
// (ShmemTensor::bytes_per_half) in place of each all-reduce; plus the cross
// entropy's stats ((tp + 1)*B*T floats) and one all-reduce per MoE layer of
// the gate weights' gradient (B*T*top_k floats, backward), all-reduces in
// both modes.
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

namespace {

struct Measured {
  double step = 0;        // median seconds, slowest PE
  int64_t bytes = 0, formula = 0;
  int64_t activations = 0;  // saved for the backward, this PE
  int64_t estimate = 0;     // model::estimate_memory's, less the logits' gradient (made in the backward)
};

Measured measure(const model::ModelConfig& cfg, bool sp, int B, int T, int iters, runtime::Stream& stream) {
  const int me = shmem::my_pe(), n = shmem::n_pes();
  const int64_t N = int64_t(B) * T, elements = N * cfg.d_model;
  std::vector<int> world;
  for (int p = 0; p < n; ++p) world.push_back(p);
  const int64_t stats = (n + 1) * N;
  parallel::ShmemTensor tp(parallel::Group::of(world, me), {elements, stats, N * cfg.top_k}, sp);
  parallel::Seams seams;
  seams.tensor = &tp;
  model::StageLayout stage;
  stage.tp = n, stage.tp_rank = me, stage.sequence_parallel = sp;
  model::Model m(cfg, stage, seams);
  m.init_weights(1);
  std::mt19937 rng(7);  // every TP rank reads the same tokens
  std::vector<int32_t> tokens(static_cast<size_t>(N)), targets(static_cast<size_t>(N));
  for (size_t t = 0; t < tokens.size(); ++t) tokens[t] = int32_t(rng() % 256), targets[t] = int32_t(rng() % 256);

  Measured out;
  out.estimate = model::estimate_memory(cfg, B, T, stage).activations - N * (cfg.vocab_size / n) * 4;
  std::vector<double> times;
  for (int i = 0; i < iters + 1; ++i) {  // the first is a warm-up
    shmem::barrier();
    const int64_t before = tp.bytes_put();
    const double t0 = seconds();
    m.zero_grad();
    m.forward(0, {tokens.data(), targets.data(), B, T, 1.0f});
    out.activations = m.saved_bytes(0).activations;
    m.backward(0);
    stream.synchronize();
    const double dt = seconds() - t0;
    out.bytes = tp.bytes_put() - before;
    const int64_t slowest = parallel::max_over_world({int64_t(dt * 1e9)})[0];
    if (i > 0) times.push_back(double(slowest) * 1e-9);
  }
  out.step = median(times);
  // the residual stream's sums: attention and FFN of every layer, forward
  // and backward, and the embedding's and the head's
  const int64_t sums = 4 * cfg.n_layers + 2;
  const int64_t per_sum = sp ? 2 * parallel::ShmemTensor::bytes_per_half(n, elements)
                             : parallel::ShmemTensor::bytes_per_all_reduce(n, elements);
  if (n > 1)
    out.formula = sums * per_sum + parallel::ShmemTensor::bytes_per_all_reduce(n, stats) +
                  cfg.n_moe_layers() * parallel::ShmemTensor::bytes_per_all_reduce(n, N * cfg.top_k);
  return out;
}

}  // namespace

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

  double load = 0;
  bool equal = true;
  for (bool sp : n > 1 ? std::vector<bool>{false, true} : std::vector<bool>{false}) {
    const Measured r = measure(cfg, sp, B, T, iters, stream);
    if (FILE* f = std::fopen("/proc/loadavg", "r")) {
      if (std::fscanf(f, "%lf", &load) != 1) load = 0;
      std::fclose(f);
    }
    equal = equal && r.bytes == r.formula;
    if (me == 0)
      std::printf("tp %d%s (%s) B %d T %d: step %.4f s (median of %d, slowest PE), %.0f tokens/s; bytes put per "
                  "step per PE %lld, formula %lld (%s); saved activations per PE %.2f MiB (estimate %.2f); load %.2f\n",
                  n, sp ? " + SP" : "", n > 1 ? "1 core per PE" : (std::to_string(cores_one) + " cores").c_str(), B,
                  T, r.step, iters, double(B) * T / r.step, (long long)r.bytes, (long long)r.formula,
                  r.bytes == r.formula ? "equal" : "MISMATCH", double(r.activations) / (1 << 20),
                  double(r.estimate) / (1 << 20), load);
  }
  shmem::barrier();
  return equal ? 0 : 1;
}
