// The parallel layout of a training run: the degrees of the 5D mesh
// (DESIGN.md §7, rank order [DP][CP][PP][EP][TP]), ZeRO and the pipeline
// schedule. Every degree 1 means that dimension is off; a config without a
// "parallel" section trains on one PE.
//
// Micro-batches per step are the trainer's `grad_accum` (per data-parallel
// rank): one count for both gradient accumulation and pipeline schedules.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "coremesh/core/fields.hpp"
#include "coremesh/parallel/expert_balance.hpp"

namespace coremesh::parallel {

// The pipeline schedules (issue: schedules as data); "1f1b" etc. in configs.
// Generators in schedule_generators.hpp.
enum class PipelineSchedule { gpipe, one_f_one_b, interleaved, zb_h1, zbv, dualpipe, dualpipev };
const std::vector<std::pair<PipelineSchedule, std::string>>& pipeline_schedules();  // with their names
std::string schedule_name(PipelineSchedule s);

// How context parallelism moves the sequence (context_parallel.hpp).
enum class CpComm { ring, ulysses };
const std::vector<std::pair<CpComm, std::string>>& cp_comms();  // with their names

struct ParallelConfig {
  int dp = 1;  // data parallel: ranks that see different micro-batches of the global batch
  int cp = 1;  // context parallel: ranks that split each sequence
  int pp = 1;  // pipeline parallel: stages
  int ep = 1;  // expert parallel: ranks that split the routed experts
  int tp = 1;  // tensor parallel: ranks that split each layer's matrices
  // tp > 1: each TP rank holds 1/tp of a micro-batch's token rows outside the
  // tensor-parallel regions (Megatron-LM sequence parallelism)
  bool sequence_parallel = false;
  // tp > 1: the sums of the backward's input gradients run on a comm stream
  // while the same linears' weight gradients compute (false: in order)
  bool tp_comm_overlap = true;
  // The forward's GEMMs fused with their exchanges, the same results: tp > 1,
  // the TP regions' edges (fused_comm.hpp), the exchange chunk by chunk
  // behind the GEMM; ep > 1, the experts' first GEMM per source as its rows
  // land and the second expert by expert as combine sends (ShmemExperts, not
  // with shadowed experts). On by default: no layout of the demo is slower
  // beyond the run-to-run noise, the TP edges skip staging copies
  // (docs/performance.md, "Fused communication")
  bool fused_comm = true;
  // MoE layers: each micro-batch's tokens in this many slices, each slice's
  // route -> dispatch -> experts -> combine on its own stream, the exchanges
  // on a comm stream limited to comm_cores vector cores (0: no limit), so
  // that one slice's exchange runs while another's experts compute
  int moe_replicas = 1;
  int comm_cores = 0;
  // ep > 1: hot experts computed by every source on its own rows with a
  // copy of the owner's weights (expert_balance.hpp), planned every step
  // (shadow) or every balance_window steps from the window's loads (static)
  ExpertBalance expert_balance = ExpertBalance::none;
  int balance_window = 10;
  double shadow_cost = 16;  // the planner's price of a shadow on a PE, in rows of expert work
  CpComm cp_comm = CpComm::ring;  // cp > 1: ring attention or Ulysses all-to-all
  bool cp_zigzag = true;          // ring: chunks r and 2cp-1-r per rank (balanced causal work); false: chunk r
  int zero = 0;                   // 1: ZeRO-1, the optimizer state sharded over the data-parallel ranks
  PipelineSchedule schedule = PipelineSchedule::one_f_one_b;  // pp > 1
  int virtual_stages = 1;         // model chunks per pipeline rank (interleaved schedules)
  std::string schedule_file;      // a schedule's text form to run instead of `schedule` ("": generate)

  int world() const { return dp * cp * pp * ep * tp; }
  std::vector<std::string> problems() const;  // per field and across fields
  bool operator==(const ParallelConfig&) const = default;
};

const FieldTable<ParallelConfig>& parallel_fields();

}  // namespace coremesh::parallel
