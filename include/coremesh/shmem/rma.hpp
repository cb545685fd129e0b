// One-sided communication: put/get (+ non-blocking forms completed by
// quiet()), put with signal, point-to-point waits and atomics.
//
// `dest` (put) / `src` (get) must be symmetric: from the SymmetricHeap or
// sym_malloc & co. The local side may be any memory. A PE out of range or a
// non-symmetric address raises InvalidArgument naming the call.
#pragma once

#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <type_traits>

namespace coremesh::shmem {

enum class Cmp : int { eq = 0, ne = 1, gt = 2, ge = 3, lt = 4, le = 5 };
enum class SignalOp : int { set = 0, add = 1 };

namespace detail {
void put_bytes(void* dest, const void* src, size_t bytes, int pe, bool nbi);
void get_bytes(void* dest, const void* src, size_t bytes, int pe, bool nbi);
void put_signal_bytes(void* dest, const void* src, size_t bytes, uint64_t* signal,
                      uint64_t value, SignalOp op, int pe, bool nbi);
enum class Amo : int { fetch, set, swap, compare_swap, add, band, bor, bxor };
// Atomic `op` on the sizeof-4 or -8 symmetric word `sym` at `pe`, through
// the transport; values travel as bits. Returns the old value.
uint64_t amo_bits(const void* sym, int width, int pe, Amo op, uint64_t operand, uint64_t compare,
                  const char* api);
template <typename T>
uint64_t to_bits(T v) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "atomics take 4- and 8-byte types");
  if constexpr (sizeof(T) == 4) return std::bit_cast<uint32_t>(v);
  else return std::bit_cast<uint64_t>(v);
}
template <typename T>
T from_bits(uint64_t bits) {
  if constexpr (sizeof(T) == 4) return std::bit_cast<T>(static_cast<uint32_t>(bits));
  else return std::bit_cast<T>(bits);
}
template <typename T>
T amo(const T* sym, int pe, Amo op, T operand, T compare, const char* api) {
  return from_bits<T>(amo_bits(sym, sizeof(T), pe, op, to_bits(operand), to_bits(compare), api));
}
int self();
// Sleeps until `ready()`; `sym` is the watched symmetric location (for the
// watchdog message). timeout_s < 0: COREMESH_WAIT_TIMEOUT_S.
void wait_for(const void* sym, const char* api, const std::function<bool()>& ready,
              const std::function<std::string()>& current, double timeout_s);

template <typename T>
bool compare(T value, Cmp cmp, T operand) {
  switch (cmp) {
    case Cmp::eq: return value == operand;
    case Cmp::ne: return value != operand;
    case Cmp::gt: return value > operand;
    case Cmp::ge: return value >= operand;
    case Cmp::lt: return value < operand;
    case Cmp::le: return value <= operand;
  }
  return false;
}
}  // namespace detail

template <typename T>
void put(T* dest, const T* src, size_t count, int pe) {
  detail::put_bytes(dest, src, count * sizeof(T), pe, false);
}
template <typename T>
void get(T* dest, const T* src, size_t count, int pe) {
  detail::get_bytes(dest, src, count * sizeof(T), pe, false);
}
template <typename T>
void put_nbi(T* dest, const T* src, size_t count, int pe) {
  detail::put_bytes(dest, src, count * sizeof(T), pe, true);
}
template <typename T>
void get_nbi(T* dest, const T* src, size_t count, int pe) {
  detail::get_bytes(dest, src, count * sizeof(T), pe, true);
}
template <typename T>
void p(T* dest, T value, int pe) {
  detail::put_bytes(dest, &value, sizeof(T), pe, false);
}
template <typename T>
T g(const T* src, int pe) {
  T value;
  detail::get_bytes(&value, src, sizeof(T), pe, false);
  return value;
}

// Puts `count` elements, then sets or adds `value` to the 64-bit `signal`
// on `pe`: whoever sees the signal change sees the data.
template <typename T>
void put_signal(T* dest, const T* src, size_t count, uint64_t* signal, uint64_t value,
                SignalOp op, int pe, bool nbi = false) {
  detail::put_signal_bytes(dest, src, count * sizeof(T), signal, value, op, pe, nbi);
}
uint64_t signal_fetch(const uint64_t* signal);
// Waits until `*signal cmp value` holds on this PE and returns the signal.
// timeout_s < 0: the watchdog (COREMESH_WAIT_TIMEOUT_S); on expiry a
// TimeoutError names this PE, the signal and its current value.
uint64_t signal_wait_until(uint64_t* signal, Cmp cmp, uint64_t value, double timeout_s = -1.0);

// Waits until the symmetric variable `*ivar cmp value` holds on this PE.
template <typename T>
void wait_until(T* ivar, Cmp cmp, T value, double timeout_s = -1.0) {
  std::atomic_ref<T> ref(*ivar);
  detail::wait_for(
      ivar, "wait_until", [&] { return detail::compare(ref.load(std::memory_order_acquire), cmp, value); },
      [&] { return std::to_string(ref.load()); }, timeout_s);
}
template <typename T>
bool test(T* ivar, Cmp cmp, T value) {
  return detail::compare(std::atomic_ref<T>(*ivar).load(std::memory_order_acquire), cmp, value);
}

// Atomics on symmetric `dest` at `pe`, performed by the transport (the only
// door to another PE's memory). The arithmetic and bitwise ones take
// integers; fetch/set/swap/compare_swap also take float and double.
template <typename T>
T atomic_fetch(const T* src, int pe) {
  return detail::amo(src, pe, detail::Amo::fetch, T{}, T{}, "atomic_fetch");
}
template <typename T>
void atomic_set(T* dest, T value, int pe) {
  detail::amo(dest, pe, detail::Amo::set, value, T{}, "atomic_set");
}
template <typename T>
T atomic_swap(T* dest, T value, int pe) {
  return detail::amo(dest, pe, detail::Amo::swap, value, T{}, "atomic_swap");
}
// Returns the old value, whether or not it matched.
template <typename T>
T atomic_compare_swap(T* dest, T cond, T value, int pe) {
  return detail::amo(dest, pe, detail::Amo::compare_swap, value, cond, "atomic_compare_swap");
}

enum class AtomicOp { add, band, bor, bxor };
template <AtomicOp Op, typename T>
T atomic_fetch_op(T* dest, T value, int pe) {
  static_assert(std::is_integral_v<T>, "arithmetic and bitwise atomics take integer types");
  constexpr detail::Amo amo = Op == AtomicOp::add    ? detail::Amo::add
                              : Op == AtomicOp::band ? detail::Amo::band
                              : Op == AtomicOp::bor  ? detail::Amo::bor
                                                     : detail::Amo::bxor;
  return detail::amo(dest, pe, amo, value, T{}, "atomic");
}
template <typename T>
T atomic_fetch_add(T* dest, T value, int pe) { return atomic_fetch_op<AtomicOp::add>(dest, value, pe); }
template <typename T>
void atomic_add(T* dest, T value, int pe) { atomic_fetch_op<AtomicOp::add>(dest, value, pe); }
template <typename T>
T atomic_fetch_inc(T* dest, int pe) { return atomic_fetch_op<AtomicOp::add>(dest, T{1}, pe); }
template <typename T>
void atomic_inc(T* dest, int pe) { atomic_fetch_op<AtomicOp::add>(dest, T{1}, pe); }
template <typename T>
T atomic_fetch_and(T* dest, T value, int pe) { return atomic_fetch_op<AtomicOp::band>(dest, value, pe); }
template <typename T>
T atomic_fetch_or(T* dest, T value, int pe) { return atomic_fetch_op<AtomicOp::bor>(dest, value, pe); }
template <typename T>
T atomic_fetch_xor(T* dest, T value, int pe) { return atomic_fetch_op<AtomicOp::bxor>(dest, value, pe); }

}  // namespace coremesh::shmem
