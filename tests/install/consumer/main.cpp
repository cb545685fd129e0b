// A C++ program that uses installed coremesh libraries (found with
// find_package or pkg-config): a matmul on a stream (runtime, ops) and the
// trainer's learning-rate schedule (train). Prints what it computed and fails
// unless it is right.
#include <cmath>
#include <cstdio>

#include "coremesh/ops/gemm.hpp"
#include "coremesh/runtime/stream.hpp"
#include "coremesh/train/lr_schedule.hpp"

using namespace coremesh;

int main() {
  // c = a b with a (64, 32) of 0.5 and b (32, 16) of 2: every entry is 32.
  Tensor a = Tensor::full({64, 32}, 0.5f), b = Tensor::full({32, 16}, 2.0f);
  Tensor c = ops::matmul(a, b);
  runtime::synchronize();
  const float entry = c.item({63, 15});
  // warmup 10 steps to 1e-3: step 4 is at 5e-4
  train::LrSchedule lr{1e-3, 1e-4, 10, 100};
  lr.validate();
  const double lr4 = lr.at(4);
  std::printf("matmul entry %.1f, lr(4) %.6f\n", entry, lr4);
  return entry == 32.0f && std::fabs(lr4 - 5e-4) < 1e-12 ? 0 : 1;
}
