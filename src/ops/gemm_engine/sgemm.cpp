#include "sgemm.hpp"

#include <mutex>

namespace coremesh::ops::detail {

void blas_single_thread() {
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
}

}  // namespace coremesh::ops::detail
