// C API: RMA and put-with-signal, typed (from CM_SHMEM_RMA_TYPES), sized
// (CM_SHMEM_SIZES) and untyped (*mem).
#include "c_api.hpp"

namespace in = coremesh::shmem::internal;

extern "C" {


#define CM_DEF_RMA(T, N)                                                                      \
  void shmem_##N##_put(T* dest, const T* source, size_t nelems, int pe) {                     \
    CM_C_API("shmem_" #N "_put", in::put(dest, source, in::array_bytes(nelems, sizeof(T)), pe, "shmem_" #N "_put")); \
  }                                                                                           \
  void shmem_##N##_get(T* dest, const T* source, size_t nelems, int pe) {                     \
    CM_C_API("shmem_" #N "_get", in::get(dest, source, in::array_bytes(nelems, sizeof(T)), pe, "shmem_" #N "_get")); \
  }                                                                                           \
  void shmem_##N##_put_nbi(T* dest, const T* source, size_t nelems, int pe) {                 \
    CM_C_API("shmem_" #N "_put_nbi",                                                          \
             in::put_nbi(dest, source, in::array_bytes(nelems, sizeof(T)), pe, "shmem_" #N "_put_nbi"));      \
  }                                                                                           \
  void shmem_##N##_get_nbi(T* dest, const T* source, size_t nelems, int pe) {                 \
    CM_C_API("shmem_" #N "_get_nbi",                                                          \
             in::get_nbi(dest, source, in::array_bytes(nelems, sizeof(T)), pe, "shmem_" #N "_get_nbi"));      \
  }                                                                                           \
  void shmem_##N##_p(T* dest, T value, int pe) {                                              \
    CM_C_API("shmem_" #N "_p", in::put(dest, &value, sizeof(T), pe, "shmem_" #N "_p"));       \
  }                                                                                           \
  T shmem_##N##_g(const T* source, int pe) {                                                  \
    T value;                                                                                  \
    CM_C_API("shmem_" #N "_g", in::get(&value, source, sizeof(T), pe, "shmem_" #N "_g"));     \
    return value;                                                                             \
  }                                                                                           \
  void shmem_##N##_iput(T* dest, const T* source, ptrdiff_t dst, ptrdiff_t sst, size_t nelems, \
                        int pe) {                                                             \
    CM_C_API("shmem_" #N "_iput",                                                             \
             in::iput(dest, source, dst, sst, nelems, sizeof(T), pe, "shmem_" #N "_iput"));   \
  }                                                                                           \
  void shmem_##N##_iget(T* dest, const T* source, ptrdiff_t dst, ptrdiff_t sst, size_t nelems, \
                        int pe) {                                                             \
    CM_C_API("shmem_" #N "_iget",                                                             \
             in::iget(dest, source, dst, sst, nelems, sizeof(T), pe, "shmem_" #N "_iget"));   \
  }                                                                                           \
  void shmem_##N##_put_signal(T* dest, const T* source, size_t nelems, uint64_t* sig_addr,    \
                              uint64_t signal, int sig_op, int pe) {                          \
    CM_C_API("shmem_" #N "_put_signal",                                                       \
             in::put_signal(dest, source, in::array_bytes(nelems, sizeof(T)), sig_addr, signal, sig_op, pe,   \
                            false, "shmem_" #N "_put_signal"));                               \
  }                                                                                           \
  void shmem_##N##_put_signal_nbi(T* dest, const T* source, size_t nelems, uint64_t* sig_addr, \
                                  uint64_t signal, int sig_op, int pe) {                      \
    CM_C_API("shmem_" #N "_put_signal_nbi",                                                   \
             in::put_signal(dest, source, in::array_bytes(nelems, sizeof(T)), sig_addr, signal, sig_op, pe,   \
                            true, "shmem_" #N "_put_signal_nbi"));                            \
  }
CM_SHMEM_RMA_TYPES(CM_DEF_RMA)

#define CM_DEF_SIZED(S)                                                                       \
  void shmem_put##S(void* dest, const void* source, size_t nelems, int pe) {                  \
    CM_C_API("shmem_put" #S, in::put(dest, source, in::array_bytes(nelems, S / 8), pe, "shmem_put" #S));    \
  }                                                                                           \
  void shmem_get##S(void* dest, const void* source, size_t nelems, int pe) {                  \
    CM_C_API("shmem_get" #S, in::get(dest, source, in::array_bytes(nelems, S / 8), pe, "shmem_get" #S));    \
  }                                                                                           \
  void shmem_put##S##_nbi(void* dest, const void* source, size_t nelems, int pe) {            \
    CM_C_API("shmem_put" #S "_nbi",                                                           \
             in::put_nbi(dest, source, in::array_bytes(nelems, S / 8), pe, "shmem_put" #S "_nbi"));         \
  }                                                                                           \
  void shmem_get##S##_nbi(void* dest, const void* source, size_t nelems, int pe) {            \
    CM_C_API("shmem_get" #S "_nbi",                                                           \
             in::get_nbi(dest, source, in::array_bytes(nelems, S / 8), pe, "shmem_get" #S "_nbi"));         \
  }                                                                                           \
  void shmem_iput##S(void* dest, const void* source, ptrdiff_t dst, ptrdiff_t sst,            \
                     size_t nelems, int pe) {                                                 \
    CM_C_API("shmem_iput" #S,                                                                 \
             in::iput(dest, source, dst, sst, nelems, S / 8, pe, "shmem_iput" #S));           \
  }                                                                                           \
  void shmem_iget##S(void* dest, const void* source, ptrdiff_t dst, ptrdiff_t sst,            \
                     size_t nelems, int pe) {                                                 \
    CM_C_API("shmem_iget" #S,                                                                 \
             in::iget(dest, source, dst, sst, nelems, S / 8, pe, "shmem_iget" #S));           \
  }                                                                                           \
  void shmem_put##S##_signal(void* dest, const void* source, size_t nelems, uint64_t* sig_addr, \
                             uint64_t signal, int sig_op, int pe) {                           \
    CM_C_API("shmem_put" #S "_signal",                                                        \
             in::put_signal(dest, source, in::array_bytes(nelems, S / 8), sig_addr, signal, sig_op, pe,     \
                            false, "shmem_put" #S "_signal"));                                \
  }                                                                                           \
  void shmem_put##S##_signal_nbi(void* dest, const void* source, size_t nelems,               \
                                 uint64_t* sig_addr, uint64_t signal, int sig_op, int pe) {   \
    CM_C_API("shmem_put" #S "_signal_nbi",                                                    \
             in::put_signal(dest, source, in::array_bytes(nelems, S / 8), sig_addr, signal, sig_op, pe,     \
                            true, "shmem_put" #S "_signal_nbi"));                             \
  }
CM_SHMEM_SIZES(CM_DEF_SIZED)

void shmem_putmem(void* dest, const void* source, size_t nelems, int pe) {
  CM_C_API("shmem_putmem", in::put(dest, source, nelems, pe, "shmem_putmem"));
}
void shmem_getmem(void* dest, const void* source, size_t nelems, int pe) {
  CM_C_API("shmem_getmem", in::get(dest, source, nelems, pe, "shmem_getmem"));
}
void shmem_putmem_nbi(void* dest, const void* source, size_t nelems, int pe) {
  CM_C_API("shmem_putmem_nbi", in::put_nbi(dest, source, nelems, pe, "shmem_putmem_nbi"));
}
void shmem_getmem_nbi(void* dest, const void* source, size_t nelems, int pe) {
  CM_C_API("shmem_getmem_nbi", in::get_nbi(dest, source, nelems, pe, "shmem_getmem_nbi"));
}
void shmem_putmem_signal(void* dest, const void* source, size_t nelems, uint64_t* sig_addr,
                         uint64_t signal, int sig_op, int pe) {
  CM_C_API("shmem_putmem_signal", in::put_signal(dest, source, nelems, sig_addr, signal, sig_op,
                                                 pe, false, "shmem_putmem_signal"));
}
void shmem_putmem_signal_nbi(void* dest, const void* source, size_t nelems, uint64_t* sig_addr,
                             uint64_t signal, int sig_op, int pe) {
  CM_C_API("shmem_putmem_signal_nbi", in::put_signal(dest, source, nelems, sig_addr, signal,
                                                     sig_op, pe, true, "shmem_putmem_signal_nbi"));
}

}  // extern "C"
