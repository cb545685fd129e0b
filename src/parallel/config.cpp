#include "coremesh/parallel/config.hpp"

#include <utility>

namespace coremesh::parallel {

const std::vector<std::pair<PipelineSchedule, std::string>>& pipeline_schedules() {
  using S = PipelineSchedule;
  static const std::vector<std::pair<S, std::string>> names{
      {S::gpipe, "gpipe"}, {S::one_f_one_b, "1f1b"}, {S::interleaved, "interleaved"}, {S::zb_h1, "zb-h1"},
      {S::zbv, "zbv"},     {S::dualpipe, "dualpipe"}, {S::dualpipev, "dualpipev"}};
  return names;
}

std::string schedule_name(PipelineSchedule s) {
  for (const auto& [value, name] : pipeline_schedules())
    if (value == s) return name;
  return "?";
}

const std::vector<std::pair<CpComm, std::string>>& cp_comms() {
  static const std::vector<std::pair<CpComm, std::string>> names{{CpComm::ring, "ring"}, {CpComm::ulysses, "ulysses"}};
  return names;
}

const FieldTable<ParallelConfig>& parallel_fields() {
  using P = ParallelConfig;
  static const FieldTable<P> t =
      FieldTable<P>("parallel")
          .add("dp", [](P& p) -> auto& { return p.dp; }, "data-parallel degree", positive<int>())
          .add("cp", [](P& p) -> auto& { return p.cp; }, "context-parallel degree", positive<int>())
          .add("pp", [](P& p) -> auto& { return p.pp; }, "pipeline-parallel degree (stages)", positive<int>())
          .add("ep", [](P& p) -> auto& { return p.ep; }, "expert-parallel degree", positive<int>())
          .add("tp", [](P& p) -> auto& { return p.tp; }, "tensor-parallel degree", positive<int>())
          .add("sequence_parallel", [](P& p) -> auto& { return p.sequence_parallel; },
               "tensor parallel: each TP rank keeps 1/tp of the tokens for RMSNorm and the residual stream "
               "(all-gather / reduce-scatter instead of all-reduce)")
          .add("tp_comm_overlap", [](P& p) -> auto& { return p.tp_comm_overlap; },
               "tensor parallel: sum the backward's input gradients on a comm stream while the weight gradients "
               "compute (false: one after the other; the same results)")
          .add("fused_comm", [](P& p) -> auto& { return p.fused_comm; },
               "tensor parallel: fuse the forward's GEMMs at the TP regions' edges with their exchanges "
               "(all-gather + GEMM, GEMM + reduce-scatter / all-reduce, chunk by chunk; the same results; false: "
               "the exchanges on their own)")
          .add("moe_replicas", [](P& p) -> auto& { return p.moe_replicas; },
               "MoE layers: split each micro-batch's tokens into this many slices whose expert exchanges overlap "
               "each other's expert GEMMs (RFC 2.1; 1: one block)",
               in_range<int>(1, 16))
          .add("comm_cores", [](P& p) -> auto& { return p.comm_cores; },
               "moe_replicas > 1: vector cores the MoE exchanges' comm stream may use (0: no limit)",
               in_range<int>(0, 4096))
          .add_enum("expert_balance", [](P& p) -> auto& { return p.expert_balance; }, expert_balances(),
                    "ep > 1: hot experts shadowed on every PE of the group, planned from each step's loads (shadow) "
                    "or every balance_window steps from the window's (static); none: every expert on its owner")
          .add("balance_window", [](P& p) -> auto& { return p.balance_window; },
               "expert_balance static: steps between plans, each made from the loads of the steps before",
               in_range<int>(1, 100000))
          .add("shadow_cost", [](P& p) -> auto& { return p.shadow_cost; },
               "expert_balance: what shadowing an expert costs a PE (its weights in, its gradient out), in rows of "
               "expert work; a shadow is planned only where it lowers the busiest PE's work by more",
               non_negative<double>())
          .add_enum("cp_comm", [](P& p) -> auto& { return p.cp_comm; }, cp_comms(),
                    "context parallel: ring (K/V around the ring) or ulysses (all-to-all to head sharding)")
          .add("cp_zigzag", [](P& p) -> auto& { return p.cp_zigzag; },
               "context parallel: rank r holds chunks r and 2cp-1-r of each sequence (false: chunk r of cp)")
          .add("zero", [](P& p) -> auto& { return p.zero; },
               "ZeRO stage: 0 off, 1 shards the optimizer state over the data-parallel ranks",
               in_range<int>(0, 1))
          .add_enum("schedule", [](P& p) -> auto& { return p.schedule; }, pipeline_schedules(), "pipeline schedule (pp > 1)")
          .add("virtual_stages", [](P& p) -> auto& { return p.virtual_stages; },
               "model chunks per pipeline rank (interleaved)", positive<int>())
          .add("schedule_file", [](P& p) -> auto& { return p.schedule_file; },
               "a schedule's text form to run instead of --schedule (see coremesh schedule --text-only)");
  return t;
}

std::vector<std::string> ParallelConfig::problems() const {
  std::vector<std::string> out = parallel_fields().problems(*this);
  // the product in int64 (as an int it wrapped: 2^30 + 1 data ranks x 4 became 4 PEs)
  constexpr int64_t kMaxWorld = 1 << 16;  // 4x the seed's 15,872 devices
  const int64_t world = int64_t(dp) * cp * pp * ep * tp;
  if (dp > 0 && cp > 0 && pp > 0 && ep > 0 && tp > 0 && world > kMaxWorld)
    out.push_back(fmt::format("dp {} x cp {} x pp {} x ep {} x tp {} = {} PEs, more than {}: lower the degrees", dp,
                              cp, pp, ep, tp, world, kMaxWorld));
  return out;
}

}  // namespace coremesh::parallel
