// The step simulator against independent references: the trainer's FLOP
// count, the ring formulas by hand, the roofline by hand, the pipeline's
// fill-and-drain bounds, the layout rules; the cluster file's round trip and its
// refusals.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "coremesh/core/error.hpp"
#include "coremesh/model/layout.hpp"
#include "coremesh/parallel/plan.hpp"
#include "coremesh/sim/planner.hpp"
#include "coremesh/sim/simulator.hpp"
#include "coremesh/sim/workload.hpp"

using namespace coremesh;

namespace {

train::TrainConfig demo() {
  train::TrainConfig c;
  c.model.vocab_size = 256, c.model.d_model = 128, c.model.n_layers = 4, c.model.n_heads = 4, c.model.n_kv_heads = 2;
  c.model.max_seq_len = 64, c.model.dense_hidden = 256, c.model.n_routed_experts = 8, c.model.top_k = 2;
  c.model.expert_hidden = 128;
  c.batch_size = 4, c.seq_len = 64, c.grad_accum = 1;
  return c;
}

// A device priced by the roofline alone: 1 TFLOP/s, 100 GB/s, no launch
// cost, links of 1 us and 10 GB/s.
sim::Cluster roofline(int devices = 64) {
  sim::Cluster c;
  c.name = "test";
  c.devices = devices;
  c.host_devices = 8;
  c.device.peak_flops = {{"f32", 1e12}};
  c.device.memory_bandwidth = 1e11;
  c.device.memory_bytes = 1e12;
  c.intra_host = {"intra", 1e-6, 1e10, {}};
  c.inter_host = {"inter", 1e-5, 1e9, {}};
  return c;
}

double total_flops(const train::TrainConfig& c) {
  double f = 0;
  for (int part = 0; part < model::num_parts(c.model); ++part) f += sim::part_work({c, 1.0}, part).flops();
  return f;
}

}  // namespace

TEST(Workload, FlopsMatchTheTrainersCount) {
  // flops_per_token: 6 x active matmul parameters + 6 T C per layer (causal attention)
  for (int dense : {0, 8}) {
    train::TrainConfig c = demo();
    c.model.n_routed_experts = dense;
    const double tokens = double(c.batch_size) * c.seq_len;
    const double expected = model::flops_per_token(c.model, c.seq_len) * tokens;
    // the workload counts the causal pairs exactly, T(T+1)/2 and not T^2/2, and
    // no FLOPs for the norms' weights, which flops_per_token counts as matmul parameters
    const double attention_extra = 6.0 * c.model.n_layers * c.model.d_model * tokens;
    const double norms = 6.0 * (2 * c.model.n_layers + 1) * c.model.d_model * tokens;
    EXPECT_NEAR(total_flops(c), expected + attention_extra - norms, 1e-9 * expected) << "experts " << dense;
  }
}

TEST(Workload, ParallelSplitsDivideTheWork) {
  const train::TrainConfig one = demo();
  train::TrainConfig tp = one, ep = one, cp = one;
  tp.parallel.tp = 2;
  ep.parallel.ep = 2;
  cp.parallel.cp = 2;
  cp.model.aux_loss_alpha = 0;
  // EP: each rank routes its own tokens to every expert: the same rows as one PE
  EXPECT_DOUBLE_EQ(total_flops(ep), total_flops(one));
  // CP: half the tokens, and a rank's queries see 1/cp of the causal pairs of the whole sequence
  EXPECT_NEAR(total_flops(cp), total_flops(one) / 2, 0.02 * total_flops(one));
  // TP: the router and norms are replicated, the rest halved
  EXPECT_LT(total_flops(tp), 0.55 * total_flops(one));
  EXPECT_GT(total_flops(tp), 0.5 * total_flops(one));
}

TEST(Workload, ExchangesFollowTheSeams) {
  train::TrainConfig c = demo();
  c.parallel.tp = 2;
  const sim::PartWork attention = sim::part_work({c, 1.0}, 1);
  ASSERT_EQ(attention.forward_exchanges.size(), 1u);
  EXPECT_EQ(attention.forward_exchanges[0].collective, sim::Collective::all_reduce);
  EXPECT_DOUBLE_EQ(attention.forward_exchanges[0].bytes, 4.0 * c.batch_size * c.seq_len * c.model.d_model);
  c.parallel.sequence_parallel = true;
  const sim::PartWork sp = sim::part_work({c, 1.0}, 1);
  ASSERT_EQ(sp.forward_exchanges.size(), 2u);
  EXPECT_EQ(sp.forward_exchanges[0].collective, sim::Collective::all_gather);
  EXPECT_EQ(sp.forward_exchanges[1].collective, sim::Collective::reduce_scatter);
  // EP: dispatch and combine carry every routed row, scaled by the skew
  train::TrainConfig e = demo();
  e.parallel.ep = 2;
  const int moe_part = 2 * e.model.first_k_dense + 2;  // the FFN half of the first MoE layer
  const sim::PartWork moe = sim::part_work({e, 1.5}, moe_part);
  ASSERT_EQ(moe.forward_exchanges.size(), 2u);
  EXPECT_DOUBLE_EQ(moe.forward_exchanges[0].bytes, 1.5 * 4.0 * e.batch_size * e.seq_len * e.model.top_k * e.model.d_model);
}

TEST(Cluster, CollectivesByHand) {
  const sim::Cluster c = roofline();
  // ring all-reduce of 1 MB over 4 PEs: 6 latencies, 2 x 3/4 MB on the link
  EXPECT_NEAR(c.exchange_seconds(sim::Collective::all_reduce, 4, 1e6, false), 6e-6 + 1.5e6 / 1e10, 1e-15);
  EXPECT_NEAR(c.exchange_seconds(sim::Collective::all_to_all, 4, 1e6, true), 3e-5 + 0.75e6 / 1e9, 1e-15);
  EXPECT_NEAR(c.exchange_seconds(sim::Collective::put, 2, 1e6, false), 1e-6 + 1e6 / 1e10, 1e-15);
  EXPECT_EQ(c.exchange_seconds(sim::Collective::all_reduce, 1, 1e6, false), 0.0);
}

TEST(Cluster, OpPricesMeasuredNearestAndRoofline) {
  sim::Cluster c = roofline();
  sim::Op gemm;
  gemm.kind = sim::OpKind::gemm, gemm.m = 1000, gemm.n = 1000, gemm.k = 1000, gemm.flops = 2e9, gemm.bytes = 1.2e7;
  EXPECT_NEAR(c.op_seconds(gemm), 2e-3, 1e-12);  // compute-bound: 2 GFLOP at 1 TFLOP/s
  c.device.efficiency[sim::OpKind::gemm] = 0.5;
  EXPECT_NEAR(c.op_seconds(gemm), 4e-3, 1e-12);
  c.measured[gemm.key()] = {2e9, 1e-3};
  EXPECT_EQ(c.op_seconds(gemm), 1e-3);  // the measured shape
  sim::Op low = gemm;
  low.dtype = "fp8";
  EXPECT_EQ(c.op_seconds(low), 1e-3);  // its f32 twin's
  sim::Op bigger = gemm;
  bigger.m = 2000, bigger.flops = 4e9;
  EXPECT_NEAR(c.op_seconds(bigger), 2e-3, 1e-12);  // the nearest measured, scaled by FLOPs
  bigger.m = 10000, bigger.flops = 2e10;           // over 4x away: the roofline
  EXPECT_NEAR(c.op_seconds(bigger), 2e10 / 0.5e12, 1e-12);
  sim::Op copy;
  copy.bytes = 1e8;
  EXPECT_NEAR(c.op_seconds(copy), 1e-3, 1e-12);
  c.elementwise_curve = {{1e6, 1e-5}, {1e8, 2e-3}};
  EXPECT_NEAR(c.op_seconds(copy), 2e-3, 1e-12);
  copy.bytes = 1e7;  // halfway in log: the geometric mean
  EXPECT_NEAR(c.op_seconds(copy), std::sqrt(1e-5 * 2e-3), 1e-12);
}

TEST(Cluster, FileRoundTripsAndRefusesBadFields) {
  sim::Cluster c = roofline();
  c.measured["gemm f32 2x3x4"] = {48, 1e-6};
  c.elementwise_curve = {{10, 1e-6}, {100, 2e-6}};
  c.intra_host.fitted[sim::Collective::all_to_all] = {2e-6, 5e9};
  c.intra_host.seams[sim::Collective::all_reduce] = {3e-6, 2e9};
  c.busy_memory_slowdown = 1.5;
  const nlohmann::json j = sim::to_json(c);
  const sim::Cluster back = sim::cluster_from_json(j);
  EXPECT_EQ(sim::to_json(back), j);
  EXPECT_EQ(back.intra_host.fit(sim::Collective::all_to_all).bandwidth, 5e9);
  EXPECT_EQ(back.intra_host.fit(sim::Collective::put).bandwidth, 1e10);  // unfitted: the link's
  EXPECT_EQ(back.intra_host.fit(sim::Collective::all_reduce, true).bandwidth, 2e9);  // a seam's own
  EXPECT_EQ(back.intra_host.fit(sim::Collective::all_to_all, true).bandwidth, 5e9);  // no seam fit: the library's
  nlohmann::json bad_seam = j;
  bad_seam["links"]["intra_host"]["seams"]["all_reduce"]["bandwidth"] = 0;
  try {
    sim::cluster_from_json(bad_seam);
    FAIL() << "accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("intra_host.seams.all_reduce.bandwidth"), std::string::npos) << e.what();
  }

  nlohmann::json bad = j;
  bad["device"]["memory_bandwidth"] = -1;
  bad["device"]["efficiency"]["gemm"] = 1.5;
  try {
    sim::cluster_from_json(bad);
    FAIL() << "accepted";
  } catch (const InvalidArgument& e) {  // every problem at once
    EXPECT_NE(std::string(e.what()).find("memory_bandwidth"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("efficiency.gemm"), std::string::npos) << e.what();
  }
  nlohmann::json missing = j;
  missing["links"].erase("inter_host");
  EXPECT_THROW(sim::cluster_from_json(missing), InvalidArgument);
  nlohmann::json schema = j;
  schema["schema"] = "coremesh-cluster/0";
  EXPECT_THROW(sim::cluster_from_json(schema), InvalidArgument);
  EXPECT_THROW(sim::load_cluster("/nonexistent/cluster.json"), Error);
  // a misspelt field, a file that is no object, hosts that do not divide the devices, negative memory
  auto refused = [](const nlohmann::json& file, const std::string& words) {
    try {
      sim::cluster_from_json(file);
      ADD_FAILURE() << "accepted: " << file.dump();
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  nlohmann::json extra = j;
  extra["linkz"] = 1;
  refused(extra, "unknown field 'linkz'");
  refused(nlohmann::json::array(), "not a JSON object");
  nlohmann::json hosts = j;
  hosts["devices"] = 2048, hosts["host"]["devices"] = 3;
  refused(hosts, "give whole hosts");
  nlohmann::json memory = j;
  memory["device"]["memory_bytes"] = -1;
  refused(memory, "device.memory_bytes is -1");
  // counts past int (they were truncated: 2^40 devices read as 0) and rates too small to be meant
  nlohmann::json huge = j;
  huge["devices"] = int64_t(1) << 40;
  refused(huge, "devices is 1099511627776, not a count");
  nlohmann::json tiny = j;
  tiny["device"]["memory_bandwidth"] = 1e-300;
  refused(tiny, "device.memory_bandwidth is 1e-300");
  // a misspelt field inside a section (it left the value at its default), times past an hour
  nlohmann::json nested = j;
  nested["host"]["devics"] = 8;
  refused(nested, "unknown field 'devics' in host");
  nlohmann::json eff = j;
  eff["device"]["efficency"] = nlohmann::json::object();
  refused(eff, "unknown field 'efficency' in device");
  nlohmann::json fit = j;
  fit["links"]["intra_host"]["collectives"]["all_to_all"] = {{"latency_seconds", 1e-6}, {"bandwith", 1e9}};
  refused(fit, "unknown field 'bandwith' in links.intra_host.collectives.all_to_all");
  nlohmann::json slow = j;
  slow["links"]["inter_host"]["latency_seconds"] = 1e308;
  refused(slow, "links.inter_host.latency_seconds is 1e+308");
  nlohmann::json threads = j;
  threads["measured"]["threads"] = -2;
  refused(threads, "measured.threads is negative");
}

TEST(Simulator, OnePeIsTheSumOfItsKernels) {
  const sim::Cluster c = roofline();
  const train::TrainConfig cfg = demo();
  const sim::SimResult r = sim::simulate_step({cfg, 1.0}, c);
  double kernels = 0;
  for (int part = 0; part < model::num_parts(cfg.model); ++part) {
    const sim::PartWork w = sim::part_work({cfg, 1.0}, part);
    for (const auto* list : {&w.forward, &w.input_grad, &w.weight_grad})
      for (const sim::Op& op : *list) kernels += c.op_seconds(op);
  }
  const double optimizer = c.op_seconds(sim::optimizer_op(double(model::count_params(cfg.model).total)));
  EXPECT_NEAR(r.step_seconds, kernels + optimizer, 1e-12);
  EXPECT_NEAR(r.exposed_comm_seconds, 0.0, 1e-15);
  EXPECT_EQ(r.bubble_fraction, 0.0);
  EXPECT_NEAR(r.mfu, r.model_flops / (r.step_seconds * 1e12), 1e-12);
}

TEST(Simulator, PipelineFillsAndDrainsWithinOneMicroBatchPerRank) {
  // 2 ranks of near-equal halves (the embedding and the head make them differ)
  sim::Cluster c = roofline();
  train::TrainConfig cfg = demo();
  cfg.parallel.pp = 2, cfg.parallel.schedule = parallel::PipelineSchedule::gpipe, cfg.grad_accum = 4;
  const sim::SimResult r = sim::simulate_step({cfg, 1.0}, c);
  ASSERT_EQ(r.ranks.size(), 2u);
  const double f0 = r.ranks[0].compute, f1 = r.ranks[1].compute;
  EXPECT_NEAR(f0 / f1, 1.0, 0.35);  // balanced stages, but for the embedding and the head
  EXPECT_GT(r.bubble_fraction, 0.0);
  // the pipeline can not beat its slower rank's work, nor lose more than one micro-batch per rank to fill and drain
  const double slow = std::max(f0, f1), per_mb = slow / cfg.grad_accum;
  EXPECT_GE(r.pipeline_seconds, slow);
  EXPECT_LE(r.pipeline_seconds, slow + 2 * per_mb * 1.35 + 1e-9);
}

TEST(Simulator, ExchangesAndSyncAddUp) {
  const sim::Cluster c = roofline();
  train::TrainConfig one = demo(), dp = demo(), zero = demo();
  dp.parallel.dp = 2;
  zero.parallel.dp = 2, zero.parallel.zero = 1;
  const sim::SimResult a = sim::simulate_step({one, 1.0}, c), b = sim::simulate_step({dp, 1.0}, c),
                       z = sim::simulate_step({zero, 1.0}, c);
  // dp 2: the same step plus the gradients' ring all-reduces (dense, experts; the norm's), twice the tokens
  const model::ParamCount n = model::count_params(one.model);
  EXPECT_NEAR(b.ranks[0].gradient_sync,
              c.exchange_seconds(sim::Collective::all_reduce, 2, 4.0 * double(n.total - n.expert), false) +
                  c.exchange_seconds(sim::Collective::all_reduce, 2, 4.0 * double(n.expert), false) +
                  c.exchange_seconds(sim::Collective::all_reduce, 2, 8, false),
              1e-12);
  EXPECT_NEAR(b.tokens_per_second / a.tokens_per_second, 2 * a.step_seconds / b.step_seconds, 1e-9);
  // ZeRO-1 moves the same bytes (reduce-scatter + all-gather) and halves the optimizer
  EXPECT_NEAR(z.ranks[0].optimizer, b.ranks[0].optimizer / 2, 1e-3 * b.ranks[0].optimizer);
  EXPECT_LT(z.peak_bytes, b.peak_bytes);
}

TEST(Simulator, SeamFitsPriceTheSeamsExchangesOnly) {
  sim::Cluster library = roofline(), seams = roofline();
  seams.intra_host.seams[sim::Collective::all_reduce] = {1e-3, 1e8};  // far slower than the link
  seams.intra_host.seams[sim::Collective::all_to_all] = {1e-3, 1e8};
  train::TrainConfig tp = demo(), dp = demo();
  tp.parallel.tp = 2, dp.parallel.dp = 2;
  // the gradient sums are the library's collectives: no seam in a dp layout
  EXPECT_EQ(sim::simulate_step({dp, 1.0}, seams).step_seconds, sim::simulate_step({dp, 1.0}, library).step_seconds);
  // tp 2: each TP all-reduce (no SP) at the seam's price instead of the link's
  const sim::SimResult a = sim::simulate_step({tp, 1.0}, library), b = sim::simulate_step({tp, 1.0}, seams);
  double exposed = 0, hidden = 0;  // the input-gradient sums hide behind the weight gradients here (a device)
  for (int part = 0; part < model::num_parts(tp.model); ++part) {
    const sim::PartWork w = sim::part_work({tp, 1.0}, part);
    for (const auto* list : {&w.forward_exchanges, &w.backward_exchanges})
      for (const sim::Exchange& x : *list) {
        ASSERT_EQ(x.group, sim::Group::tp);
        ASSERT_EQ(x.collective, sim::Collective::all_reduce);
        (x.hidden_by_weight_grad ? hidden : exposed) += seams.exchange_seconds(x.collective, 2, x.bytes, false, true) -
                                                        library.exchange_seconds(x.collective, 2, x.bytes, false);
      }
  }
  EXPECT_GT(exposed, 0.01);
  EXPECT_GE(b.step_seconds - a.step_seconds, exposed - 1e-9);
  EXPECT_LE(b.step_seconds - a.step_seconds, exposed + hidden + 1e-9);
  // ep 2: the dispatch and combine (and their backward) at the EP seam's price; Ulysses' all-to-alls are not a seam
  train::TrainConfig ep = demo(), ulysses = demo();
  ep.parallel.ep = 2;
  ulysses.parallel.cp = 2, ulysses.parallel.cp_comm = parallel::CpComm::ulysses;
  EXPECT_GT(sim::simulate_step({ep, 1.0}, seams).step_seconds, sim::simulate_step({ep, 1.0}, library).step_seconds + 0.01);
  EXPECT_EQ(sim::simulate_step({ulysses, 1.0}, seams).step_seconds,
            sim::simulate_step({ulysses, 1.0}, library).step_seconds);
}

TEST(Simulator, HostSharingSlowsTheRanks) {
  sim::Cluster c = roofline();
  c.cpu_cores = 2;
  c.host_devices = 8;
  train::TrainConfig two = demo(), four = demo();
  two.parallel.dp = 2, four.parallel.dp = 4;
  const sim::SimResult r2 = sim::simulate_step({two, 1.0}, c), r4 = sim::simulate_step({four, 1.0}, c);
  // 4 PEs on 2 cores: every kernel twice as long
  EXPECT_NEAR(r4.ranks[0].compute, 2 * r2.ranks[0].compute, 1e-9);
  c.busy_memory_slowdown = 2;
  EXPECT_DOUBLE_EQ(c.sharing(1, 1, sim::OpKind::elementwise), 1.0);
  EXPECT_DOUBLE_EQ(c.sharing(2, 1, sim::OpKind::elementwise), 2.0);
  EXPECT_DOUBLE_EQ(c.sharing(4, 1, sim::OpKind::elementwise), 4.0);
  EXPECT_DOUBLE_EQ(c.sharing(2, 1, sim::OpKind::gemm), 1.0);
}

TEST(Simulator, RefusesWhatCannotRun) {
  const sim::Cluster c = roofline(4);
  train::TrainConfig big = demo();
  big.parallel.dp = 8;
  EXPECT_THROW(sim::simulate_step({big, 1.0}, c), InvalidArgument);
  train::TrainConfig bad = demo();
  bad.parallel.cp = 2, bad.parallel.pp = 2;  // not yet combined (layout_problems)
  try {
    sim::simulate_step({bad, 1.0}, c);
    FAIL() << "accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("cp or pp"), std::string::npos) << e.what();
  }
}

TEST(Simulator, TraceHasEveryRanksActions) {
  train::TrainConfig cfg = demo();
  cfg.parallel.pp = 2, cfg.grad_accum = 4;
  const sim::SimResult r = sim::simulate_step({cfg, 1.0}, roofline());
  const nlohmann::json t = sim::simulated_trace(r);
  int actions = 0;
  double last_end = 0;
  for (const auto& e : t.at("traceEvents"))
    if (e.at("ph") == "X") {
      ++actions;
      last_end = std::max(last_end, e.at("ts").get<double>() + e.at("dur").get<double>());
    }
  EXPECT_EQ(actions, 2 * 2 * 4 + 2);  // F and B of 4 micro-batches on 2 ranks; the optimizer on each
  EXPECT_NEAR(last_end, r.step_seconds * 1e6, 1e-3 * r.step_seconds * 1e6);
}

// DualPipe: each micro-batch passes one of a rank's two chunks, so a rank's
// compute is half its chunks' over every micro-batch, within the step; its
// pairs overlap only what their own chunks exchange (no exchange: f + b).
TEST(Simulator, DualPipeCountsEachMicroBatchOnceAndPricesPairsByTheirChunks) {
  const sim::Cluster c = roofline();
  train::TrainConfig cfg = demo();
  cfg.parallel.pp = 2, cfg.grad_accum = 4;
  cfg.parallel.schedule = parallel::PipelineSchedule::dualpipe;
  const sim::SimResult dual = sim::simulate_step({cfg, 1.0}, c);
  cfg.parallel.schedule = parallel::PipelineSchedule::zbv;
  const sim::SimResult v = sim::simulate_step({cfg, 1.0}, c);
  for (const auto& r : dual.ranks) EXPECT_LE(r.compute, dual.pipeline_seconds) << "compute past the step";
  EXPECT_EQ(dual.exposed_comm_seconds, v.exposed_comm_seconds);  // no exchanges here: nothing exposed in either
  EXPECT_NEAR(dual.exposed_comm_seconds, 0.0, 1e-15);
}

// The routing skew loads the busiest EP rank: without expert parallelism a
// rank computes every assignment, and a rank gets at most all ep ranks' rows.
TEST(Simulator, RoutingSkewLoadsOnlyExpertParallelRanks) {
  const sim::Cluster c = roofline();
  train::TrainConfig cfg = demo();
  cfg.model.capacity_factor = 0;
  EXPECT_EQ(sim::simulate_step({cfg, 3.0}, c).step_seconds, sim::simulate_step({cfg, 1.0}, c).step_seconds);
  cfg.parallel.ep = 2;
  const double even = sim::simulate_step({cfg, 1.0}, c).step_seconds;
  EXPECT_GT(sim::simulate_step({cfg, 1.5}, c).step_seconds, even);
  EXPECT_EQ(sim::simulate_step({cfg, 9.0}, c).step_seconds, sim::simulate_step({cfg, 2.0}, c).step_seconds);
}

TEST(Planner, EveryLayoutRunsAndTheFastestComesFirst) {
  sim::PlanRequest req;
  req.config = demo();
  req.config.model.aux_loss_alpha = 0;
  req.pes = 4;
  req.global_batch = 16;
  const auto layouts = sim::plan_layouts(req, roofline());
  ASSERT_FALSE(layouts.empty());
  bool dp4 = false, ep4 = false, tp2pp2 = false;
  for (size_t i = 0; i < layouts.size(); ++i) {
    const auto& p = layouts[i].config.parallel;
    EXPECT_EQ(p.world(), 4);
    EXPECT_TRUE(parallel::layout_problems(train::plan_config(layouts[i].config), 4).empty());
    // the global batch is kept
    EXPECT_EQ(layouts[i].config.batch_size * layouts[i].config.grad_accum * p.dp * p.ep, 16);
    if (i > 0) {
      EXPECT_LE(layouts[i - 1].result.step_seconds, layouts[i].result.step_seconds);
    }
    dp4 |= p.dp == 4, ep4 |= p.ep == 4, tp2pp2 |= p.tp == 2 && p.pp == 2;
  }
  EXPECT_TRUE(dp4 && ep4 && tp2pp2);
}

// A micro-batch so large that dp x ep x batch passed int (it wrapped to 0: SIGFPE).
TEST(Planner, AHugeBatchIsNoCrash) {
  sim::PlanRequest req;
  req.config = demo();
  req.config.batch_size = 1 << 30;
  req.pes = 4;
  req.global_batch = 1;
  EXPECT_TRUE(sim::valid_layouts(req).empty());
}

TEST(Planner, ShippedClusterFilesLoad) {
  for (const char* name : {"h800-deepseek-v3.json", "ascend-910b-seed.json"}) {
    const auto path = std::filesystem::path(COREMESH_SOURCE_DIR) / "clusters" / name;
    const sim::Cluster c = sim::load_cluster(path.string());
    EXPECT_GT(c.devices, 1000) << name;
    EXPECT_FALSE(c.sources.empty()) << name;
  }
}
