// C API: point-to-point synchronization (wait_until / test families) and
// signal waits, from the P2P type table. All waits sleep on this PE's
// doorbell and have the watchdog.
#include <cstdint>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#include "c_api.hpp"

namespace cm = coremesh::shmem;
using coremesh::shmem::capi::cmp;

namespace {

template <typename T>
bool holds(T* ivar, cm::Cmp c, T value) {
  return cm::detail::compare(std::atomic_ref<T>(*ivar).load(std::memory_order_acquire), c, value);
}

// The active indices (status[i] == 0 or no status) for which the
// comparison holds; `values` is one value or one per element.
template <typename T>
size_t scan(T* ivars, size_t n, const int* status, cm::Cmp c, const T* values, bool vector,
            size_t* indices, size_t* active) {
  size_t found = 0, live = 0;
  for (size_t i = 0; i < n; ++i) {
    if (status && status[i]) continue;
    ++live;
    if (holds(&ivars[i], c, vector ? values[i] : values[0])) {
      if (indices) indices[found] = i;
      ++found;
    }
  }
  *active = live;
  return found;
}

enum class Mode { all, any, some };

// The index an `any` call returns among the satisfied ones (ascending): a
// series of calls must eventually return each index that stays satisfied
// (9.10), so each call takes the first at or after the last call's + 1 on
// the same array (a cursor per array: alternating arrays starve none).
size_t pick_any(const void* ivars, const std::vector<size_t>& found, size_t hits) {
  thread_local std::unordered_map<const void*, size_t> cursors;
  size_t& after = cursors[ivars];
  size_t pick = found[0];
  for (size_t i = 0; i < hits; ++i)
    if (found[i] >= after) {
      pick = found[i];
      break;
    }
  after = pick + 1;
  return pick;
}

// Waits as wait_until_{all,any,some}[_vector] do; returns the count found
// (some), the index found (any, SIZE_MAX if nothing is active), or 0 (all).
template <typename T>
size_t wait_set(T* ivars, size_t n, const int* status, int cmp_value, const T* values,
                bool vector, size_t* indices, Mode mode, const char* api) {
  const cm::Cmp c = cmp(cmp_value, api);
  CM_CHECK(mode != Mode::some || indices != nullptr || n == 0, "pass an array of n size_t for the indices",
           "{}: indices is NULL", api);
  size_t result = 0;
  std::vector<size_t> found(n);
  auto ready = [&] {
    size_t active = 0;
    const size_t hits = scan(ivars, n, status, c, values, vector, found.data(), &active);
    if (active == 0) {
      result = mode == Mode::any ? SIZE_MAX : 0;
      return true;
    }
    if (mode == Mode::all) return hits == active;
    if (hits == 0) return false;
    if (mode == Mode::any) result = pick_any(ivars, found, hits);
    else {
      for (size_t i = 0; i < hits; ++i) indices[i] = found[i];
      result = hits;
    }
    return true;
  };
  cm::detail::wait_for(ivars, api, ready, [&] { return fmt::format("{} elements", n); }, -1.0);
  return result;
}

template <typename T>
size_t test_set(T* ivars, size_t n, const int* status, int cmp_value, const T* values,
                bool vector, size_t* indices, Mode mode, const char* api) {
  const cm::Cmp c = cmp(cmp_value, api);
  std::vector<size_t> found(n);
  size_t active = 0;
  const size_t hits = scan(ivars, n, status, c, values, vector, found.data(), &active);
  if (mode == Mode::all) return active == 0 || hits == active;
  if (hits == 0) return mode == Mode::any ? SIZE_MAX : 0;
  if (mode == Mode::any) return pick_any(ivars, found, hits);
  for (size_t i = 0; i < hits; ++i) indices[i] = found[i];
  return hits;
}

}  // namespace

extern "C" {

#define CM_DEF_P2P(T, N)                                                                        \
  void shmem_##N##_wait_until(T* ivar, int c, T value) {                                        \
    CM_C_API("shmem_" #N "_wait_until", cm::wait_until(ivar, cmp(c, "shmem_wait_until"), value)); \
  }                                                                                             \
  void shmem_##N##_wait_until_all(T* ivars, size_t n, const int* status, int c, T value) {      \
    CM_C_API("shmem_" #N "_wait_until_all",                                                     \
             wait_set(ivars, n, status, c, &value, false, nullptr, Mode::all, "shmem_wait_until_all")); \
  }                                                                                             \
  size_t shmem_##N##_wait_until_any(T* ivars, size_t n, const int* status, int c, T value) {    \
    CM_C_API("shmem_" #N "_wait_until_any",                                                     \
             return wait_set(ivars, n, status, c, &value, false, nullptr, Mode::any, "shmem_wait_until_any")); \
  }                                                                                             \
  size_t shmem_##N##_wait_until_some(T* ivars, size_t n, size_t* indices, const int* status,    \
                                     int c, T value) {                                          \
    CM_C_API("shmem_" #N "_wait_until_some",                                                    \
             return wait_set(ivars, n, status, c, &value, false, indices, Mode::some, "shmem_wait_until_some")); \
  }                                                                                             \
  void shmem_##N##_wait_until_all_vector(T* ivars, size_t n, const int* status, int c, T* values) { \
    CM_C_API("shmem_" #N "_wait_until_all_vector",                                              \
             wait_set(ivars, n, status, c, values, true, nullptr, Mode::all, "shmem_wait_until_all_vector")); \
  }                                                                                             \
  size_t shmem_##N##_wait_until_any_vector(T* ivars, size_t n, const int* status, int c,        \
                                           T* values) {                                         \
    CM_C_API("shmem_" #N "_wait_until_any_vector",                                              \
             return wait_set(ivars, n, status, c, values, true, nullptr, Mode::any, "shmem_wait_until_any_vector")); \
  }                                                                                             \
  size_t shmem_##N##_wait_until_some_vector(T* ivars, size_t n, size_t* indices,                \
                                            const int* status, int c, T* values) {              \
    CM_C_API("shmem_" #N "_wait_until_some_vector",                                             \
             return wait_set(ivars, n, status, c, values, true, indices, Mode::some, "shmem_wait_until_some_vector")); \
  }                                                                                             \
  int shmem_##N##_test(T* ivar, int c, T value) {                                               \
    CM_C_API("shmem_" #N "_test", return holds(ivar, cmp(c, "shmem_test"), value) ? 1 : 0);     \
  }                                                                                             \
  int shmem_##N##_test_all(T* ivars, size_t n, const int* status, int c, T value) {             \
    CM_C_API("shmem_" #N "_test_all",                                                           \
             return static_cast<int>(test_set(ivars, n, status, c, &value, false, nullptr, Mode::all, "shmem_test_all"))); \
  }                                                                                             \
  size_t shmem_##N##_test_any(T* ivars, size_t n, const int* status, int c, T value) {          \
    CM_C_API("shmem_" #N "_test_any",                                                           \
             return test_set(ivars, n, status, c, &value, false, nullptr, Mode::any, "shmem_test_any")); \
  }                                                                                             \
  size_t shmem_##N##_test_some(T* ivars, size_t n, size_t* indices, const int* status, int c,   \
                               T value) {                                                       \
    CM_C_API("shmem_" #N "_test_some",                                                          \
             return test_set(ivars, n, status, c, &value, false, indices, Mode::some, "shmem_test_some")); \
  }                                                                                             \
  int shmem_##N##_test_all_vector(T* ivars, size_t n, const int* status, int c, T* values) {    \
    CM_C_API("shmem_" #N "_test_all_vector",                                                    \
             return static_cast<int>(test_set(ivars, n, status, c, values, true, nullptr, Mode::all, "shmem_test_all_vector"))); \
  }                                                                                             \
  size_t shmem_##N##_test_any_vector(T* ivars, size_t n, const int* status, int c, T* values) { \
    CM_C_API("shmem_" #N "_test_any_vector",                                                    \
             return test_set(ivars, n, status, c, values, true, nullptr, Mode::any, "shmem_test_any_vector")); \
  }                                                                                             \
  size_t shmem_##N##_test_some_vector(T* ivars, size_t n, size_t* indices, const int* status,   \
                                      int c, T* values) {                                       \
    CM_C_API("shmem_" #N "_test_some_vector",                                                   \
             return test_set(ivars, n, status, c, values, true, indices, Mode::some, "shmem_test_some_vector")); \
  }
CM_SHMEM_P2P_TYPES(CM_DEF_P2P)

uint64_t shmem_signal_fetch(const uint64_t* sig_addr) {
  CM_C_API("shmem_signal_fetch", return cm::signal_fetch(sig_addr));
}
uint64_t shmem_signal_wait_until(uint64_t* sig_addr, int c, uint64_t cmp_value) {
  CM_C_API("shmem_signal_wait_until",
           return cm::signal_wait_until(sig_addr, cmp(c, "shmem_signal_wait_until"), cmp_value));
}

}  // extern "C"
