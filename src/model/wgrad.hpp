// How a backward hands over its weight-gradient half. Every backward in
// src/model returns its input gradient at once and gives each weight-gradient
// product to a WgradSink as a job: the model runs the job at once (a plain
// backward) or keeps it for a later backward_weight() (zero-bubble pipeline
// schedules run the two halves at different times).
#pragma once

#include <functional>

#include "coremesh/core/tensor.hpp"

namespace coremesh::model::detail {

// The gradient of parameters [first, first + count) of the layout (adjacent
// parameters written by one GEMM, e.g. [w1; w3]) and its arena view.
struct GradRef {
  int first = -1, count = 1;
  Tensor view;
};

// A job writes dW = (its product) + beta * dW into the view; the sink chooses
// beta: 0 for the first write of the parameters since zero_grad(), else 1.
class WgradSink {
 public:
  using Job = std::function<void(const Tensor& dw, float beta)>;
  virtual ~WgradSink() = default;
  virtual void add(const GradRef& ref, Job job) = 0;
};

}  // namespace coremesh::model::detail
