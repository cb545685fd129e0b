// `coremesh calibrate`: measures this machine into a cluster file for
// `coremesh simulate` and `coremesh plan` (docs/simulator.md).
//
//   coremesh calibrate --config run.json --output cluster.json [--cores 1] [--max-pes 8]
//
// It times every GEMM, grouped GEMM and attention shape that the config's
// layouts of up to --max-pes PEs run (the kernels the trainer calls, on a
// stream limited to --cores cores (default 1); median of repeats), element-wise work
// by bytes, the GEMM peak, and then starts 2 PEs that time put and each
// collective over sizes from 8 B to 16 MiB and fit latency and bandwidth.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "commands.hpp"
#include "config_flags.hpp"
#include "coremesh/ops/attention.hpp"
#include "coremesh/ops/elementwise.hpp"
#include "coremesh/ops/gemm.hpp"
#include "coremesh/ops/grouped_gemm.hpp"
#include "coremesh/parallel/comm.hpp"
#include "coremesh/parallel/expert_parallel.hpp"
#include "coremesh/parallel/tensor_parallel.hpp"
#include "coremesh/runtime/device.hpp"
#include "coremesh/runtime/stream.hpp"
#include "coremesh/shmem/collectives.hpp"
#include "coremesh/shmem/heap.hpp"
#include "coremesh/shmem/rma.hpp"
#include "coremesh/sim/planner.hpp"
#include "coremesh/sim/workload.hpp"
#include "coremesh/train/metrics.hpp"
#include "pe_setup.hpp"

namespace coremesh::cli {
namespace {

using Clock = std::chrono::steady_clock;

struct CalibrateFlags {
  ConfigFlags flags;
  std::string out = "cluster.json";
  bool network = false;  // also the network path: 2 PEs under mpirun, one per "host", over loopback TCP
  int max_pes = 8;
  double budget = 0.05;  // seconds of repeats per shape
};

double median(std::vector<double> t) {
  std::nth_element(t.begin(), t.begin() + t.size() / 2, t.end());
  return t[t.size() / 2];
}

// Median seconds of `fn` (which waits for its work), repeated for `budget`
// seconds, or exactly `times` times (a collective: every PE the same count).
double median_seconds(const std::function<void()>& fn, double budget, int times = 0) {
  fn();  // warm: tiling cache, allocator, pages
  std::vector<double> t;
  double total = 0;
  while (times > 0 ? int(t.size()) < times : t.size() < 3 || (total < budget && t.size() < 200)) {
    const auto a = Clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(Clock::now() - a).count());
    total += t.back();
  }
  return median(std::move(t));
}

Tensor random(const Shape& shape, DType dtype = DType::f32) {
  static std::mt19937 rng(7);
  std::normal_distribution<float> d(0.0f, 1.0f);
  Tensor x = Tensor::empty(shape);
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = d(rng);
  return dtype == DType::f32 ? x : x.to(dtype);
}

// Runs one kernel of `op`'s shape as the model calls it.
std::function<void()> kernel(const sim::Op& op, runtime::Stream& stream) {
  const DType dt = op.dtype == "bf16" ? DType::bf16 : DType::f32;  // fp8 is priced from f32 (docs/simulator.md)
  switch (op.kind) {
    case sim::OpKind::gemm: {
      const Tensor a = op.trans_a ? random({op.k, op.m}, dt) : random({op.m, op.k}, dt);
      const Tensor b = op.trans_b ? random({op.n, op.k}, dt) : random({op.k, op.n}, dt);
      Tensor c = Tensor::zeros({op.m, op.n});
      return [=, &stream]() mutable {
        ops::matmul_out(a, b, c, op.trans_a, op.trans_b);
        stream.synchronize();
      };
    }
    case sim::OpKind::grouped_gemm:
    case sim::OpKind::grouped_gemm_dw: {
      std::vector<int64_t> offsets;
      for (int64_t g = 0; g <= op.groups; ++g) offsets.push_back(op.m * g / op.groups);
      const Tensor off = Tensor::from_vector(offsets, {op.groups + 1});
      const Tensor x = random({op.m, op.k}), w = random({op.groups, op.n, op.k}), dy = random({op.m, op.n});
      if (op.kind == sim::OpKind::grouped_gemm)
        return [=, &stream] {
          ops::grouped_matmul(x, w, off);
          stream.synchronize();
        };
      Tensor dw = Tensor::zeros({op.groups, op.n, op.k});
      return [=, &stream] {
        ops::grouped_matmul_dw(dy, x, off, dw);
        stream.synchronize();
      };
    }
    case sim::OpKind::attention:
    case sim::OpKind::attention_backward: {
      const Tensor q = random({op.batch, op.q_rows, op.heads, op.head_dim}),
                   k = random({op.batch, op.kv_rows, op.kv_heads, op.head_dim}),
                   v = random({op.batch, op.kv_rows, op.kv_heads, op.head_dim});
      if (op.kind == sim::OpKind::attention)
        return [=, &stream] {
          ops::flash_attention(q, k, v, op.causal);
          stream.synchronize();
        };
      const ops::AttentionOut fwd = ops::flash_attention(q, k, v, op.causal);
      const Tensor dout = random({op.batch, op.q_rows, op.heads, op.head_dim});
      return [=, &stream] {
        ops::flash_attention_backward(dout, q, k, v, fwd.out, fwd.lse, op.causal);
        stream.synchronize();
      };
    }
    case sim::OpKind::elementwise: break;
  }
  return [] {};
}

// Each shape's median time, its samples taken in rounds over the shapes (one
// sample each per round, `budget` seconds per shape in all, 5 rounds at
// least): this VM's cores change speed over seconds, so a shape timed in one
// burst takes that burst's speed, and a kernel run after other kernels finds
// the caches as it does in a step, not warm with its own operands. The shapes
// go in batches whose operands fit in `kBatchBytes` (a large config's would
// not all fit in memory at once).
std::map<std::string, double> round_robin_medians(const std::map<std::string, sim::Op>& shapes,
                                                  runtime::Stream& stream, double budget) {
  constexpr double kBatchBytes = double(int64_t(1) << 30);
  std::map<std::string, double> out;
  for (auto first = shapes.begin(); first != shapes.end();) {
    std::map<std::string, std::function<void()>> kernels;
    double bytes = 0;
    for (; first != shapes.end() && (kernels.empty() || bytes + first->second.bytes <= kBatchBytes); ++first) {
      bytes += first->second.bytes;
      kernels[first->first] = kernel(first->second, stream);
      kernels[first->first]();  // warm: tiling cache, allocator, pages
    }
    std::map<std::string, std::vector<double>> samples;
    const double batch_budget = budget * double(kernels.size());
    double total = 0;
    for (int round = 0; round < 5 || (total < batch_budget && round < 200); ++round)
      for (const auto& [key, fn] : kernels) {
        const auto a = Clock::now();
        fn();
        samples[key].push_back(std::chrono::duration<double>(Clock::now() - a).count());
        total += samples[key].back();
      }
    for (auto& [key, t] : samples) out[key] = median(std::move(t));
    fmt::print("  {}/{} shapes\n", out.size(), shapes.size());
    std::fflush(stdout);
  }
  return out;
}

// The kernels of every layout the planner would consider on 1..max_pes PEs
// (powers of two), by shape; fp8 shapes take their f32 twins' times.
std::map<std::string, sim::Op> shapes_to_measure(const train::TrainConfig& cfg, int max_pes) {
  std::map<std::string, sim::Op> out;
  for (int pes = 1; pes <= max_pes; pes *= 2) {
    sim::PlanRequest req;
    req.config = cfg;
    req.pes = pes;
    req.global_batch = cfg.batch_size * cfg.grad_accum * pes;  // a batch every layout can split
    for (const train::TrainConfig& c : sim::valid_layouts(req))
      for (sim::Op op : sim::kernels_of({c, 1.0})) {
        if (op.dtype == "fp8") continue;
        // a ring rank's queries against the whole sequence run as blocks of its chunks: priced
        // from the measured attention nearest in FLOPs
        if (op.q_rows != op.kv_rows) continue;
        out.emplace(op.key(), op);
      }
  }
  return out;
}

// Least squares of seconds = steps x latency + volume / bandwidth, each
// sample's error relative to its time (small and large sizes count alike).
sim::Fit fit(const std::vector<std::array<double, 3>>& samples) {  // steps, volume, seconds
  double a11 = 0, a12 = 0, a22 = 0, b1 = 0, b2 = 0;
  for (auto [s, v, t] : samples) {
    s /= t, v /= t;
    a11 += s * s, a12 += s * v, a22 += v * v, b1 += s, b2 += v;
  }
  const double det = a11 * a22 - a12 * a12;
  double latency = (b1 * a22 - b2 * a12) / det, per_byte = (a11 * b2 - a12 * b1) / det;
  if (latency < 0) {  // bandwidth alone
    latency = 0;
    per_byte = b2 / a22;
  }
  return {latency, per_byte > 0 ? 1.0 / per_byte : 1e30};
}

parallel::Group world_group() {
  std::vector<int> all(size_t(shmem::n_pes()));
  for (int pe = 0; pe < shmem::n_pes(); ++pe) all[size_t(pe)] = pe;
  return parallel::Group::of(all, shmem::my_pe());
}

// The TP seams' all-reduce, all-gather and reduce-scatter as the trainer runs
// them (parallel::ShmemTensor: copies into and out of symmetric memory, the
// sums in member order for layout-independent results), fitted into `out`.
// They cost several times the library's collectives (which the gradient sums'
// buckets are priced by): priced as those, tp 2 ran 12% over its prediction.
void measure_seam_collectives(const parallel::Group& group, runtime::Stream& stream, nlohmann::json& out) {
  const int pes = group.size();
  std::vector<int64_t> sizes;  // elements, 8 B to 16 MiB, whole shards per member
  for (int64_t bytes = 8; bytes <= (int64_t(16) << 20); bytes *= 8)
    sizes.push_back(std::max<int64_t>(bytes / 4, pes) / pes * pes);
  parallel::ShmemTensor seams(group, sizes, /*sequence_parallel=*/true, /*overlap=*/false);
  std::map<sim::Collective, std::vector<std::array<double, 3>>> samples;
  for (int64_t n : sizes) {
    const Tensor whole = random({n}), shard = random({n / pes});
    const double bytes = 4.0 * double(n);
    const int reps = n < (int64_t(1) << 18) ? 50 : 10;
    const auto completed = [&] {  // the seam's work done on this PE, and on every PE
      stream.synchronize();
      shmem::barrier(shmem::Team::world());
    };
    const double all_reduce = median_seconds(
        [&] {
          seams.all_reduce(whole);
          completed();
        },
        0, reps);
    // a gather and a scatter alternate on a range (as the seams call them): timed in pairs, each apart
    std::vector<double> gather, scatter;
    for (int i = 0; i <= reps; ++i) {
      const auto a = Clock::now();
      seams.all_gather(shard);
      completed();
      const auto b = Clock::now();
      seams.reduce_scatter(whole);
      completed();
      if (i == 0) continue;  // warm
      gather.push_back(std::chrono::duration<double>(b - a).count());
      scatter.push_back(std::chrono::duration<double>(Clock::now() - b).count());
    }
    for (auto [c, seconds] : {std::pair{sim::Collective::all_reduce, all_reduce},
                              std::pair{sim::Collective::all_gather, median(gather)},
                              std::pair{sim::Collective::reduce_scatter, median(scatter)}})
      samples[c].push_back({sim::collective_steps(c, pes), sim::collective_volume(c, pes, bytes), seconds});
  }
  for (const auto& [c, s] : samples) {
    const sim::Fit f = fit(s);
    out[sim::collective_name(c)] = {{"latency_seconds", f.latency}, {"bandwidth", f.bandwidth}};
  }
}

// The EP seam's dispatch and combine as the trainer runs them
// (parallel::ShmemExperts: the counts first, then the rows by one-sided puts,
// regrouped by expert at the owner, and back), fitted as an all-to-all into
// `out`: an even split of R rows over 4 experts per PE, each exchange timed apart.
void measure_expert_exchange(const parallel::Group& group, runtime::Stream& stream, nlohmann::json& out) {
  const int pes = group.size(), experts = 4 * pes;
  constexpr int64_t kWidth = 256;
  std::vector<std::array<double, 3>> samples;
  for (int64_t rows = 16; rows <= 4096; rows *= 4) {
    parallel::ShmemExperts::Shape shape;
    shape.experts = experts, shape.width = kWidth, shape.max_rows = rows, shape.layers = {0};
    parallel::ShmemExperts ep(group, shape);
    std::vector<int64_t> offsets;
    for (int e = 0; e <= experts; ++e) offsets.push_back(rows * e / experts);
    const Tensor xp = random({rows, kWidth}), off = Tensor::from_vector(offsets, {experts + 1});
    const int reps = rows < 1024 ? 50 : 10;
    std::vector<double> dispatch, combine;
    for (int i = 0; i <= reps; ++i) {
      const auto a = Clock::now();
      const parallel::ExpertDispatcher::Dispatched d = ep.dispatch(xp, off, {}, {});
      stream.synchronize();
      shmem::barrier(shmem::Team::world());
      const auto b = Clock::now();
      ep.combine(d.rows, d);
      stream.synchronize();
      shmem::barrier(shmem::Team::world());
      if (i == 0) continue;  // warm
      dispatch.push_back(std::chrono::duration<double>(b - a).count());
      combine.push_back(std::chrono::duration<double>(Clock::now() - b).count());
    }
    const double bytes = 4.0 * double(rows * kWidth);  // a PE's rows, as the simulator counts an EP exchange
    for (double seconds : {median(dispatch), median(combine)})
      samples.push_back({sim::collective_steps(sim::Collective::all_to_all, pes),
                         sim::collective_volume(sim::Collective::all_to_all, pes, bytes), seconds});
  }
  const sim::Fit f = fit(samples);
  out[sim::collective_name(sim::Collective::all_to_all)] = {{"latency_seconds", f.latency}, {"bandwidth", f.bandwidth}};
}

// The host's CPU time so far, and the part of it the hypervisor gave to other
// guests (steal, /proc/stat; 0 outside a VM or where the file is missing).
struct CpuTimes {
  double total = 0, stolen = 0;
};
CpuTimes cpu_times() {
  std::ifstream stat("/proc/stat");
  std::string label;
  stat >> label;
  CpuTimes t;
  double v = 0;
  for (int field = 0; field < 8 && stat >> v; ++field) {
    t.total += v;
    if (field == 7) t.stolen = v;
  }
  return t;
}

// `round()` repeated until `wanted` of its results came from rounds the hypervisor left alone
// (steal under 2% of the host's CPU time, as every PE saw it: one PE's core taken away makes its
// partners wait for it, which is not what a round measures), 3x as many tries at most; the clean
// results, or every result where none was clean. `flags`: 2 symmetric floats.
std::vector<double> unstolen_rounds(int wanted, const std::function<double()>& round, const shmem::Team& world,
                                    float* flags, const char* what) {
  std::vector<double> clean, all;
  for (int tries = 0; tries < 3 * wanted && int(clean.size()) < wanted; ++tries) {
    const CpuTimes before = cpu_times();
    const double result = round();
    const CpuTimes after = cpu_times();
    flags[0] = float((after.stolen - before.stolen) / std::max(1.0, after.total - before.total));
    shmem::allreduce(world, flags + 1, flags, 1, shmem::ReduceOp::max);
    all.push_back(result);
    if (flags[1] < 0.02f) clean.push_back(result);
  }
  if (int(clean.size()) < wanted && shmem::my_pe() == 0)
    fmt::print("calibrate: {}: {} of {} rounds ran while the hypervisor took over 2% of the CPU time (steal)\n", what,
               all.size() - clean.size(), all.size());
  return clean.empty() ? all : clean;
}

// Under the launcher (2 PEs): put and every collective, fitted, and the busy
// host's slowdown; PE 0 writes them.
void measure_links(const std::string& path) {
  const auto session = join_job();
  const int pes = shmem::n_pes(), me = shmem::my_pe();
  // the parent says what to measure: the links at a core per PE, or what PEs taking turns on a core cost
  const char* mode = std::getenv("COREMESH_CALIBRATE_MODE");
  const bool oversubscribed = mode != nullptr && std::string(mode) == "crowded";
  constexpr size_t kMost = 16 << 20;
  auto* src = static_cast<char*>(shmem::sym_malloc(kMost));
  auto* dst = static_cast<char*>(shmem::sym_malloc(kMost * size_t(pes)));
  std::fill(src, src + kMost, 1);
  const shmem::Team& world = shmem::Team::world();
  nlohmann::json out = nlohmann::json::object();
  // at a core per PE, as the trainer's PEs compute and exchange
  take_core_share();
  runtime::Device device(runtime::DeviceOptions{.cores = 1});
  runtime::Stream stream = device.default_stream();
  runtime::StreamGuard on(stream);
  if (!oversubscribed) {  // the links at a core per PE; crowded: only what sharing costs
    for (sim::Collective c : sim::all_collectives()) {
      std::vector<std::array<double, 3>> samples;
      for (size_t bytes = 8; bytes <= kMost; bytes *= 8) {
        const size_t per_pe = std::max<size_t>(bytes / size_t(pes), 4) / 4 * 4;
        const double seconds = median_seconds(
            [&] {
              switch (c) {
                case sim::Collective::put:
                  if (me == 0) shmem::put(dst, src, bytes, 1), shmem::quiet();
                  break;
                case sim::Collective::all_reduce:
                  shmem::allreduce(world, reinterpret_cast<float*>(dst), reinterpret_cast<const float*>(src),
                                   std::max<size_t>(bytes / 4, 1), shmem::ReduceOp::sum);
                  break;
                case sim::Collective::all_gather: shmem::allgather(world, dst, src, per_pe); break;
                case sim::Collective::reduce_scatter:
                  shmem::reduce_scatter(world, reinterpret_cast<float*>(dst), reinterpret_cast<const float*>(src),
                                        per_pe / 4, shmem::ReduceOp::sum);
                  break;
                case sim::Collective::all_to_all: shmem::alltoall(world, dst, src, per_pe); break;
              }
              shmem::barrier(world);
            },
            0, bytes < (1 << 20) ? 50 : 10);
        // a sample includes the barrier that completes it, as the trainer's exchanges wait for theirs
        samples.push_back({sim::collective_steps(c, pes), sim::collective_volume(c, pes, double(bytes)), seconds});
      }
      const sim::Fit f = fit(samples);
      out[sim::collective_name(c)] = {{"latency_seconds", f.latency}, {"bandwidth", f.bandwidth}};
    }
    shmem::sym_free(dst);
    shmem::sym_free(src);
    measure_seam_collectives(world_group(), stream, out["seams"]);
    measure_expert_exchange(world_group(), stream, out["seams"]);
  }
  auto* flags = static_cast<float*>(shmem::sym_malloc(2 * sizeof(float)));
  // a busy host: PE 0 computes alone (PE 1 waits, asleep), then both at once, each on its core
  const sim::Op gemm{.kind = sim::OpKind::gemm, .m = 1024, .n = 1024, .k = 256};
  const std::function<void()> gemm_kernel = kernel(gemm, stream);
  const Tensor a = random({int64_t(4) << 20}), b = random({int64_t(4) << 20});
  Tensor sum = Tensor::empty({int64_t(4) << 20});
  const std::function<void()> add_kernel = [&] {
    ops::add_out(a, b, sum);
    stream.synchronize();
  };
  for (const auto& [name, fn] : {std::pair{"busy_gemm_slowdown", &gemm_kernel}, std::pair{"busy_memory_slowdown", &add_kernel}}) {
    // alone and busy in turn, three times: the median ratio (a shared machine's neighbours come and go)
    std::vector<double> ratios = unstolen_rounds(
        3,
        [&] {
          double alone = 0;
          if (me == 0) alone = median_seconds(*fn, 0.2);
          shmem::barrier(world);
          const double busy = median_seconds(*fn, 0.2);
          shmem::barrier(world);
          return busy / std::max(alone, 1e-12);
        },
        world, flags, name);
    std::sort(ratios.begin(), ratios.end());
    out[name] = std::max(1.0, ratios[ratios.size() / 2]);
  }
  // partners' pace: a GEMM between all-reduces against the two alone (a PE
  // waits for the slowest partner; that wait grows with the compute between)
  auto* small = static_cast<float*>(shmem::sym_malloc(2 * sizeof(float)));
  small[1] = 1;
  const float* one = small + 1;
  const std::function<void()> tiny_sum = [&] { shmem::allreduce(world, small, one, 1, shmem::ReduceOp::sum); };
  // The mean of 21 rounds: a step waits for its partners' jitter on average, and a round's wait
  // ranges from 0 to several times the median (three calibrations' means here: 8.1, 9.4, 9.2%;
  // their medians 6.2, 5.7, 4.7%; the median of 7 rounds moved 7.7-14.1% between two calibrations)
  std::vector<double> waits = unstolen_rounds(
      21,
      [&] {
        const double compute = median_seconds(gemm_kernel, 0, 40), exchange = median_seconds(tiny_sum, 0, 100);
        const double pair = median_seconds(
            [&] {
              gemm_kernel();
              tiny_sum();
            },
            0, 40);
        return std::max(0.0, (pair - compute - exchange) / compute);
      },
      world, flags, "partners' pace");
  out[oversubscribed ? "crowded_partner_wait" : "partner_wait"] =
      std::accumulate(waits.begin(), waits.end(), 0.0) / double(waits.size());
  if (me == 0) std::ofstream(path) << out.dump(2) << "\n";  // the session's end frees the heap
}

// The fitted collectives of a links file into `link` (latency and bandwidth: the put's).
void read_links(const nlohmann::json& links, sim::Link& link) {
  for (const auto& [name, fj] : links.items()) {
    if (!fj.is_object() || name == "seams") continue;
    const sim::Fit fitted{fj.at("latency_seconds").get<double>(), fj.at("bandwidth").get<double>()};
    for (sim::Collective col : sim::all_collectives())
      if (sim::collective_name(col) == name) link.fitted[col] = fitted;
  }
  if (links.contains("seams"))
    for (const auto& [name, fj] : links.at("seams").items())
      for (sim::Collective col : sim::all_collectives())
        if (sim::collective_name(col) == name)
          link.seams[col] = {fj.at("latency_seconds").get<double>(), fj.at("bandwidth").get<double>()};
  link.latency = link.fitted.at(sim::Collective::put).latency;
  link.bandwidth = link.fitted.at(sim::Collective::put).bandwidth;
}

// Where the PEs leave their link figures: a private temporary file (named by
// the parent, found by the PEs it launches), never a name beside --output.
std::string links_file() {
  if (const char* path = std::getenv("COREMESH_CALIBRATE_LINKS")) return path;
  // a directory of our own (mkdtemp: 0700, a name nobody chose before us), not a guessable /tmp name
  std::string dir = (std::filesystem::temp_directory_path() / "coremesh-calibrate-XXXXXX").string();
  CM_CHECK(::mkdtemp(dir.data()) != nullptr, "set TMPDIR to a writable directory",
           "cannot create a temporary directory '{}': {}", dir, std::strerror(errno));
  const std::string path = dir + "/links.json";
  ::setenv("COREMESH_CALIBRATE_LINKS", path.c_str(), 1);
  return path;
}

nlohmann::json take_links(const std::string& path) {
  std::ifstream in(path);
  CM_CHECK(in.good(), "see the PEs' errors above", "the PEs wrote no link figures to '{}'", path);
  nlohmann::json links;
  try {
    in >> links;
  } catch (const nlohmann::json::exception& e) {
    CM_THROW(InvalidArgument, "see the PEs' errors above", "the link figures in '{}' are incomplete: {}", path,
             e.what());
  }
  std::filesystem::remove(path);
  return links;
}

// The temporary directory of links_file(), once the command is done with it.
void remove_links_dir(const std::string& links_path) {
  std::error_code ec;
  std::filesystem::remove_all(std::filesystem::path(links_path).parent_path(), ec);
}

// --output is checked before minutes of measuring: a directory, or a
// directory that does not exist, would only fail at the end.
void check_output_path(const std::string& out) {
  namespace fs = std::filesystem;
  CM_CHECK(!out.empty(), "name the cluster file to write, e.g. --output cluster.json", "--output is empty");
  std::error_code ec;
  CM_CHECK(!fs::is_directory(out, ec), fmt::format("name a file, such as '{}'", (fs::path(out) / "cluster.json").string()),
           "--output '{}' is a directory", out);
  const fs::path dir = fs::path(out).parent_path().empty() ? fs::path(".") : fs::path(out).parent_path();
  CM_CHECK(fs::is_directory(dir, ec) && ::access(dir.c_str(), W_OK) == 0,
           "create the directory first, or write the file elsewhere",
           "--output '{}': the directory '{}' does not exist or is not writable", out, dir.string());
}

// This command again under mpirun, 2 PEs each its own host (COREMESH_PES_PER_HOST=1), the
// network engine (ucx) over TCP on the loopback device: the network path as one machine has it.
int launch_network_pair() {
  std::string cmd =
      "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 "
      "COREMESH_PES_PER_HOST=1 COREMESH_TRANSPORT=ucx UCX_TLS=tcp UCX_NET_DEVICES=lo SHMEM_SYMMETRIC_SIZE=160M "
      "COREMESH_CALIBRATE_MODE=links "
      "mpirun -n 2 --mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include lo --mca osc pt2pt "
      "-x COREMESH_PES_PER_HOST -x COREMESH_TRANSPORT -x UCX_TLS -x UCX_NET_DEVICES -x SHMEM_SYMMETRIC_SIZE "
      "-x OPENBLAS_NUM_THREADS -x COREMESH_CALIBRATE_MODE -x COREMESH_CALIBRATE_LINKS";
  std::vector<std::string> argv = command_line();
  argv[0] = std::filesystem::read_symlink("/proc/self/exe").string();
  for (const std::string& a : argv) {  // single-quoted for the shell
    std::string quoted = " '";
    for (char ch : a) quoted += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
    cmd += quoted + "'";
  }
  return std::system(cmd.c_str());
}

void run_calibrate(const CalibrateFlags& f) {
  if (under_launcher()) {
    measure_links(links_file());
    return;
  }
  check_output_path(f.out);
  const std::string links_path = links_file();
  struct RemoveAtEnd {
    std::string path;
    ~RemoveAtEnd() { remove_links_dir(path); }
  } remove_at_end{links_path};
  const train::TrainConfig cfg = f.flags.read();
  cfg.model.validate();
  const CpuTimes start = cpu_times();
  const int threads = cfg.cores > 0 ? cfg.cores : 1;  // --cores: per PE
  runtime::Stream stream = runtime::Device::default_device().default_stream();
  runtime::StreamLimitGuard guard(stream, threads, threads);
  sim::Cluster c;
  c.name = fmt::format("this machine, {} core(s) per PE (coremesh calibrate)", threads);
  c.threads = threads;
  const auto shapes = shapes_to_measure(cfg, f.max_pes);
  fmt::print("calibrate: {} kernel shapes of the config's layouts on 1-{} PEs, {} thread(s) each\n", shapes.size(),
             f.max_pes, threads);
  for (const auto& [key, seconds] : round_robin_medians(shapes, stream, f.budget))
    c.measured[key] = {shapes.at(key).flops, seconds};
  // element-wise: c = a + b (reads 2, writes 1) from 48 KiB to 192 MiB
  for (int64_t n = 4096; n <= (int64_t(16) << 20); n *= 4) {
    const Tensor a = random({n}), b = random({n});
    Tensor out = Tensor::empty({n});
    const double seconds = median_seconds(
        [&] {
          ops::add_out(a, b, out);
          stream.synchronize();
        },
        f.budget);
    c.elementwise_curve.emplace_back(12.0 * double(n), seconds);
  }
  const double peak = train::measured_peak_flops(threads);
  c.device.name = fmt::format("CPU PE, {} core(s)", threads);
  // the CPU computes bf16 and fp8 GEMMs in f32 (their inputs converted): one peak
  c.device.peak_flops = {{"f32", peak}, {"bf16", peak}, {"fp8", peak}};
  c.device.memory_bandwidth = c.elementwise_curve.back().first / c.elementwise_curve.back().second;
  c.device.cube_cores = c.device.vector_cores = threads;
  c.cpu_cores = runtime::Device::default_device().num_cores();
  c.host_devices = f.max_pes;
  c.devices = f.max_pes;
  std::ifstream meminfo("/proc/meminfo");
  std::string label;
  double kib = 0;
  meminfo >> label >> kib;
  c.device.memory_bytes = kib * 1024 / f.max_pes;  // the host's memory over its PEs
  // the links: 2 PEs on this host
  fmt::print("calibrate: put and collectives at 2 PEs (shm transport)\n");
  std::fflush(stdout);
  ::setenv("COREMESH_CALIBRATE_MODE", "links", 1);
  CM_CHECK(launch_self(2, 64 << 20) == 0, "see the PEs' errors above", "the link measurement failed");
  const nlohmann::json links = take_links(links_path);
  // and with twice as many PEs as cores, what an exchange costs when PEs take turns on them
  const int crowded = 2 * c.cpu_cores;
  if (crowded <= f.max_pes) {
    fmt::print("calibrate: an exchange between computes at {} PEs on {} cores\n", crowded, c.cpu_cores);
    std::fflush(stdout);
    ::setenv("COREMESH_CALIBRATE_MODE", "crowded", 1);
    CM_CHECK(launch_self(crowded, 64 << 20) == 0, "see the PEs' errors above", "the shared-core measurement failed");
    const nlohmann::json more = take_links(links_path);
    c.crowded_partner_wait = more.at("crowded_partner_wait").get<double>();
  }
  c.intra_host.name = "shared memory (coremesh shm transport)";
  c.busy_gemm_slowdown = links.at("busy_gemm_slowdown").get<double>();
  c.busy_memory_slowdown = links.at("busy_memory_slowdown").get<double>();
  c.partner_wait = links.at("partner_wait").get<double>();
  if (c.crowded_partner_wait == 0) c.crowded_partner_wait = c.partner_wait;
  read_links(links, c.intra_host);
  if (f.network) {
    fmt::print("calibrate: put and collectives on the network path (mpirun, ucx over loopback TCP)\n");
    std::fflush(stdout);
    CM_CHECK(launch_network_pair() == 0, "see the errors above (mpirun and OpenMPI are installed by make test)",
             "the network path's measurement failed");
    read_links(take_links(links_path), c.inter_host);
    c.inter_host.name = "network path: ucx over TCP on the loopback device (one machine)";
  } else {
    c.inter_host = c.intra_host;  // one host: no link between hosts was measured
    c.inter_host.name = "not measured (one host, no --network): the intra-host figures";
  }
  const CpuTimes end = cpu_times();
  const double stolen = (end.stolen - start.stolen) / std::max(1.0, end.total - start.total);
  c.sources = {fmt::format("measured by coremesh calibrate on {} (config {})", "this machine",
                           f.flags.config.empty() ? "defaults" : f.flags.config),
               fmt::format("the hypervisor took {:.1f}% of the host's CPU time while it measured (steal)", 100 * stolen)};
  sim::save_cluster(c, f.out);
  fmt::print("wrote {}: GEMM peak {:.3g} GFLOP/s per PE, memory bandwidth {:.3g} GB/s, put latency {:.3g} us, "
             "bandwidth {:.3g} GB/s; partners wait {:.1f}% of their compute ({:.1f}% with 2 PEs a core); with every core busy GEMMs run {:.2f}x, element-wise {:.2f}x the time\n",
             f.out, peak / 1e9, c.device.memory_bandwidth / 1e9, c.intra_host.latency * 1e6,
             c.intra_host.bandwidth / 1e9, 100 * c.partner_wait, 100 * c.crowded_partner_wait, c.busy_gemm_slowdown, c.busy_memory_slowdown);
  // a VM whose host gives its cores to other guests runs slower, by as much, at moments no
  // calibration can know: say so, since predictions made from these figures move with it
  if (stolen > 0.02)
    fmt::print("calibrate: the hypervisor took {:.0f}% of this machine's CPU time while it measured (steal in "
               "/proc/stat): steps will run faster or slower than priced as that share moves; calibrate again "
               "when it is lower for figures that hold\n",
               100 * stolen);
}

}  // namespace

void register_calibrate_command(CLI::App& app) {
  auto f = std::make_shared<CalibrateFlags>();
  auto* cmd = app.add_subcommand("calibrate", "Measure this machine into a cluster file for simulate and plan");
  cmd->add_option("--output", f->out, "the cluster file to write")->capture_default_str();
  cmd->add_flag("--network", f->network,
                "also measure the network path: 2 PEs under mpirun, each its own host, ucx over loopback TCP");
  cmd->add_option("--max-pes", f->max_pes, "measure the shapes of the layouts of up to this many PEs")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  cmd->add_option("--seconds", f->budget, "repeats per shape, in seconds (the median is kept)")
      ->capture_default_str()
      ->check(finite_in(0.001, 10.0));
  f->flags.add(*cmd);
  cmd->callback([f] { run_calibrate(*f); });
}

}  // namespace coremesh::cli
