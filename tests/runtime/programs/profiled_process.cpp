// A process profiled through COREMESH_PROFILE: runs `rounds` matmul + mul
// pairs on the default device and exits; the profiler writes its files at exit.
#include <cstdlib>

#include "coremesh/ops/elementwise.hpp"
#include "coremesh/ops/gemm.hpp"
#include "coremesh/runtime/stream.hpp"

int main(int argc, char** argv) {
  using namespace coremesh;
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 1;
  Tensor a = Tensor::full({64, 64}, 0.5f), b = Tensor::full({64, 64}, 0.25f);
  Tensor x = Tensor::full({100000}, 1.0f);
  for (int i = 0; i < rounds; ++i) {
    ops::matmul(a, b);
    ops::mul(x, x);
  }
  runtime::synchronize();
  return 0;
}
