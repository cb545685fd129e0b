#include "small_gemm.hpp"

#include <libxsmm.h>

#include <mutex>
#include <tuple>
#include <unordered_map>

#include "sgemm.hpp"

namespace coremesh::ops::detail {
namespace {

using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool, bool>;

struct KeyHash {
  size_t operator()(const Key& k) const {
    size_t h = 0;
    std::apply([&h](auto... v) { ((h = h * 1000003u ^ std::hash<int64_t>{}(int64_t(v))), ...); }, k);
    return h;
  }
};

// Kernels are looked up once per shape and thread (dispatch takes a lock).
libxsmm_smmfunction kernel_for(const Key& key) {
  thread_local std::unordered_map<Key, libxsmm_smmfunction, KeyHash> cache;
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  static std::once_flag once;
  std::call_once(once, [] { libxsmm_init(); });
  auto [m, n, k, lda, ldb, ldc, trans_a, accumulate] = key;
  // Row-major C = op(A) B is column-major C^T = B^T op(A)^T: libxsmm's "A" is
  // our B (no transpose) and its "B" is our A, transposed when trans_a.
  const libxsmm_blasint cm = n, cn = m, ck = k, clda = ldb, cldb = lda, cldc = ldc;
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  const int flags = LIBXSMM_GEMM_FLAGS('N', trans_a ? 'T' : 'N');
  libxsmm_smmfunction fn =
      libxsmm_smmdispatch(cm, cn, ck, &clda, &cldb, &cldc, &alpha, &beta, &flags, nullptr);
  cache.emplace(key, fn);
  return fn;
}

}  // namespace

void small_gemm(bool trans_a, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                const float* b, int64_t ldb, bool accumulate, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k > 0) {
    if (libxsmm_smmfunction fn = kernel_for({m, n, k, lda, ldb, ldc, trans_a, accumulate})) {
      fn(b, a, c);
      return;
    }
  }
  sgemm(trans_a, false, m, n, k, 1.0f, a, lda, b, ldb, accumulate ? 1.0f : 0.0f, c, ldc);
}

}  // namespace coremesh::ops::detail
