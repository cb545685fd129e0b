// C API: atomics from the AMO type tables. The fetching *_nbi forms complete
// at once (shared memory atomics are immediate), which quiet() allows.
#include "c_api.hpp"

namespace cm = coremesh::shmem;

namespace {
// Where a fetching *_nbi form puts the old value, checked before the atomic runs.
template <typename T>
T& fetched(T* fetch) {
  CM_CHECK(fetch != nullptr, "pass the address the fetched value goes to", "the fetch address is NULL");
  return *fetch;
}
}  // namespace

extern "C" {

#define CM_DEF_AMO_EXT(T, N)                                                                   \
  T shmem_##N##_atomic_fetch(const T* source, int pe) {                                        \
    CM_C_API("shmem_" #N "_atomic_fetch", return cm::atomic_fetch(source, pe));               \
  }                                                                                            \
  void shmem_##N##_atomic_fetch_nbi(T* fetch, const T* source, int pe) {                       \
    CM_C_API("shmem_" #N "_atomic_fetch_nbi", { T& out = fetched(fetch); out = cm::atomic_fetch(source, pe); });         \
  }                                                                                            \
  void shmem_##N##_atomic_set(T* dest, T value, int pe) {                                      \
    CM_C_API("shmem_" #N "_atomic_set", cm::atomic_set(dest, value, pe));                     \
  }                                                                                            \
  T shmem_##N##_atomic_swap(T* dest, T value, int pe) {                                        \
    CM_C_API("shmem_" #N "_atomic_swap", return cm::atomic_swap(dest, value, pe));            \
  }                                                                                            \
  void shmem_##N##_atomic_swap_nbi(T* fetch, T* dest, T value, int pe) {                       \
    CM_C_API("shmem_" #N "_atomic_swap_nbi", { T& out = fetched(fetch); out = cm::atomic_swap(dest, value, pe); });      \
  }

#define CM_DEF_AMO_STD(T, N)                                                                   \
  CM_DEF_AMO_EXT(T, N)                                                                         \
  T shmem_##N##_atomic_compare_swap(T* dest, T cond, T value, int pe) {                        \
    CM_C_API("shmem_" #N "_atomic_compare_swap",                                               \
             return cm::atomic_compare_swap(dest, cond, value, pe));                          \
  }                                                                                            \
  void shmem_##N##_atomic_compare_swap_nbi(T* fetch, T* dest, T cond, T value, int pe) {       \
    CM_C_API("shmem_" #N "_atomic_compare_swap_nbi",                                           \
             { T& out = fetched(fetch); out = cm::atomic_compare_swap(dest, cond, value, pe); });                        \
  }                                                                                            \
  T shmem_##N##_atomic_fetch_inc(T* dest, int pe) {                                            \
    CM_C_API("shmem_" #N "_atomic_fetch_inc", return cm::atomic_fetch_inc(dest, pe));         \
  }                                                                                            \
  void shmem_##N##_atomic_fetch_inc_nbi(T* fetch, T* dest, int pe) {                           \
    CM_C_API("shmem_" #N "_atomic_fetch_inc_nbi", { T& out = fetched(fetch); out = cm::atomic_fetch_inc(dest, pe); });   \
  }                                                                                            \
  void shmem_##N##_atomic_inc(T* dest, int pe) {                                               \
    CM_C_API("shmem_" #N "_atomic_inc", cm::atomic_inc(dest, pe));                            \
  }                                                                                            \
  T shmem_##N##_atomic_fetch_add(T* dest, T value, int pe) {                                   \
    CM_C_API("shmem_" #N "_atomic_fetch_add", return cm::atomic_fetch_add(dest, value, pe));  \
  }                                                                                            \
  void shmem_##N##_atomic_fetch_add_nbi(T* fetch, T* dest, T value, int pe) {                  \
    CM_C_API("shmem_" #N "_atomic_fetch_add_nbi",                                              \
             { T& out = fetched(fetch); out = cm::atomic_fetch_add(dest, value, pe); });                                 \
  }                                                                                            \
  void shmem_##N##_atomic_add(T* dest, T value, int pe) {                                      \
    CM_C_API("shmem_" #N "_atomic_add", cm::atomic_add(dest, value, pe));                     \
  }

#define CM_DEF_AMO_BITWISE_OP(T, N, OP, KIND)                                                  \
  T shmem_##N##_atomic_fetch_##OP(T* dest, T value, int pe) {                                  \
    CM_C_API("shmem_" #N "_atomic_fetch_" #OP,                                                 \
             return cm::atomic_fetch_op<cm::AtomicOp::KIND>(dest, value, pe));                \
  }                                                                                            \
  void shmem_##N##_atomic_fetch_##OP##_nbi(T* fetch, T* dest, T value, int pe) {               \
    CM_C_API("shmem_" #N "_atomic_fetch_" #OP "_nbi",                                          \
             { T& out = fetched(fetch); out = cm::atomic_fetch_op<cm::AtomicOp::KIND>(dest, value, pe); });              \
  }                                                                                            \
  void shmem_##N##_atomic_##OP(T* dest, T value, int pe) {                                     \
    CM_C_API("shmem_" #N "_atomic_" #OP, cm::atomic_fetch_op<cm::AtomicOp::KIND>(dest, value, pe)); \
  }
#define CM_DEF_AMO_BITWISE(T, N)                                                               \
  CM_DEF_AMO_BITWISE_OP(T, N, and, band)                                                       \
  CM_DEF_AMO_BITWISE_OP(T, N, or, bor) CM_DEF_AMO_BITWISE_OP(T, N, xor, bxor)

CM_SHMEM_AMO_STD_TYPES(CM_DEF_AMO_STD)
CM_SHMEM_AMO_EXT_ONLY_TYPES(CM_DEF_AMO_EXT)
CM_SHMEM_AMO_BITWISE_TYPES(CM_DEF_AMO_BITWISE)

}  // extern "C"
