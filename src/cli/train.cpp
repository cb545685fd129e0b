// `coremesh train`: training of the MoE model on text, as bytes or with a
// SentencePiece tokenizer (--tokenizer tok.model).
//
//   coremesh train --config run.json --data data/bible.txt --steps 500
//   coremesh train --config run.json --dry-run      # sizes, FLOPs, memory; no training
//   coremesh train --config run.json --resume runs/x  # continue from the latest checkpoint
//   coremesh tune --config run.json --tune-cache tuning.json  # measure the tilings; no training
//   coremesh train --config run.json --tune-cache tuning.json  # train with them
//
// Precedence: built-in defaults < config file (JSON: {"model": {...},
// "train": {...}, "parallel": {...}}) < flags. The flags are generated from
// the configs' field tables (`coremesh train --help` lists them all).
#include <fmt/format.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cmath>
#include <csignal>
#include <cstdlib>
#include <map>
#include <memory>
#include <numeric>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "coremesh/core/error.hpp"
#include "coremesh/parallel/comm.hpp"
#include "coremesh/parallel/mesh.hpp"
#include "coremesh/runtime/profiler.hpp"
#include "coremesh/shmem/heap.hpp"
#include "coremesh/shmem/session.hpp"
#include "coremesh/shmem/team.hpp"
#include "coremesh/train/safetensors.hpp"
#include "coremesh/train/metrics_log.hpp"
#include "coremesh/train/progress_bar.hpp"
#include "coremesh/train/trainer.hpp"
#include "coremesh/train/checkpoint.hpp"
#include "coremesh/train/tuning.hpp"
#include "config_flags.hpp"
#include "pe_setup.hpp"
#include "coremesh/core/allocator.hpp"
#include "stop_signals.hpp"

namespace coremesh::cli {
namespace {

struct TrainFlags {
  ConfigFlags flags;
  std::string resume, profile_dir, tune_cache;
  bool dry_run = false, no_progress = false, overwrite = false;
  bool tune = false, tune_only = false;  // --tune; the `tune` command
  runtime::TuneOptions tuning;
};

// The tiling tuner on this run's own step (a trainer of its own, dropped
// after: the run trains from its initial weights), a progress bar on the leader.
void tune_tilings(const TrainFlags& f, const train::TrainConfig& cfg, runtime::Device& device, bool leader) {
  runtime::TuneOptions o = f.tuning;
  std::unique_ptr<train::ProgressBar> bar;
  if (leader && cfg.progress)
    o.progress = [&bar](int runs, int planned) {
      if (!bar) bar = std::make_unique<train::ProgressBar>(planned, train::ProgressBar::Options{"tune", "runs"});
      bar->set(std::min(runs, planned));
    };
  const train::StepTuning t = train::tune_step_tilings(cfg, device, o, f.tune_cache);
  bar.reset();
  fmt::print("{}\ntuning cache: {}\n", t.summary(), std::filesystem::absolute(f.tune_cache).string());
  std::fflush(stdout);
}

std::string other_run_hint(const train::TrainConfig& cfg) {
  return fmt::format("continue that run with --resume {0}, give another --out, or add --overwrite to delete its "
                     "checkpoints and metrics.jsonl and start over", cfg.out_dir);
}

// <out>/config.json is the run's full config: it may not replace the --config
// file the user wrote, unless the run continues (--resume) or starts over
// (--overwrite) the run in that directory, whose record it is.
void check_config_survives(const train::TrainConfig& cfg, const TrainFlags& f) {
  if (f.flags.config.empty() || !f.resume.empty() || f.overwrite) return;
  std::error_code ec;
  const auto target = std::filesystem::path(cfg.out_dir) / "config.json";
  CM_CHECK(!std::filesystem::equivalent(f.flags.config, target, ec),
           "give --out another directory (the run writes its full config as <out>/config.json)",
           "--out '{}' holds the --config file '{}': the run would replace it", cfg.out_dir, f.flags.config);
}

// Before the start-up costs; a --resume is judged by Trainer::claim_out_dir
// once the run can start (--overwrite: starts over then).
void refuse_other_run(const train::TrainConfig& cfg, const TrainFlags& f) {
  check_config_survives(cfg, f);
  if (!f.resume.empty() || f.tune_only || f.overwrite) return;
  train::refuse_other_run(cfg.out_dir, other_run_hint(cfg));
}

// What the process holds besides tensors: this executable and its libraries
// as loaded now, and the data files (read through a mapping).
int64_t data_bytes(const train::TrainConfig& c) {
  int64_t bytes = 0;
  for (const std::string& path : c.data) {
    std::error_code ec;
    const auto size = std::filesystem::file_size(path, ec);
    if (!ec) bytes += int64_t(size);
  }
  return bytes;
}
int64_t process_bytes(const train::TrainConfig& c) {
  int64_t resident_pages = 0;
  std::ifstream statm("/proc/self/statm");
  statm >> resident_pages >> resident_pages;  // size, then resident
  return resident_pages * int64_t(sysconf(_SC_PAGESIZE)) + data_bytes(c);
}

parallel::SplitSizes split_sizes(const train::TrainConfig& c) { return parallel::split_sizes(train::plan_config(c).shape); }

void print_dry_run(const train::TrainConfig& c) {
  const parallel::ParallelConfig& pc = c.parallel;
  if (pc.virtual_stages != 1 && pc.schedule_file.empty() &&
      (pc.pp == 1 || pc.schedule != parallel::PipelineSchedule::interleaved))
    fmt::print("note: virtual_stages {} has no effect: it cuts each pipeline rank's layers into chunks for the "
               "interleaved schedule (--pp 2 or more, --schedule interleaved)\n", pc.virtual_stages);
  if (c.sample_tokens > 0 && !c.samples_at_validation())
    fmt::print("note: the validations sample no text: each PE holds part of the model (pp, tp or cp); "
               "`coremesh generate --checkpoint` samples a checkpoint\n");
  const auto& m = c.model;
  const auto p = model::count_params(m);
  const double fpt = model::flops_per_token(m, c.seq_len);
  const auto mem = model::estimate_memory(m, c.batch_size, c.seq_len);
  fmt::print("model: {} layers ({} dense, {} MoE), d_model {}, heads {} (kv {}), head dim {}\n",
             m.n_layers, m.n_layers - m.n_moe_layers(), m.n_moe_layers(), m.d_model, m.n_heads,
             m.n_kv_heads, m.head_dim());
  if (m.n_routed_experts > 0)
    fmt::print("experts: {} routed (top-{}, {} gating, {} groups keep {}), {} shared, hidden {}\n",
               m.n_routed_experts, m.top_k, model::gating_name(m.gating), m.n_groups, m.topk_groups,
               m.n_shared_experts, m.expert_hidden);
  fmt::print("parameters: {} total ({}), {} active per token, {} in routed experts\n", p.total,
             train::format_count(double(p.total)), train::format_count(double(p.active)),
             train::format_count(double(p.expert)));
  fmt::print("FLOPs per token (train, seq_len {}): {}\n", c.seq_len, train::format_count(fpt));
  fmt::print("FLOPs per step ({} tokens): {}\n", c.tokens_per_step(),
             train::format_count(fpt * double(c.tokens_per_step())));
  const std::string copies = mem.weight_copies > 0
      ? fmt::format(", {} weight copies", train::format_bytes(double(mem.weight_copies))) : "";
  const int64_t process = process_bytes(c);
  // The tensors above and the allocator's cache, on one PE (a layout's ranks:
  // the table of print_layout; rank 0's host share lacks the heap's tensors).
  train::TrainConfig one_pe = c;
  one_pe.parallel.dp = one_pe.parallel.cp = one_pe.parallel.pp = one_pe.parallel.ep = one_pe.parallel.tp = 1;
  const int64_t host = train::rank_host_bytes(one_pe, 0);
  fmt::print("memory{}: weights {}, gradients {}, AdamW {}, activations {} (micro-batch {}x{}, {}){}, "
             "workspace {}, run-ahead and cache {}, process {}, total {}\n",
             c.parallel.world() > 1 ? " if run on one PE" : "", train::format_bytes(double(mem.weights)), train::format_bytes(double(mem.gradients)),
             train::format_bytes(double(mem.optimizer)), train::format_bytes(double(mem.activations)),
             c.batch_size, c.seq_len, model::precision_name(m.precision), copies,
             train::format_bytes(double(mem.workspace)), train::format_bytes(double(host - mem.total())),
             train::format_bytes(double(process)), train::format_bytes(double(host + process)));
}

// The machine's memory and swap, bytes (0 if /proc/meminfo cannot be read).
double machine_memory_bytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key, unit;
  double kib = 0, total = 0;
  while (meminfo >> key >> kib >> unit)
    if (key == "MemTotal:" || key == "SwapTotal:") total += kib * 1024;
  return total;
}

// What rank `r` holds at its peak but the process itself: one PE, its host
// tensors; a launched layout, the dry run's total (heap + step or checkpoint).
double rank_peak_bytes(const train::TrainConfig& c, int r) {
  const int world = c.parallel.world();
  if (world == 1) return double(train::rank_host_bytes(c, 0));
  const int64_t heap = parallel::ParallelPlan::symmetric_bytes(train::plan_config(c), world);
  return double(heap + std::max(train::rank_host_bytes(c, r), train::rank_checkpoint_bytes(c, r)));
}

// A run whose PEs on this machine together need more than it has would end
// in bad_alloc (or the OOM killer) after loading its data: refused first,
// with the estimate. Twice the memory: the estimate is an upper bound, not a
// fit. `ranks`: the ranks that share this machine's memory; the data files
// count once (the PEs map them: one copy in the page cache).
void check_fits_the_machine(const train::TrainConfig& c, const std::vector<int>& ranks) {
  const double have = machine_memory_bytes();
  if (have <= 0) return;
  const int64_t process = process_bytes(c), data = data_bytes(c);
  double need = double(data) + double(ranks.size()) * double(process - data);
  // Ranks that differ only in their data-parallel coordinate hold the same
  // (rank 0 also assembles checkpoints): one estimate each, not O(world^2).
  const int world = c.parallel.world();
  const parallel::Mesh mesh(c.parallel, world, split_sizes(c));
  std::map<std::pair<bool, std::array<int, 5>>, double> seen;
  for (int r : ranks) {
    parallel::Coords k = world > 1 ? mesh.coords(r) : parallel::Coords{};
    k[parallel::Dim::dp] = 0;
    auto [it, fresh] = seen.try_emplace({r == 0, k.c}, 0.0);
    if (fresh) it->second = rank_peak_bytes(c, r);
    need += it->second;
  }
  CM_CHECK(need <= 2 * have,
           ranks.size() == 1 ? "lower batch_size or seq_len, use a smaller model, or spread the run over PEs (--dp, --ep, --pp, --tp)"
                             : "lower batch_size or seq_len, use a smaller model, or start the PEs on several machines (mpirun)",
           "{} about {} of memory (coremesh train --dry-run shows the estimate), more than twice this machine's {} "
           "(memory and swap)", ranks.size() == 1 ? "the run needs" : fmt::format("the run's {} PEs on this machine need", ranks.size()),
           train::format_bytes(need), train::format_bytes(have));
}

// Whether the run's last step lacks the final validation (a stop cut it short).
bool final_validation_missed(const train::TrainConfig& cfg) {
  std::error_code ec;
  const auto path = std::filesystem::path(cfg.out_dir) / "metrics.jsonl";
  if (!std::filesystem::is_regular_file(path, ec)) return false;
  try {
    const std::vector<train::MetricsLine> lines = train::read_metrics(path.string());
    return !lines.empty() && lines.back().record.step + 1 == cfg.steps && lines.back().val_loss < 0;
  } catch (const Error&) {
    return false;  // the resume itself judges a damaged file
  }
}

// The run directory a --resume names: DIR, DIR/checkpoints(/), a checkpoint
// file in it, or one set aside in DIR/checkpoints/superseded_after_step_N.
std::filesystem::path run_dir_of(const std::string& resume) {
  std::error_code ec;
  std::filesystem::path p = std::filesystem::path(resume).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();  // a trailing '/'
  if (!std::filesystem::is_directory(p, ec)) p = p.parent_path();
  while (p.filename() == "checkpoints" || p.filename().string().rfind("superseded_after_step_", 0) == 0)
    p = p.parent_path();
  return p;
}

train::TrainConfig read_config(const TrainFlags& f) {
  // `--resume DIR` without --config continues that run as it was: its own
  // config.json, into DIR (flags still override both).
  std::string run_config;
  std::filesystem::path run_dir;
  if (f.flags.config.empty() && !f.resume.empty()) {
    std::error_code ec;
    run_dir = run_dir_of(f.resume);
    if (std::filesystem::is_regular_file(run_dir / "config.json", ec)) run_config = (run_dir / "config.json").string();
  }
  train::TrainConfig cfg = run_config.empty() ? f.flags.read() : f.flags.read(run_config);
  if (!run_config.empty() && !f.flags.train->given("out_dir")) cfg.out_dir = run_dir.string();
  if (f.no_progress) cfg.progress = false;
  return cfg;
}

// "dp 2 x pp 2", and the schedule of a pipeline.
std::string layout_name(const train::TrainConfig& c, int world) {
  std::string out = parallel::Mesh(c.parallel, world, split_sizes(c)).describe();
  if (c.parallel.pp > 1)
    out += fmt::format(", schedule {} with {} micro-batches", parallel::plan_schedule(c.parallel, c.grad_accum).name, c.grad_accum);
  return out;
}

// --dry-run of a parallel layout: what each rank holds and needs.
void print_layout(const train::TrainConfig& c) {
  const int world = c.parallel.world();
  const parallel::Mesh mesh(c.parallel, world, split_sizes(c));
  fmt::print("layout: {}, ZeRO-{}\n", layout_name(c, world), c.parallel.zero);
  fmt::print("{:>5}  {:<20} {:>8} {:>10} {:>10} {:>10} {:>10} {:>14} {:>10}\n", "rank", "coordinates", "experts",
             "weights", "gradients", "AdamW", "step", "symmetric heap", "total");
  const bool pipeline = c.parallel.pp > 1;
  const parallel::PlanConfig plan = train::plan_config(c);
  const int E = c.model.n_routed_experts;
  const int64_t heap = parallel::ParallelPlan::symmetric_bytes(train::plan_config(c), world);
  const int64_t process = process_bytes(c);
  for (int r = 0; r < world; ++r) {
    if (world > 16 && r == 8) fmt::print("  ... ({} more ranks with the same shares)\n", world - 9);
    if (world > 16 && r >= 8 && r < world - 1) continue;
    const parallel::Coords k = mesh.coords(r);
    // its pipeline stage(s), experts, TP slices and rows (activations: one micro-batch through them)
    const model::StageLayout stage = parallel::stage_of_pe(plan, world, r);
    const auto mem = model::estimate_memory(c.model, c.batch_size, c.seq_len / c.parallel.cp, stage);  // CP: its chunks
    // ZeRO-1 keeps each group's share of the optimizer state
    const auto held = model::count_params(c.model, stage);
    const double dense = double(held.total - held.expert), expert = double(held.expert);
    const double adam = c.parallel.zero ? 8.0 * (dense / double(mesh.dense_grad_group(r).size()) +
                                                 expert / double(mesh.expert_grad_group(r).size()))
                                        : double(mem.optimizer);
    const int64_t step = train::rank_step_bytes(c, r), checkpoint = train::rank_checkpoint_bytes(c, r),
                  host = train::rank_host_bytes(c, r);
    fmt::print("{:>5}  {:<20} {:>8} {:>10} {:>10} {:>10} {:>10} {:>14} {:>10}\n", r,
               pipeline ? fmt::format("dp {} pp {}", k[parallel::Dim::dp], k[parallel::Dim::pp])
                        : c.parallel.tp > 1
                            ? fmt::format("dp {} ep {} tp {}", k[parallel::Dim::dp], k[parallel::Dim::ep], k[parallel::Dim::tp])
                            : fmt::format("dp {} ep {}", k[parallel::Dim::dp], k[parallel::Dim::ep]),
               fmt::format("{}-{}", stage.expert_begin, (stage.expert_end < 0 ? E : stage.expert_end) - 1),
               train::format_bytes(double(mem.weights)), train::format_bytes(double(mem.gradients)),
               train::format_bytes(adam), train::format_bytes(double(step)), train::format_bytes(double(heap)),
               train::format_bytes(double(heap + std::max(host, checkpoint) + process)));
  }
  fmt::print("(per rank: weights, gradients and AdamW live in the symmetric heap with the exchanges' buffers; step: the "
             "host memory of a step's micro-batches in flight, their backward's workspace and the sends kept; total: "
             "heap + step with the run-ahead and the allocator's cache ({}x step) + process {}; rank 0 saves checkpoints between steps, assembling the whole model: {})\n",
             fmt::format("{:.2f}", double(train::rank_host_bytes(c, 0)) / double(train::rank_step_bytes(c, 0))),
             train::format_bytes(double(process)), train::format_bytes(double(train::rank_checkpoint_bytes(c, 0))));
}

// Returns the process's exit status: 0, or 128 + the stop signal received.
int run_train(const TrainFlags& f) {
  // A file past `ulimit -f` then fails with EFBIG, whose message names the
  // limit; the signal killed the run without a word (and PEs at start, as
  // their heap's backing file grew).
  std::signal(SIGXFSZ, SIG_IGN);
  train::TrainConfig cfg = read_config(f);
  const int world = cfg.parallel.world();
  if (f.dry_run) {
    cfg.validate(/*need_data=*/false);  // before anything is printed from the values
    print_dry_run(cfg);
    if (world > 1) print_layout(cfg);
    fmt::print("config OK (dry run: nothing trained)\n");
    return 0;
  }
  cfg.validate();
  if (!under_launcher()) {  // every PE runs here
    std::vector<int> all(static_cast<size_t>(world));
    std::iota(all.begin(), all.end(), 0);
    check_fits_the_machine(cfg, all);
  }
  if (!under_launcher()) refuse_other_run(cfg, f);  // under a launcher: the leader, below
  if (world > 1 && !under_launcher()) {  // start the PEs, each running this command
    parallel::Mesh(cfg.parallel, world, split_sizes(cfg));  // a bad layout is refused before any PE starts
    const int status = launch_self(world, parallel::ParallelPlan::symmetric_bytes(train::plan_config(cfg), world));
    std::fflush(stdout);
    std::exit(status);
  }
  install_stop_signals(/*second_stops_at_once=*/!under_launcher());
  // A PE of a launched job: join it and take this PE's share of the cores.
  std::unique_ptr<shmem::Session> session;
  std::unique_ptr<runtime::Device> device;
  std::unique_ptr<train::Trainer> trainer;
  bool leader = true;
  train::TrainResult r;
  try {
    if (under_launcher()) {
      session = join_job();
      CM_CHECK(shmem::n_pes() == world,
               fmt::format("set the parallel degrees so that dp x cp x pp x ep x tp = {}, or start {} PEs",
                           shmem::n_pes(), world),
               "the parallel layout needs {} PEs, the job has {}", world, shmem::n_pes());
      const int64_t need = parallel::ParallelPlan::symmetric_bytes(train::plan_config(cfg), world);
      const int64_t have = int64_t(shmem::SymmetricHeap::instance().stats().capacity);
      CM_CHECK(have >= need, fmt::format("start the job with a symmetric heap of at least {} MiB (coremesh run --heap "
                                         "{}M, or COREMESH_HEAP_SIZE / SHMEM_SYMMETRIC_SIZE)",
                                         need >> 20, (need >> 20) + 1),
               "this layout needs {} MiB of symmetric heap per PE, the job has {} MiB", need >> 20, have >> 20);
      check_fits_the_machine(cfg, shmem::Team::shared().world_pes());  // the PEs known to share this memory
      const std::vector<int> cpus = take_core_share();
      device = std::make_unique<runtime::Device>(runtime::DeviceOptions{.cores = int(cpus.size())});
      cfg.cores = cfg.cores > 0 ? std::min(cfg.cores, int(cpus.size())) : int(cpus.size());
      leader = shmem::my_pe() == 0;
      if (!leader) cfg.progress = false, cfg.report = false;
      fmt::print("PE {} of {}: {} core{} (CPU {})\n", shmem::my_pe(), world, cfg.cores, cfg.cores == 1 ? "" : "s",
                 fmt::join(cpus, ","));
      std::fflush(stdout);
    }
    if (leader && !f.tune_only) {
      if (under_launcher()) refuse_other_run(cfg, f);
      print_dry_run(cfg);
    }
    runtime::Device& dev = device ? *device : runtime::Device::default_device();
    if (f.tune || f.tune_only) tune_tilings(f, cfg, dev, leader);
    if (f.tune_only) return 0;
    trainer = std::make_unique<train::Trainer>(cfg, dev);
    if (!f.tune_cache.empty() && (f.tune || std::filesystem::exists(f.tune_cache)))
      runtime::load_tuning_cache(f.tune_cache);  // after the trainer's own probes (the GEMM peak)
    else if (!f.tune_cache.empty() && leader)
      fmt::print("tuning cache '{}' does not exist yet: heuristic tilings (make it with `coremesh tune` or --tune)\n",
                 f.tune_cache);
    if (leader) fmt::print("compute cores: {}{}\n", trainer->cores(),
                           world > 1 ? fmt::format(" per PE, {} PEs ({})", world, layout_name(cfg, world)) : "");
    if (!f.resume.empty()) {
      trainer->resume(f.resume);
      if (leader) fmt::print("resumed from '{}' at step {}\n", f.resume, trainer->step());
      CM_CHECK(trainer->step() <= cfg.steps, fmt::format("give --steps above {} to train further", trainer->step()),
               "checkpoint '{}' is at step {}, past this run's {} steps", f.resume, trainer->step(), cfg.steps);
      if (trainer->step() == cfg.steps) {
        if (leader) fmt::print("nothing to train: the run is at step {} of {} (give --steps above {} to train further)\n",
                               cfg.steps, cfg.steps, cfg.steps);
        // a final validation that a stop cut short runs now (the leader's metrics.jsonl says), with the report
        int64_t missed = leader && final_validation_missed(cfg);
        if (world > 1) missed = parallel::max_over_world({missed})[0];
        if (!missed) return 0;
        trainer->claim_out_dir(false, other_run_hint(cfg));
        trainer->stop_when([] { return stop_signal() != 0; });
        const train::TrainResult done = trainer->run(-1, /*save_at_end=*/false);
        if (leader && done.final_val_loss >= 0)
          fmt::print("validation at step {}: {:.4f} nats/token = {:.3f} bits/byte\n", cfg.steps, done.final_val_loss,
                     done.final_val_bits_per_byte);
        if (leader && done.stopped)
          fmt::print("stopped by {} during the validation; continue with --resume {}\n", stop_signal_name(stop_signal()),
                     std::filesystem::absolute(cfg.out_dir).string());
        return stop_signal() ? 128 + stop_signal() : 0;
      }
    }
    // the run directory changes only now that the run can start (its model, data and checkpoint accepted)
    trainer->claim_out_dir(f.overwrite, other_run_hint(cfg));
    if (leader) {
      // with absolute paths: `--resume DIR` reads it from any directory
      train::TrainConfig record = cfg;
      for (std::string* path : {&record.tokenizer, &record.parallel.schedule_file, &record.out_dir})
        if (!path->empty()) *path = std::filesystem::absolute(*path).lexically_normal().string();
      for (std::string& path : record.data) path = std::filesystem::absolute(path).lexically_normal().string();
      train::write_file_atomic((std::filesystem::path(cfg.out_dir) / "config.json").string(),
                               train::to_json(record).dump(2) + "\n");
    }
    trainer->stop_when([] { return stop_signal() != 0; });
    const std::string profile_dir =
        f.profile_dir.empty() || world == 1 ? f.profile_dir : f.profile_dir + "/pe" + std::to_string(shmem::my_pe());
    if (!profile_dir.empty()) {
      runtime::prepare_profile_dir(profile_dir);  // before training: a bad path must not cost the run
      runtime::profiler_start();
    }
    r = trainer->run();
    if (!profile_dir.empty()) {
      runtime::profiler_stop();
      for (const auto& p : runtime::profiler_export(profile_dir)) fmt::print("profile: {}\n", p);
    }
    // measured, per PE: what ZeRO-1 shards, and the process's high-water mark
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    fmt::print("memory{}: AdamW state {}, tensors at most {}, peak RSS {}\n",
               session ? fmt::format(" on PE {}", shmem::my_pe()) : "",
               train::format_bytes(double(trainer->optimizer_state_bytes())),
               train::format_bytes(double(host_allocator_stats().peak_allocated_bytes)),
               train::format_bytes(double(usage.ru_maxrss) * 1024));
    std::fflush(stdout);
  } catch (const std::exception& e) {
    // A failed PE must not unwind: freeing symmetric memory is collective and
    // would wait for the others. It reports and exits; the launcher stops
    // the job and removes its shared memory.
    if (!session) throw;
    std::fprintf(stderr, "coremesh: error on PE %d: %s\n", shmem::my_pe(), e.what());
    std::fflush(stdout);
    std::fflush(stderr);
    std::_Exit(1);
  }
  const int status = stop_signal() ? 128 + stop_signal() : 0;
  if (!leader) return status;
  fmt::print("done: {} steps, loss {:.4f}", r.steps_done, r.final_loss);
  if (r.final_val_loss >= 0)
    fmt::print(", validation {:.4f} nats/token = {:.3f} bits/byte", r.final_val_loss, r.final_val_bits_per_byte);
  fmt::print("\nthroughput: {:.0f} tokens/s, MFU {:.1f}% of the measured GEMM peak\n",
             r.mean_tokens_per_s, 100 * r.mean_mfu);
  if (!r.final_balance.empty())
    fmt::print("expert balance at the last step, per MoE layer: {:.2f} (busiest expert's tokens / mean; 1 = even)\n",
               fmt::join(r.final_balance, ", "));
  if (!r.graph.empty()) fmt::print("{}\n", r.graph);
  if (!r.checkpoint.empty()) fmt::print("checkpoint: {}\n", std::filesystem::absolute(r.checkpoint).string());
  if (!r.report.empty()) fmt::print("report: {}\n", std::filesystem::absolute(r.report).string());
  if (r.stopped)
    fmt::print("stopped by {} after step {} of {}; continue with --resume {}\n", stop_signal_name(stop_signal()),
               r.steps_done, cfg.steps, std::filesystem::absolute(cfg.out_dir).string());
  return status;
}

void add_tuning_flags(CLI::App& cmd, TrainFlags& f) {
  cmd.add_option("--tune-budget", f.tuning.budget,
                 "timed evaluations per op key, as a fraction of an exhaustive search's")
      ->check(finite_in(1e-3, 1.0));
  cmd.add_option("--tune-repeats", f.tuning.repeats, "timings per candidate of the exhaustive search")
      ->check(CLI::Range(1, 100));
  cmd.add_option("--tune-time-limit", f.tuning.time_limit_s, "seconds; then the best tilings so far are kept")
      ->check(finite_in(1e-3, 1e9));
  cmd.add_option("--tune-tolerance", f.tuning.tolerance,
                 "relative change of the gradients a tiling may cause (0: bit-identical)")
      ->check(finite_in(0.0, 1.0));
  cmd.add_option("--tune-step-rounds", f.tuning.step_rounds,
                 "whole steps per side when the step decides between the picks and the heuristics "
                 "(0: the launches' own timings decide)")
      ->check(CLI::Range(0, 100))
      ->capture_default_str();
}

}  // namespace

void register_train_command(CLI::App& app) {
  auto f = std::make_shared<TrainFlags>();
  auto* cmd = app.add_subcommand("train", "Train the MoE transformer on text (bytes, or --tokenizer)");
  cmd->add_option("--resume", f->resume, "checkpoint file or run directory to continue from");
  cmd->add_flag("--dry-run", f->dry_run, "print parameter count, FLOPs per token and memory; do not train");
  cmd->add_flag("--overwrite", f->overwrite,
                "start over in a --out that holds another run's checkpoints (deletes them and its metrics.jsonl)");
  cmd->add_option("--profile", f->profile_dir, "write kernel_details.csv and a Chrome trace here");
  cmd->add_flag("--no-progress", f->no_progress, "no progress output");
  cmd->add_option("--tune-cache", f->tune_cache, "tuned tilings to use (written by `coremesh tune` or --tune)");
  cmd->add_flag("--tune", f->tune, "measure the tilings of this run's ops first, into --tune-cache")
      ->needs(cmd->get_option("--tune-cache"));
  add_tuning_flags(*cmd, *f);
  f->flags.add(*cmd);
  cmd->callback([f] {
    const int status = run_train(*f);  // every PE has left the job (collective teardown) by now
    if (status != 0) {
      std::fflush(stdout);
      std::exit(status);
    }
  });
}

void register_tune_command(CLI::App& app) {
  auto f = std::make_shared<TrainFlags>();
  f->tune_only = true;
  f->tune_cache = "tuning_cache.json";
  auto* cmd = app.add_subcommand("tune", "Measure the tilings of a training run's ops into a tuning cache (no training)");
  cmd->add_option("--tune-cache", f->tune_cache, "the cache to write (entries of other keys are kept)")->capture_default_str();
  cmd->add_flag("--no-progress", f->no_progress, "no progress output");
  add_tuning_flags(*cmd, *f);
  f->flags.add(*cmd);
  cmd->callback([f] { run_train(*f); });
}

}  // namespace coremesh::cli
