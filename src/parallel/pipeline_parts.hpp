// What the pipeline executor's two files share (pipeline_executor.cpp: the
// actions; pipeline_exchanges.cpp: the tied table, DualPipe's sums).
#pragma once

#include <map>
#include <vector>

#include "coremesh/parallel/pipeline_executor.hpp"
#include "coremesh/parallel/stage.hpp"

namespace coremesh::parallel::detail {

// The head's replica of a tied table (nullptr when the stage holds none).
const ParamSpan* replica_of(const StageParams& p);
// The embedding's table: part 0's parameter.
const ParamSpan& table_of(const StageParams& p);

}  // namespace coremesh::parallel::detail

namespace coremesh::parallel {

// The tied table across stages (the TiedEmbedding seam of the executor):
// micro-batch mb's embedding and head lie on the ranks of stages 0 and last
// of its copy (DualPipe runs two copies in opposite directions).
class PipelineExecutor::Tied final : public TiedEmbedding {
 public:
  explicit Tied(PipelineExecutor& x);
  void head_gradient(int slot, const Tensor& grad) override;
  Tensor take_head_gradient(int slot) override;
  // After the optimizer: the embedding's table into the head's replica.
  void sync(StageModel& stage);

 private:
  PipelineExecutor& x_;
  int signal_base_ = 0;
  std::vector<int> embedding_rank_, head_rank_;  // per micro-batch
  int64_t replica_offset_ = 0, numel_ = 0;
  std::map<int, Tensor> local_;
};

}  // namespace coremesh::parallel
