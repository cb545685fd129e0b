// Pipeline parallelism reproduces the 1-PE run bit for bit (issue 16): each
// schedule at this job's PE count (pp = n) trains 5 steps with m
// micro-batches and is compared with one PE accumulating the same m
// micro-batches: every step's loss and gradient norm, the expert balance,
// the last step's gradients and every parameter each stage holds (the
// head's replica of the tied table too) and the router biases. The model is tied, has capacity drops, the
// balance loss and router-bias updates, and clipping is active.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>

#include "coremesh/ops/optimizer.hpp"
#include "coremesh/parallel/comm.hpp"
#include "coremesh/parallel/schedule_simulator.hpp"
#include "coremesh/runtime/profiler.hpp"
#include "coremesh/shmem/shmem.hpp"
#include "coremesh/train/trainer.hpp"
#include "train/pe/tiny_training.hpp"

using namespace coremesh;
using namespace coremesh::train;
using namespace coremesh::test_support;
using parallel::PipelineSchedule;

namespace {

struct Case {
  PipelineSchedule schedule;
  int micro_batches, virtual_stages;
  bool tied = true;  // the head's table is the embedding's
  int layers = 2;    // 2 layers + 2 = 6 parts
};

std::vector<Case> cases(int pp) {
  using S = PipelineSchedule;
  switch (pp) {
    case 2: return {{S::gpipe, 4, 1}, {S::one_f_one_b, 4, 1}, {S::interleaved, 4, 2}, {S::zb_h1, 4, 1},
                    {S::zbv, 4, 1}, {S::dualpipev, 4, 1}, {S::dualpipe, 4, 1}, {S::one_f_one_b, 4, 1, false}};
    case 3: return {{S::one_f_one_b, 3, 1}};
    case 4: return {{S::gpipe, 4, 1}, {S::one_f_one_b, 8, 1}, {S::zb_h1, 4, 1}, {S::dualpipe, 8, 1},
                    {S::dualpipev, 8, 1, true, 3}};  // DualPipeV: 8 stages
    default: return {};
  }
}

TrainConfig pipeline_config(const Case& c, int pp) {
  TrainConfig t = base_config();
  t.steps = 5, t.grad_accum = c.micro_batches;
  t.parallel.pp = pp, t.parallel.schedule = c.schedule, t.parallel.virtual_stages = c.virtual_stages;
  t.model.tied_embeddings = c.tied, t.model.n_layers = c.layers;
  t.out_dir = job_dir("pipeline_par");
  return t;
}

TrainConfig one_pe_config(int micro_batches, const std::string& dir, bool tied = true, int layers = 2) {
  TrainConfig t = base_config();
  t.steps = 5, t.grad_accum = micro_batches, t.out_dir = dir;
  t.model.tied_embeddings = tied, t.model.n_layers = layers;
  return t;
}

// After a case: once every PE is done with the files, each removes its own
// directory and the leader the shared one.
void clean_up(const std::string& local, const std::string& shared) {
  shmem::barrier();
  std::filesystem::remove_all(local);
  if (shmem::my_pe() == 0) std::filesystem::remove_all(shared);
  shmem::barrier();
}

// Two steps with the profiler on and a report asked for on the leader (as
// the CLI does): the pipeline keeps its actions' times.
std::unique_ptr<Trainer> profiled_run(const Case& c, int pp) {
  TrainConfig cfg = pipeline_config(c, pp);
  cfg.steps = 2, cfg.report = shmem::my_pe() == 0;
  runtime::profiler_clear();
  runtime::profiler_start();
  auto t = std::make_unique<Trainer>(cfg, one_core());
  t->run(-1, false);
  runtime::profiler_stop();
  return t;
}

}  // namespace

TEST(PipelineTraining, EverySchedulesReproducesTheOnePeRun) {
  const int pp = shmem::n_pes(), me = shmem::my_pe();
  for (const Case& c : cases(pp)) {
    SCOPED_TRACE(::testing::Message() << parallel::schedule_name(c.schedule) << " pp " << pp << " m "
                                      << c.micro_batches << (c.tied ? "" : " untied"));
    Trainer ref(one_pe_config(c.micro_batches, job_dir("pipeline_one") + "_" + std::to_string(me), c.tied, c.layers),
                one_core());
    ref.run(-1, false);
    Trainer t(pipeline_config(c, pp), one_core());
    t.run(-1, false);

    ASSERT_EQ(t.records().size(), ref.records().size());
    for (size_t s = 0; s < ref.records().size(); ++s) {
      const StepRecord &a = t.records()[s], &b = ref.records()[s];
      EXPECT_EQ(a.loss, b.loss) << "step " << s;
      EXPECT_EQ(a.grad_norm, b.grad_norm) << "step " << s;
      EXPECT_EQ(a.expert_balance, b.expert_balance) << "step " << s;
      EXPECT_NEAR(a.aux_loss, b.aux_loss, 1e-12) << "step " << s;
    }
    int different = 0;
    for (const auto& p : t.model().params()) {
      const bool same = std::memcmp(t.model().param_data() + p.offset, ref.model().param(p.name).raw_data(),
                                    size_t(p.numel) * sizeof(float)) == 0;
      different += !same;
      EXPECT_TRUE(same) << p.name << (p.tied_replica ? " (the head's replica)" : "");
      if (p.tied_replica) continue;  // its gradient went to the embedding's stage
      EXPECT_EQ(0, std::memcmp(t.model().grad_data() + p.offset, ref.model().grad(p.name).raw_data(),
                               size_t(p.numel) * sizeof(float)))
          << "the last step's gradient of " << p.name;
    }
    const auto want = ref.model().named_buffers();
    for (const auto& [name, b] : t.model().named_buffers()) {
      const auto it = std::find_if(want.begin(), want.end(), [&](const auto& w) { return w.first == name; });
      ASSERT_NE(it, want.end()) << name;
      EXPECT_EQ(0, std::memcmp(b.raw_data(), it->second.raw_data(), b.nbytes())) << name;
    }
    if (me == 0)
      std::printf("[%s pp %d m %d%s] %zu steps, %d of this stage's tensors differ; loss %.4f -> %.4f, grad norm "
                  "%.3f -> %.3f\n",
                  parallel::schedule_name(c.schedule).c_str(), pp, c.micro_batches, c.tied ? "" : " untied",
                  t.records().size(), different,
                  t.records().front().loss, t.records().back().loss, t.records().front().grad_norm,
                  t.records().back().grad_norm);
    shmem::barrier();
  }
}

// A pipeline's checkpoint is the 1-PE checkpoint (names, values, AdamW
// moments, router biases); one PE resumes it and a pipeline resumes the
// 1-PE one, both continuing the 1-PE run bit for bit.
TEST(PipelineTraining, CheckpointsAreTheOnePeCheckpoints) {
  const int pp = shmem::n_pes(), me = shmem::my_pe();
  if (pp < 2) return;
  const Case c{PipelineSchedule::one_f_one_b, 4, 1};
  const std::string shared = job_dir("pipeline_ckpt"), local = shared + "_" + std::to_string(me);
  Trainer ref(one_pe_config(c.micro_batches, local + "_ref"), one_core());
  const std::string ref2 = ref.run(2, true).checkpoint;
  ref.run(-1, false);
  std::string ckpt;
  {
    TrainConfig cfg = pipeline_config(c, pp);
    cfg.out_dir = shared + "_from";
    Trainer a(cfg, one_core());
    ckpt = a.run(2, true).checkpoint;
  }
  const CheckpointState mine = load_checkpoint(ckpt), want = load_checkpoint(ref2);
  EXPECT_EQ(worst_difference(mine, want), 0.0);
  ASSERT_EQ(mine.buffers.size(), want.buffers.size());
  for (size_t i = 0; i < want.buffers.size(); ++i) {
    EXPECT_EQ(mine.buffers[i].first, want.buffers[i].first);
    EXPECT_EQ(0, std::memcmp(mine.buffers[i].second.raw_data(), want.buffers[i].second.raw_data(),
                             want.buffers[i].second.nbytes()));
  }
  // one PE resumes the pipeline's checkpoint; the pipeline resumes one PE's
  Trainer one(one_pe_config(c.micro_batches, local + "_to"), one_core());
  one.resume(ckpt);
  one.run(-1, false);
  TrainConfig cfg = pipeline_config(c, pp);
  cfg.out_dir = shared + "_to";
  Trainer piped(cfg, one_core());
  piped.resume(ref2);
  piped.run(-1, false);
  const size_t rest = ref.records().size() - 2;
  ASSERT_EQ(one.records().size(), rest);
  ASSERT_EQ(piped.records().size(), rest);
  for (size_t s = 0; s < rest; ++s) {
    EXPECT_EQ(one.records()[s].loss, ref.records()[2 + s].loss) << "one PE, step " << 2 + s;
    EXPECT_EQ(piped.records()[s].loss, ref.records()[2 + s].loss) << "pipeline, step " << 2 + s;
  }
  shmem::barrier();
  std::filesystem::remove_all(local + "_ref"), std::filesystem::remove_all(local + "_to");
  if (me == 0) std::filesystem::remove_all(shared + "_from"), std::filesystem::remove_all(shared + "_to");
}

// The gradient norm is the 1-PE norm bit for bit, also where a chunk of its
// partial sums straddles stages (assembled on one PE, not the two partials
// added): random gradients of widely spread magnitudes in every stage's
// arena against ops::grad_sq_sum over the whole model's arena.
TEST(PipelineTraining, NormIsTheOnePeNorm) {
  const int pp = shmem::n_pes();
  if (pp < 2) return;
  using S = PipelineSchedule;
  for (const Case& c : {Case{S::one_f_one_b, pp, 1}, Case{S::zbv, 2 * pp, 1}}) {
    if (pp * (c.schedule == S::zbv ? 2 : 1) > model::num_parts(base_config().model)) continue;  // a part per stage
    SCOPED_TRACE(parallel::schedule_name(c.schedule));
    Trainer t(pipeline_config(c, pp), one_core());
    const model::ParamLayout whole = model::layout_params(t.model().config());
    std::vector<ops::ParamSegment> all;
    for (const auto& p : whole.params) all.push_back({p.offset, p.numel, p.weight_decay});
    Tensor ref = Tensor::zeros({whole.arena_size});
    uint64_t x = 12345;
    int differ = 0;
    for (int trial = 0; trial < 40; ++trial) {
      float* g = ref.data<float>();
      for (int64_t i = 0; i < whole.arena_size; ++i) {
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        const double u = double(x >> 11) / double(1ULL << 53);
        g[i] = float((u - 0.5) * std::exp(12.0 * u - 6.0));
      }
      for (const auto& p : t.model().params()) {  // each stage's share (the replica holds no gradient)
        if (p.tied_replica) continue;
        const auto& w = whole.params[size_t(whole.index_of(p.name))];
        std::memcpy(t.model().grad_data() + p.offset, g + w.offset, size_t(p.numel) * sizeof(float));
      }
      Tensor mine, want;
      {
        runtime::StreamGuard on(t.stream());
        mine = t.plan().grad_sq_sum();
        want = ops::grad_sq_sum(ref, all);
        t.stream().synchronize();
      }
      differ += mine.data<float>()[0] != want.data<float>()[0];
    }
    EXPECT_EQ(differ, 0) << "of 40 random gradients";
    shmem::barrier();
  }
}

// A schedule written by hand runs too: 1F1B on pp 2 with the backwards split
// into I and W, each W as late as it can be (after the last I), from its text
// form. Still one PE's run bit for bit.
TEST(PipelineTraining, RunsAScheduleFromItsTextForm) {
  const int pp = shmem::n_pes(), me = shmem::my_pe();
  if (pp != 2) return;
  const std::string text =
      "schedule late-w placement=interleaved pp=2 chunks=1 microbatches=4\n"
      "0F0 0F1 0I0 0F2 0I1 0F3 0I2 0I3 0W0 0W1 0W2 0W3\n"
      "0F0 0I0 0F1 0I1 0F2 0I2 0F3 0I3 0W0 0W1 0W2 0W3\n";
  const std::string dir = job_dir("pipeline_text"), file = dir + "_" + std::to_string(me) + ".txt";
  std::ofstream(file) << text;
  Trainer ref(one_pe_config(4, dir + "_one_" + std::to_string(me)), one_core());
  ref.run(-1, false);
  TrainConfig cfg = pipeline_config({PipelineSchedule::one_f_one_b, 4, 1}, pp);
  cfg.parallel.schedule_file = file;
  Trainer t(cfg, one_core());
  EXPECT_EQ(t.plan().schedule().name, "late-w");
  t.run(-1, false);
  ASSERT_EQ(t.records().size(), ref.records().size());
  for (size_t s = 0; s < ref.records().size(); ++s) {
    EXPECT_EQ(t.records()[s].loss, ref.records()[s].loss) << "step " << s;
    EXPECT_EQ(t.records()[s].grad_norm, ref.records()[s].grad_norm) << "step " << s;
  }
  for (const auto& p : t.model().params())
    EXPECT_EQ(0, std::memcmp(t.model().param_data() + p.offset, ref.model().param(p.name).raw_data(),
                             size_t(p.numel) * sizeof(float)))
        << p.name;
  // a schedule for another size is refused with the sizes named
  cfg.grad_accum = 8;
  try {
    Trainer bad(cfg, one_core());
    ADD_FAILURE() << "a schedule of 4 micro-batches ran with 8";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("4 micro-batches"), std::string::npos) << e.what();
  }
  shmem::barrier();
  std::filesystem::remove(file);
}

// Layouts the executor cannot run are refused before anything is allocated,
// with a message that says what to change.
TEST(PipelineTraining, RefusesWhatItCannotRun) {
  const int pp = shmem::n_pes();
  if (pp < 2) return;
  auto message = [&](TrainConfig c) -> std::string {
    try {
      Trainer t(c, one_core());
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  TrainConfig deep = pipeline_config({PipelineSchedule::interleaved, 4 * pp, 4}, pp);  // 4 pp stages, 6 parts
  EXPECT_NE(message(deep).find("parts"), std::string::npos) << message(deep);
  if (pp == 4) {  // pp 2 x cp 2, pp 2 x tp 2 with SP
    TrainConfig cp = pipeline_config({PipelineSchedule::one_f_one_b, 4, 1}, 2);
    cp.parallel.cp = 2, cp.model.capacity_factor = 0.0f, cp.model.aux_loss_alpha = 0.0f;
    EXPECT_NE(message(cp).find("set cp or pp to 1"), std::string::npos) << message(cp);
    TrainConfig sp = pipeline_config({PipelineSchedule::one_f_one_b, 4, 1}, 2);
    sp.parallel.tp = 2, sp.parallel.sequence_parallel = true;
    EXPECT_NE(message(sp).find("set sequence_parallel false or pp to 1"), std::string::npos) << message(sp);
  }
  shmem::barrier();
}

// Pipelines replicated over data and expert ranks, with ZeRO-1 (pp 2 on 4
// PEs): replica d (dp·ep + ep) runs micro-batches [d m, (d+1) m); each
// stage's dense gradients are summed over dp x ep, its experts' over dp, in
// replica order, each part's sum starting as soon as its last backward is in
// (DualPipe's once its two copies' sums are exchanged). With one micro-batch per replica and no ep that is one PE's
// sum, bit for bit (ZeRO-1 too: AdamW is element-wise); otherwise (g0 + g1) +
// (g2 + g3) against ((g0 + g1) + g2) + g3, and under ep a norm summed from
// another layout's chunks: within the tolerances of the other parallel tests
// (losses 1e-6 relative, weights 1e-5). The checkpoint gathered from the
// stages (each ep rank's experts, ZeRO-1's shards of AdamW's moments) is the
// 1-PE checkpoint.
TEST(PipelineTraining, ComposesWithDataAndExpertParallelismAndZero) {
  const int n = shmem::n_pes(), me = shmem::my_pe();
  if (n != 4) return;
  struct Layout {
    PipelineSchedule schedule;
    int micro_batches, dp, ep, zero;
  };
  using S = PipelineSchedule;
  for (const Layout& L : {Layout{S::one_f_one_b, 1, 2, 1, 0}, Layout{S::zb_h1, 1, 2, 1, 1},
                          Layout{S::one_f_one_b, 2, 2, 1, 1}, Layout{S::one_f_one_b, 2, 1, 2, 0},
                          Layout{S::zb_h1, 2, 1, 2, 1}, Layout{S::dualpipe, 4, 1, 2, 0}, Layout{S::dualpipe, 4, 2, 1, 1}}) {
    const std::string name = fmt::format("{} pp 2 x dp {} x ep {}, zero {}, m {} per replica",
                                         parallel::schedule_name(L.schedule), L.dp, L.ep, L.zero, L.micro_batches);
    SCOPED_TRACE(name);
    const bool exact = L.micro_batches == 1 && L.ep == 1;
    const std::string dir = job_dir("pipeline_dp"), local = dir + "_one_" + std::to_string(me);
    Trainer ref(one_pe_config(2 * L.micro_batches, local), one_core());
    const std::string want = ref.run(-1, true).checkpoint;
    TrainConfig cfg = pipeline_config({L.schedule, L.micro_batches, 1}, 2);
    cfg.parallel.dp = L.dp, cfg.parallel.ep = L.ep, cfg.parallel.zero = L.zero;
    cfg.out_dir = dir;
    Trainer t(cfg, one_core());
    const std::string ckpt = t.run(-1, true).checkpoint;
    int held = 0;  // every part this stage holds was summed as soon as its last backward was in
    for (const model::PartRange& r : t.model().layout().regions) held += r.begin < r.end;
    const bool copies = L.schedule == S::dualpipe;  // DualPipe sums its two copies first, then the replicas
    EXPECT_EQ(t.plan().parts_summed_early(), copies ? 0 : held);
    ASSERT_EQ(t.records().size(), ref.records().size());
    for (size_t s = 0; s < ref.records().size(); ++s) {
      const StepRecord &a = t.records()[s], &b = ref.records()[s];
      if (exact) {
        EXPECT_EQ(a.loss, b.loss) << "step " << s;
        EXPECT_EQ(a.grad_norm, b.grad_norm) << "step " << s;
      }
      EXPECT_NEAR(a.loss, b.loss, 1e-6 * b.loss) << "step " << s;
      EXPECT_NEAR(a.grad_norm, b.grad_norm, 1e-5 * b.grad_norm) << "step " << s;
      EXPECT_EQ(a.expert_balance, b.expert_balance) << "step " << s << ": the global expert load";
    }
    double worst = 0;
    int different = 0;
    for (const auto& p : t.model().params()) {  // this PE's: its stage, its experts' rows
      Tensor mine = t.model().param(p.name), want_p = ref.model().param(p.name);
      if (p.expert()) want_p = want_p.slice(0, p.expert_begin, p.expert_begin + p.shape[0]).contiguous();
      different += std::memcmp(mine.raw_data(), want_p.raw_data(), mine.nbytes()) != 0;
      worst = std::max(worst, relative_l2(mine, want_p));
    }
    if (exact) {
      EXPECT_EQ(different, 0) << "tensors differ from the 1-PE run";
    }
    EXPECT_LE(worst, 1e-5);
    const auto buffers = ref.model().named_buffers();
    for (const auto& [bname, b] : t.model().named_buffers()) {
      const auto it = std::find_if(buffers.begin(), buffers.end(), [&](const auto& w) { return w.first == bname; });
      ASSERT_NE(it, buffers.end()) << bname;
      if (exact) {
        EXPECT_EQ(0, std::memcmp(b.raw_data(), it->second.raw_data(), b.nbytes())) << bname;
      }
    }
    const double ckpt_err = worst_difference(load_checkpoint(ckpt), load_checkpoint(want));
    if (exact) {
      EXPECT_EQ(ckpt_err, 0.0);
    }
    EXPECT_LE(ckpt_err, 1e-5) << "the gathered checkpoint";
    if (me == 0)
      std::printf("[%s] %s; worst weight rel err %.1e, checkpoint %.1e\n", name.c_str(),
                  exact ? "bit-identical checks" : "tolerance checks", worst, ckpt_err);
    clean_up(local, dir);
  }
}

// The executed schedule: with a report asked for (on the leader only, as the
// CLI does), every PE keeps its actions' times on the stream and the step's
// are gathered: each rank's actions, in its schedule's order, one after the
// other. With the profiler on, each action is also a span on its stage's
// track of the trace (F, B, I, W and the P2P with its wait).
TEST(PipelineTraining, RecordsTheExecutedSchedule) {
  const int pp = shmem::n_pes(), me = shmem::my_pe();
  if (pp != 2) return;
  for (const Case& c : {Case{PipelineSchedule::one_f_one_b, 4, 1}, Case{PipelineSchedule::zb_h1, 4, 1}}) {
    SCOPED_TRACE(parallel::schedule_name(c.schedule));
    const std::unique_ptr<Trainer> run = profiled_run(c, pp);
    Trainer& t = *run;
    const parallel::Schedule& s = t.plan().schedule();
    const std::vector<ExecutedAction>& done = t.executed();
    size_t total = 0;
    for (const auto& list : s.actions) total += list.size();
    ASSERT_EQ(done.size(), total);
    std::vector<size_t> next(size_t(pp), 0);
    std::vector<double> free_at(size_t(pp), 0.0);
    for (int r = 0; r < pp; ++r)
      for (const ExecutedAction& a : done) {
        if (a.rank != r) continue;
        const size_t i = next[size_t(r)]++;
        EXPECT_EQ(a.action, parallel::to_string(s.actions[size_t(r)][i])) << "rank " << r << " action " << i;
        EXPECT_LE(a.start_ms, a.end_ms) << a.action;
        EXPECT_GE(a.start_ms, free_at[size_t(r)] - 1e-6) << "rank " << r << " " << a.action << " overlaps the one before";
        free_at[size_t(r)] = a.end_ms;
      }
    // the trace: this PE's actions of both steps as spans on its stage's track
    const std::string track = fmt::format("pipeline stage {}", t.plan().executor_rank());
    std::map<std::string, int> kinds;
    int spans = 0;
    for (const runtime::SpanRecord& sp : runtime::profiler_spans()) {
      if (sp.track != track) continue;
      ++spans, ++kinds[sp.cat];
      EXPECT_LE(sp.start_ns, sp.end_ns);
    }
    EXPECT_EQ(spans, 2 * int(s.actions[size_t(t.plan().executor_rank())].size()));
    EXPECT_EQ(kinds["F"], 2 * c.micro_batches);
    EXPECT_EQ(kinds[c.schedule == PipelineSchedule::zb_h1 ? "W" : "B"], 2 * c.micro_batches);
    EXPECT_EQ(kinds["p2p"], 2 * 2 * c.micro_batches) << "a send or receive of each micro-batch each way";
    runtime::profiler_clear();
    if (me == 0) {
      const std::string html = render_report_html(t.report_data());
      EXPECT_NE(html.find("Executed schedule"), std::string::npos);
    }
    shmem::barrier();
    if (me == 0) std::filesystem::remove_all(pipeline_config(c, pp).out_dir);
  }
}

// Pipeline stages split over tensor-parallel groups (pp 2 x tp 2 on 4 PEs,
// mesh order [PP][TP]): TP rank t of a stage exchanges activations and
// gradients with TP rank t of the stages around, every TP rank of a stage
// holding the same residual stream; under DualPipe with both copies, and
// with one key/value head that both TP ranks share (its gradient summed
// over them). The all-reduces sum the row-parallel
// products in another order than one PE's GEMM, so within the tolerances
// of tensor parallelism: per-step losses within 1e-5 relative, every
// weight slice (the head's replica of the tied table too) within 1e-4, and
// the checkpoint gathered from every stage's TP slices (the 1-PE names) as
// well.
TEST(PipelineTraining, ComposesWithTensorParallelism) {
  const int n = shmem::n_pes(), me = shmem::my_pe();
  if (n != 4) return;
  using S = PipelineSchedule;
  struct Layout {
    Case c;
    int kv_heads;
  };
  for (const Layout& L : {Layout{{S::one_f_one_b, 4, 1}, 2}, Layout{{S::zbv, 4, 1}, 2},
                          Layout{{S::dualpipe, 4, 1}, 2}, Layout{{S::one_f_one_b, 4, 1}, 1}}) {
    const Case& c = L.c;
    const std::string name = fmt::format("{} pp 2 x tp 2, m {}, {} kv heads", parallel::schedule_name(c.schedule),
                                         c.micro_batches, L.kv_heads);
    SCOPED_TRACE(name);
    const std::string dir = job_dir("pipeline_tp"), local = dir + "_one_" + std::to_string(me);
    TrainConfig one = one_pe_config(c.micro_batches, local);
    one.model.n_kv_heads = L.kv_heads;
    Trainer ref(one, one_core());
    const std::string want = ref.run(-1, true).checkpoint;
    TrainConfig cfg = pipeline_config(c, 2);
    cfg.parallel.tp = 2, cfg.model.n_kv_heads = L.kv_heads, cfg.out_dir = dir;
    Trainer t(cfg, one_core());
    const std::string ckpt = t.run(-1, true).checkpoint;
    const double worst_loss = worst_loss_difference(t, ref, 1e-5);
    double worst = 0;
    for (const model::ParamInfo& p : t.model().params()) {  // this PE's slices
      if (p.tp_axis == model::TpAxis::vocab) {  // the table (and the head's replica) split by vocabulary rows
        EXPECT_EQ(p.shape[0], cfg.model.vocab_size / 2) << p.name;
      }
      const Tensor mine = t.model().param_arena().slice(0, p.offset, p.offset + p.numel).view(p.shape);
      const double e = relative_l2(mine, model::held_part(p, ref.model().param(p.name)));
      EXPECT_LE(e, 1e-4) << p.name << (p.tied_replica ? " (the head's replica)" : "");
      worst = std::max(worst, e);
    }
    const double ckpt_err = worst_difference(load_checkpoint(ckpt), load_checkpoint(want));
    EXPECT_LE(ckpt_err, 1e-4) << "the gathered checkpoint";
    if (me == 0)
      std::printf("[%s] %zu steps: worst loss rel diff %.1e, weight rel err %.1e, checkpoint %.1e\n", name.c_str(),
                  t.records().size(), worst_loss, worst, ckpt_err);
    clean_up(local, dir);
  }
}

// pp 2 x tp 2 with ep 2 or with dp 2 and ZeRO-1 (8 PEs): every replica of a
// TP-split stage runs its micro-batches; within the same tolerances.
TEST(PipelineTraining, ComposesWithTensorExpertAndDataParallelism) {
  const int n = shmem::n_pes(), me = shmem::my_pe();
  if (n != 8) return;
  struct Layout {
    int dp, ep, zero;
  };
  for (const Layout& L : {Layout{1, 2, 0}, Layout{2, 1, 1}}) {
    const std::string name = fmt::format("1f1b pp 2 x dp {} x ep {} x tp 2, zero {}", L.dp, L.ep, L.zero);
    SCOPED_TRACE(name);
    const std::string dir = job_dir("pipeline_tp8"), local = dir + "_one_" + std::to_string(me);
    Trainer ref(one_pe_config(4, local), one_core());
    const std::string want = ref.run(-1, true).checkpoint;
    TrainConfig cfg = pipeline_config({PipelineSchedule::one_f_one_b, 2, 1}, 2);
    cfg.parallel.tp = 2, cfg.parallel.dp = L.dp, cfg.parallel.ep = L.ep, cfg.parallel.zero = L.zero;
    cfg.out_dir = dir;
    Trainer t(cfg, one_core());
    const std::string ckpt = t.run(-1, true).checkpoint;
    const double worst_loss = worst_loss_difference(t, ref, 1e-5);
    const double ckpt_err = worst_difference(load_checkpoint(ckpt), load_checkpoint(want));
    EXPECT_LE(ckpt_err, 1e-4) << "the gathered checkpoint";
    if (me == 0)
      std::printf("[%s] %zu steps: worst loss rel diff %.1e, checkpoint %.1e\n", name.c_str(), t.records().size(),
                  worst_loss, ckpt_err);
    clean_up(local, dir);
  }
}

// DualPipe's overlapped pairs: the forward and the backward of each F&B run
// on two streams, each with half the stage's cores (here one core: the two
// streams share it kernel by kernel). In the trace each half is a span on
// its own stage's track, and the two halves of a pair overlap in time. The
// results stay one PE's bit for bit (EverySchedulesReproducesTheOnePeRun).
// DualPipe runs its executed form (copy 1's backwards as I, their W after
// the partner's copy-0 sums) action for action, and every rank holds the
// simulator's peak chunk slots.
TEST(PipelineTraining, DualPipeRunsThePairsHalvesConcurrently) {
  const int pp = shmem::n_pes(), me = shmem::my_pe();
  if (pp != 2 && pp != 4) return;
  for (PipelineSchedule schedule : {PipelineSchedule::dualpipe, PipelineSchedule::dualpipev}) {
    const Case c{schedule, 2 * pp, 1, true, pp == 4 && schedule == PipelineSchedule::dualpipev ? 3 : 2};
    SCOPED_TRACE(parallel::schedule_name(schedule));
    const std::unique_ptr<Trainer> run = profiled_run(c, pp);
    Trainer& t = *run;
    const parallel::Schedule& s = t.plan().schedule();
    const int rank = t.plan().executor_rank();
    auto spans_of = [&](int chunk, const std::string& name) {
      std::vector<runtime::SpanRecord> out;
      const std::string track = fmt::format("pipeline stage {}", s.stage_of(rank, chunk));
      for (const runtime::SpanRecord& sp : runtime::profiler_spans())
        if (sp.track == track && sp.name == name) out.push_back(sp);
      return out;
    };
    int pairs = 0, overlapping = 0;
    for (const parallel::Action& a : s.actions[size_t(rank)]) {
      if (a.kind != parallel::ActionKind::FB) continue;
      const auto f = spans_of(a.chunk, parallel::to_string({parallel::ActionKind::F, a.chunk, a.micro_batch}));
      auto b = spans_of(a.b_chunk, parallel::to_string({parallel::ActionKind::B, a.b_chunk, a.b_micro_batch}));
      if (b.empty()) b = spans_of(a.b_chunk, parallel::to_string({parallel::ActionKind::I, a.b_chunk, a.b_micro_batch}));
      ASSERT_EQ(f.size(), 2u) << parallel::to_string(a) << ": a span of its forward per step";
      ASSERT_EQ(b.size(), 2u) << parallel::to_string(a) << ": a span of its backward per step";
      for (size_t step = 0; step < 2; ++step) {
        ++pairs;
        overlapping += f[step].start_ns < b[step].end_ns && b[step].start_ns < f[step].end_ns;
      }
    }
    runtime::profiler_clear();
    if (schedule == PipelineSchedule::dualpipe) {  // its executed form: copy 1's W after the partner's sums
      EXPECT_EQ(s.name, "dualpipe-exact");
      for (int r = 0; r < pp; ++r) {
        std::vector<std::string> ran;
        for (const ExecutedAction& e : t.executed())
          if (e.rank == r) ran.push_back(e.action);
        std::vector<std::string> listed;
        for (const parallel::Action& a : s.actions[size_t(r)]) listed.push_back(parallel::to_string(a));
        EXPECT_EQ(ran, listed) << "rank " << r << ": the executor runs the schedule's actions, nothing else";
      }
    }
    // the chunk slots held are the simulator's (they depend on the order only)
    EXPECT_EQ(t.plan().memory().peak_slots, parallel::simulate(s, {}).peak_slots[size_t(rank)]);
    const auto total = t.plan().over_world({double(pairs), double(overlapping)});
    EXPECT_GT(total[0].sum, 0) << "the schedule has F&B pairs";
    EXPECT_GT(total[1].sum, 0) << "no pair's halves overlapped";
    if (me == 0)
      std::printf("[%s pp %d] %.0f of %.0f F&B pairs ran their halves concurrently\n",
                  parallel::schedule_name(schedule).c_str(), pp, total[1].sum, total[0].sum);
    shmem::barrier();
    if (me == 0) std::filesystem::remove_all(pipeline_config(c, pp).out_dir);
  }
}
