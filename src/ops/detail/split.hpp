// How a kernel's blocks divide its work: balanced ranges, and ranges of
// units of unequal cost cut inside a unit by rows.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "coremesh/core/tensor.hpp"

namespace coremesh::ops::detail {

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Block `part` of `parts` over [0, n): balanced, boundaries multiple of `align`.
inline std::pair<int64_t, int64_t> split_range(int64_t n, int part, int parts, int64_t align = 1) {
  const int64_t units = (n + align - 1) / align;
  const int64_t b = units * part / parts, e = units * (part + 1) / parts;
  return {std::min(n, b * align), std::min(n, e * align)};
}

// Rows [r0, r1) of unit `unit`.
struct UnitRows {
  int64_t unit, r0, r1;
};

// Block `part` of `parts` over units of unequal cost whose cost is spread
// evenly over their rows (rows[u] rows each), given the prefix sums of the
// costs (prefix[0] = 0, prefix[u+1] = cost of units 0..u). Each boundary is
// the point of an equal share of the total cost, inside a unit, rounded to
// `align` rows: shares differ by at most `align` rows of one unit, not up to
// half a unit. Neighbouring blocks compute the same boundary, so the pieces of
// all blocks cover every row of every unit (zero-cost ones too) exactly once.
inline std::vector<UnitRows> split_rows_by_cost(const std::vector<int64_t>& prefix,
                                                const std::vector<int64_t>& rows, int part,
                                                int parts, int64_t align) {
  const int64_t units = static_cast<int64_t>(rows.size());
  auto boundary = [&](int p) -> std::pair<int64_t, int64_t> {  // (unit, row)
    if (p <= 0) return {0, 0};
    if (p >= parts) return {units, 0};
    const int64_t target = static_cast<int64_t>(static_cast<double>(prefix.back()) * p / parts);
    const int64_t u = std::upper_bound(prefix.begin(), prefix.end(), target) - prefix.begin() - 1;
    if (u >= units) return {units, 0};
    const int64_t cost = prefix[u + 1] - prefix[u];
    const double at = static_cast<double>(target - prefix[u]) * rows[u] / cost;
    return {u, std::min(rows[u], static_cast<int64_t>(at / align + 0.5) * align)};
  };
  const auto [ua, ra] = boundary(part);
  const auto [ub, rb] = boundary(part + 1);
  std::vector<UnitRows> pieces;
  for (int64_t u = ua; u <= std::min(ub, units - 1); ++u) {
    const int64_t r0 = u == ua ? ra : 0, r1 = u == ub ? rb : rows[u];
    if (r0 < r1) pieces.push_back({u, r0, r1});
  }
  return pieces;
}

// Rows of a (..., C) tensor: numel / C (C = last dimension).
inline int64_t rows_of(const Tensor& t) { return t.dim() == 0 || t.size(-1) == 0 ? 0 : t.numel() / t.size(-1); }

}  // namespace coremesh::ops::detail
