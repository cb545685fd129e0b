// Rng: a small, fully specified random generator (SplitMix64 state update,
// Box-Muller normals) so that initialization and data order are the same on
// every platform and standard library, and the state is one u64 that a
// checkpoint can save.
#pragma once

#include <cmath>
#include <cstdint>

namespace coremesh::model {

class Rng {
 public:
  explicit Rng(uint64_t seed = 0) : state_(seed) {}

  uint64_t next_u64() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1) with 24 random bits.
  float uniform() { return float(next_u64() >> 40) * (1.0f / 16777216.0f); }
  // Uniform integer in [0, n) (Lemire's multiply-shift; n > 0).
  uint64_t below(uint64_t n) { return uint64_t((__uint128_t(next_u64()) * n) >> 64); }
  // Standard normal (Box-Muller; uses two uniforms per value, no caching so
  // that the state alone determines the stream).
  float normal() {
    double u1 = (double(next_u64() >> 11) + 1.0) * (1.0 / 9007199254740992.0);  // (0, 1]
    double u2 = double(next_u64() >> 11) * (1.0 / 9007199254740992.0);
    return float(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }

  // Skips n draws of next_u64() (normal() makes two) in O(1).
  void skip(uint64_t n) { state_ += n * 0x9e3779b97f4a7c15ULL; }

  uint64_t state() const { return state_; }
  void set_state(uint64_t s) { state_ = s; }

 private:
  uint64_t state_;
};

}  // namespace coremesh::model
