// The pipeline's exchanges besides activations (pipeline_executor.hpp): the
// tied table across stages and DualPipe's gradient sums between partners.
#include <map>

#include "coremesh/core/error.hpp"
#include "coremesh/parallel/comm.hpp"
#include "coremesh/parallel/pipeline_executor.hpp"
#include "pipeline_parts.hpp"

namespace coremesh::parallel {
namespace detail {

const ParamSpan* replica_of(const StageParams& p) {
  for (const ParamSpan& s : p.params)
    if (s.tied_replica) return &s;
  return nullptr;
}

const ParamSpan& table_of(const StageParams& p) {
  for (const ParamSpan& s : p.params)
    if (s.part == 0) return s;
  CM_THROW(InvalidArgument, "report this: the embedding's stage holds no table", "no parameter in part 0");
}

}  // namespace detail

using detail::replica_of;
using detail::table_of;

// ---- the tied table across stages

PipelineExecutor::Tied::Tied(PipelineExecutor& x) : x_(x) {
  const Schedule& s = x.s_.schedule;
  for (int mb = 0; mb < s.micro_batches; ++mb) {
    embedding_rank_.push_back(s.locate(mb, 0).rank);
    head_rank_.push_back(s.locate(mb, s.num_stages() - 1).rank);
  }
  const StageParams head = x.s_.params_of(x.s_.stage_of(head_rank_[0]));
  const ParamSpan* replica = replica_of(head);
  CM_ASSERT(replica != nullptr);
  replica_offset_ = replica->offset;
  numel_ = replica->numel;  // this TP rank's rows of the table (all of them without vocab parallelism)
  signal_base_ = 2 * s.chunks * s.micro_batches;
}

void PipelineExecutor::Tied::head_gradient(int slot, const Tensor& grad) {
  const int to = embedding_rank_.at(size_t(slot));
  if (to == x_.s_.rank) {
    local_[slot] = grad;
    return;
  }
  x_.keep_.push_back(grad);
  runtime::Stream stream = runtime::current_stream();
  put_on_stream(stream, x_.buf_[kTied], slot * numel_, grad.view({numel_}), x_.signal(signal_base_ + slot),
                x_.pe(to));
}

Tensor PipelineExecutor::Tied::take_head_gradient(int slot) {
  const int from = head_rank_.at(size_t(slot));
  if (from == x_.s_.rank) {
    auto it = local_.find(slot);
    CM_CHECK(it != local_.end(), "run the head's backward of a micro-batch before the embedding's",
             "micro-batch {}: no gradient of the head for the tied table", slot);
    Tensor g = it->second;
    local_.erase(it);
    return g;
  }
  x_.wait(signal_base_ + slot, fmt::format("waits for PE {}'s head gradient of the tied table, micro-batch {}",
                                           x_.pe(from), slot));
  return x_.buf_[kTied].slice(0, slot * numel_, (slot + 1) * numel_);
}

// Under DualPipe every rank holds the table and a replica, and both copies
// of the table take the same steps: the replica follows the rank's own.
void PipelineExecutor::Tied::sync(StageModel& stage) {
  const int me = x_.s_.rank, sig = signal_base_ + x_.s_.schedule.micro_batches;
  const int embedding = embedding_rank_[0], head = head_rank_[0];
  const Tensor& arena = stage.param_arena();
  if (x_.s_.schedule.placement == Placement::bidirectional || embedding == head) {
    if (const ParamSpan* replica = replica_of(x_.params_)) {
      const ParamSpan& table = table_of(x_.params_);
      copy_on_stream(arena.slice(0, table.offset, table.offset + numel_),
                     arena.slice(0, replica->offset, replica->offset + numel_));
    }
  } else if (me == embedding) {
    const ParamSpan& table = table_of(x_.params_);
    runtime::Stream stream = runtime::current_stream();
    put_on_stream(stream, arena, replica_offset_, arena.slice(0, table.offset, table.offset + numel_),
                  x_.signal(sig), x_.pe(head));
  } else if (me == head) {
    x_.wait(sig, fmt::format("waits for PE {}'s updated embedding table", x_.pe(embedding)));
  }
}

// ---- DualPipe's gradient sums
// Rank r holds stage r of copy 0 (chunk 0) and stage p-1-r of copy 1 (chunk
// 1), its partner p-1-r the same stages the other way round, in the same
// arena layout (a chunk's range here is the partner's other chunk's). A
// chunk's gradient sums and its MoE layers' loads (E + 1 per layer, at
// layer l * (E + 1)) go into the partner's buffers, a signal each, the
// receiving chunk's: sums at sum_signal(c), loads at sum_signal(c) + 1.

int PipelineExecutor::sum_signal(int chunk) const {
  return 2 * s_.schedule.chunks * s_.schedule.micro_batches + s_.schedule.micro_batches + 1 + 2 * chunk;
}

std::pair<int64_t, int64_t> PipelineExecutor::chunk_range(int chunk) const {
  const PartRange r = stage_.chunks[size_t(chunk)];
  return {params_.region_offset[size_t(r.begin)],
          params_.region_offset[size_t(r.end - 1)] + params_.region_size[size_t(r.end - 1)]};
}

std::vector<std::pair<int, int>> PipelineExecutor::chunk_layers(int chunk) const {
  std::vector<std::pair<int, int>> out;
  const PartRange mine = stage_.chunks[size_t(chunk)];
  int i = 0;
  for (int l : s_.shape.moe_layers) {
    if (!holds_part(stage_, 2 + 2 * l)) continue;
    if (mine.begin <= 2 + 2 * l && 2 + 2 * l < mine.end) out.emplace_back(i, l);
    ++i;
  }
  return out;
}

void PipelineExecutor::send_sums(StageModel& m, int chunk) {
  const int partner = pe(s_.schedule.ranks - 1 - s_.rank);
  runtime::Stream stream = runtime::current_stream();
  const auto [b, e] = chunk_range(chunk);
  put_on_stream(stream, buf_[kCopyGrads], b, m.grad_arena().slice(0, b, e), signal(sum_signal(1 - chunk)), partner);
  const auto layers = chunk_layers(chunk);
  if (layers.empty()) return;
  const int64_t E = s_.shape.routing_stats(), lb = layers.front().second * E, le = (layers.back().second + 1) * E;
  for (const auto& [i, l] : layers) copy_on_stream(m.expert_load()[size_t(i)], buf_[kLoads].slice(0, l * E, (l + 1) * E));
  put_on_stream(stream, buf_[kCopyLoads], lb, buf_[kLoads].slice(0, lb, le), signal(sum_signal(1 - chunk) + 1),
                partner);
}

void PipelineExecutor::receive_sums(StageModel& m, int chunk) {
  const int partner = pe(s_.schedule.ranks - 1 - s_.rank);
  const bool continues = chunk == 1;  // copy 1's micro-batches come after the partner's
  wait(sum_signal(chunk), fmt::format("waits for PE {}'s {}", partner,
                                      continues ? "copy-0 gradient sums, which this rank's copy-1 micro-batches continue"
                                                : "finished gradient sums of this rank's copy-0 stage"));
  const auto [b, e] = chunk_range(chunk);
  copy_on_stream(buf_[kCopyGrads].slice(0, b, e), m.grad_arena().slice(0, b, e));
  if (continues) m.continue_gradient_sum(chunk);
  const auto layers = chunk_layers(chunk);
  if (layers.empty()) return;
  wait(sum_signal(chunk) + 1, fmt::format("waits for PE {}'s expert loads of the other model copy", partner));
  const int64_t E = s_.shape.routing_stats();
  for (const auto& [i, l] : layers) {  // copy 1: both copies' loads; copy 0: the partner's are the total
    const Tensor& load = m.expert_load()[size_t(i)];
    const Tensor theirs = buf_[kCopyLoads].slice(0, l * E, (l + 1) * E);
    if (continues) sum_in_order({load, theirs}, load);
    else copy_on_stream(theirs, load);
  }
}

}  // namespace coremesh::parallel
