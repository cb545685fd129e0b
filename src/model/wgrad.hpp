// How a backward hands over its weight-gradient half. Every backward in
// src/model returns its input gradient at once and gives each weight-gradient
// product to a WgradSink as a job: the model runs the job at once (a plain
// backward) or keeps it for a later backward_weight() (zero-bubble pipeline
// schedules run the two halves at different times).
#pragma once

#include <functional>
#include <utility>
#include <vector>

#include "coremesh/core/tensor.hpp"

namespace coremesh::model::detail {

// The gradient of parameters [first, first + count) of the layout (adjacent
// parameters written by one GEMM, e.g. [w1; w3]), viewed with `shape` (empty:
// the first parameter's own shape).
struct GradRef {
  int first = -1, count = 1;
  Shape shape;
};

// A job writes dW = (its product) + beta * dW into `dw`. The sink chooses
// where dw lives and beta: 0 for the first write of the parameters in this
// micro-batch's weight-gradient half, 1 after it.
class WgradSink {
 public:
  using Job = std::function<void(const Tensor& dw, float beta)>;
  virtual ~WgradSink() = default;
  virtual void add(const GradRef& ref, Job job) = 0;
  // Whether jobs run at once; then gradients that the input-gradient half
  // computes anyway (an RMSNorm weight's) may be written straight into
  // view(ref) with take_beta(ref).
  virtual bool immediate() const = 0;
  virtual Tensor view(const GradRef& ref) = 0;
  virtual float take_beta(const GradRef& ref) = 0;
};

// A sink that holds the jobs given to it until release(), which hands them
// to `sink` in the order they came: a backward whose input gradient leaves
// for a sum over PEs runs its weight gradients while the sum is in flight.
class HeldJobs final : public WgradSink {
 public:
  explicit HeldJobs(WgradSink& sink) : sink_(sink) {}
  void add(const GradRef& ref, Job job) override { jobs_.push_back({ref, std::move(job)}); }
  bool immediate() const override { return false; }
  Tensor view(const GradRef& ref) override { return sink_.view(ref); }
  float take_beta(const GradRef& ref) override { return sink_.take_beta(ref); }
  void release() {
    for (auto& [ref, job] : jobs_) sink_.add(ref, std::move(job));
    jobs_.clear();
  }

 private:
  WgradSink& sink_;
  std::vector<std::pair<GradRef, Job>> jobs_;
};

}  // namespace coremesh::model::detail
