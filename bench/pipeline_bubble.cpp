// bench_pipeline_bubble: the bubble a pipeline schedule leaves when it runs
// (issue 16), against the simulator fed with the costs measured in the same
// run and against the textbook formula; and each rank's peak activation
// memory against the schedule's slot count. One schedule per run:
//   coremesh run -n P bench_pipeline_bubble CORPUS SCHEDULE M STEPS [V]
// trains the bench model (below) with pp = P, M micro-batches, one core per
// PE, timing every action on its stream (Trainer::executed). Per step after
// the first:
//   measured   1 - sum(busy time of every rank) / (P x step), the step
//              being the first action's start to the last one's end; busy:
//              the compute actions and the sends (their puts run on the
//              compute stream: each is counted with the compute before it)
//   (each step's stream starts once the host has launched the whole step:
//   see COREMESH_BENCH_GATE below)
//   simulated  parallel::simulate() of the schedule the executor ran (for
//              DualPipe its executed form, dualpipe-exact: copy 1's W after
//              the partner's sums) with this step's median F, B (or I + W)
//              and W durations of each rank's chunks, an F&B pair as its
//              rank's F + B (less the W for an I pair), a gradient-sum
//              message as the median SEND_SUM put on each end, P2P the
//              median time from a send's put to the end of its receive
//              where the receiver was waiting (its wake-up and its copy
//              out of the buffer: about 0.1 ms; it was taken as 0 before).
//              The stream's time between two of a rank's actions (span
//              marks, dequeuing: ~0.01 ms, no wait) counts with the action
//              before, busy on both sides, as a send's put does. Busy on
//              the measured side: a SEND_SUM's put, and of a RECV_SUM (its
//              wait, then a copy as large as the put) the put's median.
//   replayed   simulate() with each action's own measured duration: what the
//              schedule's order and messages alone make of this step's
//              costs (measured = replayed: nothing runs that the schedule
//              does not say; replayed != simulated: the costs vary within a rank)
// and prints, on PE 0, the medians over the steps as one line
//   "bubble SCHEDULE P M measured simulated formula replayed"
// (formula: the textbook fraction of the step, or "-" where the table of
// architecture.md gives it as a time), then per rank
//   "memory RANK peak_slots simulated_slots peak_activation_MiB"
// COREMESH_BENCH_VERBOSE=1: each step's two sides and the costs;
// COREMESH_BENCH_TIMELINE=1: each step's actions as run and as replayed.
// Formulas and slots: docs/architecture.md, "How to add a pipeline schedule".
#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <thread>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "bench_util.hpp"
#include "coremesh/parallel/comm.hpp"
#include "coremesh/parallel/schedule_simulator.hpp"
#include "coremesh/runtime/device.hpp"
#include "coremesh/runtime/profiler.hpp"
#include "coremesh/shmem/shmem.hpp"
#include "coremesh/train/trainer.hpp"

using namespace coremesh;
using coremesh::bench::median;

namespace {

train::TrainConfig bench_config(const std::string& corpus, parallel::PipelineSchedule schedule, int pp, int m,
                                int steps, int v) {
  train::TrainConfig c;
  c.model.vocab_size = 256, c.model.d_model = 128, c.model.n_layers = 4, c.model.n_heads = 4;
  c.model.n_kv_heads = 2, c.model.max_seq_len = 128, c.model.first_k_dense = 1, c.model.dense_hidden = 256;
  c.model.n_routed_experts = 8, c.model.top_k = 2, c.model.expert_hidden = 64, c.model.n_shared_experts = 1;
  c.data = {corpus};
  c.batch_size = 4, c.seq_len = 128, c.grad_accum = m, c.steps = steps, c.warmup_steps = 0;
  c.val_every = 0, c.cores = 1, c.progress = false, c.report = false, c.sample_tokens = 0;
  c.parallel.pp = pp, c.parallel.schedule = schedule, c.parallel.virtual_stages = v;
  c.out_dir = "/tmp/coremesh_bench_pipeline_" + std::to_string(shmem::my_pe());
  return c;
}

// The textbook bubble as a fraction of the step, where it is one.
double formula(const parallel::Schedule& s, parallel::PipelineSchedule kind, int v) {
  const double p = s.ranks, m = s.micro_batches;
  using S = parallel::PipelineSchedule;
  if (kind == S::gpipe || kind == S::one_f_one_b) return (p - 1) / (m + p - 1);
  if (kind == S::interleaved) return (p - 1) / (v * m + p - 1);
  return -1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: coremesh run -n P bench_pipeline_bubble CORPUS SCHEDULE M STEPS [V]\n");
    return 2;
  }
  shmem::Session session;
  const int me = shmem::my_pe(), pp = shmem::n_pes();
  coremesh::bench::pin_to_one_core(me);
  parallel::PipelineSchedule kind{};
  bool known = false;
  for (const auto& [k, name] : parallel::pipeline_schedules())
    if (name == argv[2]) kind = k, known = true;
  if (!known) {
    std::fprintf(stderr, "unknown schedule '%s'\n", argv[2]);
    return 2;
  }
  const int m = std::atoi(argv[3]), steps = std::atoi(argv[4]), v = argc > 5 ? std::atoi(argv[5]) : 2;
  runtime::Device device(runtime::DeviceOptions{.cores = 1});
  runtime::profiler_start();  // the pipeline times its actions (spans); kernels are recorded too
  train::Trainer t(bench_config(argv[1], kind, pp, m, steps, v), device);
  const parallel::Schedule& s = t.plan().schedule();
  std::vector<double> measured, simulated, replayed;
  std::vector<int> peak_slots, sim_slots;
  std::vector<double> peak_mib;
  for (int step = 0; step < steps; ++step) {
    const auto host = [] { return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count(); };
    const double queued = host();
    // Every PE's stream starts the step at once, after every host has
    // launched all of it, as the simulator's ranks start at 0: with one core
    // per PE the host's launching (4-10 ms a step) would share the core with
    // the step's first actions (rank 0's first F ran 5.5-7.8 ms against
    // 4.1-4.4 for the others, zb-h1 pp 2), and a rank whose host launches
    // later starts later. A cost of eager launching that no schedule has.
    // COREMESH_BENCH_GATE=0: as the trainer runs it.
    auto open = std::make_shared<std::atomic<bool>>(false);
    const char* gate = std::getenv("COREMESH_BENCH_GATE");
    if (!gate || std::string(gate) != "0")
      t.stream().launch(parallel::launch_info("bench_gate", runtime::KernelKind::comm, 1), [open](const runtime::BlockContext&) {
        while (!open->load()) std::this_thread::sleep_for(std::chrono::microseconds(20));
      });
    t.queue_step();  // the host launches the step's kernels (the stream waits at the gate)
    if (!gate || std::string(gate) != "0") shmem::barrier();
    open->store(true);
    const double launched = host();
    t.finish_step();
    if (std::getenv("COREMESH_BENCH_VERBOSE")) {
      const auto l = t.plan().over_world({launched - queued, queued});
      if (me == 0) std::printf("step %d: host launch %.3f ms summed over the PEs, PE start spread %.3f ms\n", step, l[0].sum, l[1].max - (l[1].sum - l[1].max));
    }
    runtime::profiler_clear();  // keep the profile small
    if (step == 0) continue;    // warm-up: caches, allocations
    // per (rank, chunk, kind): ms
    std::map<std::tuple<int, int, std::string>, std::vector<double>> cost;
    std::vector<double> busy(size_t(pp), 0.0), fb, sum_puts;
    std::vector<std::pair<int, double>> sum_receives;  // (rank, span): DualPipe's gradient sums
    parallel::Costs replay;  // each action's own duration (a send's put with the compute before it)
    replay.per_action.resize(size_t(pp));
    int replay_rank = -1;
    long own_compute = -1;  // the rank's last compute action in `replay`
    double begin = 1e300, end = 0;
    std::vector<double>* last = nullptr;  // the rank's last compute cost (its back): its send's put is part of it
    int last_rank = -1;
    double previous_end = 0;  // of the rank's action before
    for (const train::ExecutedAction& a : t.executed()) {
      begin = std::min(begin, a.start_ms), end = std::max(end, a.end_ms);
      const double d = a.end_ms - a.start_ms;
      const bool send = a.action.find("SEND") != std::string::npos;
      std::vector<double>& own = replay.per_action[size_t(a.rank)];
      // the stream's own time between two actions (the span marks, the next
      // kernel's dequeue; a wait is inside its receive): with the compute before
      if (a.rank == last_rank && a.start_ms > previous_end && own_compute >= 0) {
        const double gap = a.start_ms - previous_end;
        own[size_t(own_compute)] += gap, busy[size_t(a.rank)] += gap;
        if (last) last->back() += gap;
      }
      previous_end = a.end_ms;
      if (a.rank != last_rank) last = nullptr, last_rank = a.rank;
      if (a.rank != replay_rank) replay_rank = a.rank, own_compute = -1;
      own.push_back(a.cat == "p2p" ? 0.0 : d);  // a receive's wait is the simulator's to find
      if (a.cat != "p2p") own_compute = long(own.size()) - 1;
      else if (send && own_compute >= 0) own[size_t(own_compute)] += d;
      if (a.cat == "grad sum") {  // a stage's gradients to or from its other copy: a cost of its own
        if (send)
          sum_puts.push_back(d), busy[size_t(a.rank)] += d;
        else
          sum_receives.emplace_back(a.rank, d);
        continue;
      }
      if (send && last) last->back() += d, busy[size_t(a.rank)] += d;  // the put runs on the compute stream
      if (a.cat == "p2p") continue;
      busy[size_t(a.rank)] += d;
      std::vector<double>& into = a.cat == "F&B" ? fb : cost[{a.rank, std::atoi(a.action.c_str()), a.cat}];
      into.push_back(d);  // "1B3": chunk 1
      last = &into;
    }
    parallel::Costs c;
    c.sum = sum_puts.empty() ? 0.0 : median(sum_puts);
    // P2P: from a send's put to the end of its receive, where the receiver
    // was waiting already (its wake-up and its copy out of the buffer)
    {
      std::vector<std::vector<const train::ExecutedAction*>> ran(static_cast<size_t>(pp));
      for (const train::ExecutedAction& a : t.executed()) ran[size_t(a.rank)].push_back(&a);
      std::map<std::tuple<int, int, int, int>, const train::ExecutedAction*> receives;  // (kind, rank, chunk, mb)
      for (int r = 0; r < pp; ++r)
        for (size_t i = 0; i < ran[size_t(r)].size(); ++i) {
          const parallel::Action& a = s.actions[size_t(r)][i];
          if (a.kind == parallel::ActionKind::RecvF || a.kind == parallel::ActionKind::RecvB || a.kind == parallel::ActionKind::RecvSum)
            receives[{int(a.kind), r, a.chunk, a.micro_batch}] = ran[size_t(r)][i];
        }
      std::vector<double> latency;
      for (int r = 0; r < pp; ++r)
        for (size_t i = 0; i < ran[size_t(r)].size(); ++i) {
          const parallel::Action& a = s.actions[size_t(r)][i];
          using K = parallel::ActionKind;
          if (a.kind != K::SendF && a.kind != K::SendB && a.kind != K::SendSum) continue;
          const parallel::StageRef to = s.peer(r, a);
          const K kind = a.kind == K::SendF ? K::RecvF : a.kind == K::SendB ? K::RecvB : K::RecvSum;
          const auto it = receives.find({int(kind), to.rank, to.chunk, a.micro_batch});
          const double sent = ran[size_t(r)][i]->end_ms;
          if (it != receives.end() && it->second->start_ms < sent && kind != K::RecvSum)
            latency.push_back(it->second->end_ms - sent);
        }
      c.p2p = latency.empty() ? 0.0 : std::max(0.0, median(latency));
      replay.p2p = c.p2p;
    }
    for (const auto& [r, d] : sum_receives) busy[size_t(r)] += std::min(d, c.sum);  // the copy, not the wait
    for (int r = 0; r < pp; ++r)  // a RECV_SUM replays as its copy
      for (size_t i = 0; i < s.actions[size_t(r)].size(); ++i)
        if (s.actions[size_t(r)][i].kind == parallel::ActionKind::RecvSum)
          replay.per_action[size_t(r)][i] = std::min(replay.per_action[size_t(r)][i], c.sum);
    const parallel::Simulation replay_sim = parallel::simulate(s, replay);
    replayed.push_back(replay_sim.total_bubble_fraction);
    double total = 0;
    for (double b : busy) total += b;
    measured.push_back(1 - total / (pp * (end - begin)));
    // each stage's own median costs: the embedding's and the head's stages are not alike
    auto per_rank = [&](double (*stat)(std::vector<double>)) {
      std::vector<std::vector<parallel::ComputeCost>> out(size_t(pp), std::vector<parallel::ComputeCost>(size_t(s.chunks)));
      for (int r = 0; r < pp; ++r)
        for (int k = 0; k < s.chunks; ++k) {
          auto of = [&](const char* kind) {
            const auto it = cost.find({r, k, kind});
            return it == cost.end() ? 0.0 : stat(it->second);
          };
          parallel::ComputeCost& x = out[size_t(r)][size_t(k)];
          x.f = of("F"), x.w = of("W");
          x.b = cost.count({r, k, "B"}) ? of("B") : of("I") + x.w;
          x.w = std::min(x.w, x.b);
        }
      return out;
    };
    c.per_rank = per_rank(median);
    // an F&B pair: its own rank's F and B (c.fb < 0). One median over every
    // rank's pairs made DualPipe's simulated bubble a third of the measured
    // one: the ranks' pairs differ, and a bubble is a small difference of
    // large sums. With one core per PE a pair's halves gain nothing.
    const parallel::Simulation sim = parallel::simulate(s, c);
    simulated.push_back(sim.total_bubble_fraction);
    if (me == 0 && std::getenv("COREMESH_BENCH_VERBOSE")) {  // what the two sides saw
      parallel::Costs mean = c;  // the rank's mean costs: its busy time as measured
      mean.per_rank = per_rank([](std::vector<double> v) {
        double sum = 0;
        for (double x : v) sum += x;
        return sum / double(v.size());
      });
      std::printf(
          "step %d: measured %.4f (step %.3f ms), simulated %.4f (step %.3f ms), with mean costs %.4f, replayed %.4f, "
          "sum copy %.3f ms, P2P %.3f ms\n",
          step, measured.back(), end - begin, sim.total_bubble_fraction, sim.step_time,
          parallel::simulate(s, mean).total_bubble_fraction, replayed.back(), c.sum, c.p2p);
      for (int r = 0; r < pp; ++r)
        for (int k = 0; k < s.chunks; ++k) {
          const parallel::ComputeCost& x = c.per_rank[size_t(r)][size_t(k)];
          std::printf("  rank %d chunk %d: F %.3f B %.3f W %.3f busy %.3f\n", r, k, x.f, x.b, x.w, busy[size_t(r)]);
        }
    }
    if (me == 0 && std::getenv("COREMESH_BENCH_TIMELINE")) {  // action by action
      for (const train::ExecutedAction& a : t.executed())
        std::printf("  step %d ran rank %d %-10s %9.3f %9.3f ms (%.3f)\n", step, a.rank, a.action.c_str(),
                    a.start_ms - begin, a.end_ms - begin, a.end_ms - a.start_ms);
      for (int r = 0; r < pp; ++r)
        for (const parallel::TimedAction& x : replay_sim.timeline[size_t(r)])
          std::printf("  step %d replay rank %d %-10s %9.3f %9.3f ms\n", step, r, parallel::to_string(x.action).c_str(),
                      x.start, x.end);
    }
    sim_slots = sim.peak_slots;
    const parallel::PipelineExecutor::Memory mem = t.plan().memory();  // this PE's
    if (step == steps - 1) {
      peak_slots.assign(size_t(pp), 0), peak_mib.assign(size_t(pp), 0);
      for (int r = 0; r < pp; ++r) {  // one collective per rank: the sums of values only rank r gives
        const auto x = t.plan().over_world({r == me ? double(mem.peak_slots) : 0.0,
                                                 r == me ? double(mem.peak_activation_bytes) : 0.0});
        peak_slots[size_t(r)] = int(x[0].sum), peak_mib[size_t(r)] = x[1].sum / (1 << 20);
      }
    }
  }
  runtime::profiler_stop();
  if (me == 0) {
    const double f = formula(s, kind, v);
    std::printf("bubble %s %d %d %.4f %.4f %s %.4f\n", s.name.c_str(), pp, m, median(measured), median(simulated),
                f < 0 ? "-" : fmt::format("{:.4f}", f).c_str(), median(replayed));
    for (int r = 0; r < pp; ++r)
      std::printf("memory %d %d %d %.2f\n", r, peak_slots[size_t(r)], sim_slots[size_t(r)], peak_mib[size_t(r)]);
  }
  return 0;
}
