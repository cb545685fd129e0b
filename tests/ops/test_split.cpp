// detail::split_rows_by_cost: every row of every unit (zero-cost units too)
// goes to exactly one block, and the blocks' costs differ by at most `align`
// rows of the costliest unit.
#include "../../src/ops/detail/split.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <random>
#include <vector>

namespace coremesh::ops::detail {
namespace {

TEST(OpsSplit, RowsByCostCoverEveryRowOnceAndBalance) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 300; ++trial) {
    const int units = 1 + static_cast<int>(rng() % 12);
    const int64_t align = trial % 3 == 0 ? 1 : 16;
    std::vector<int64_t> rows, per_row, prefix{0};
    for (int u = 0; u < units; ++u) {
      rows.push_back(rng() % 5 == 0 ? 0 : 1 + static_cast<int64_t>(rng() % 300));
      per_row.push_back(rng() % 7 == 0 ? 0 : 1 + static_cast<int64_t>(rng() % 900));
      prefix.push_back(prefix.back() + rows.back() * per_row.back());
    }
    const int64_t step = align * *std::max_element(per_row.begin(), per_row.end());
    for (int parts = 1; parts <= 5; ++parts) {
      std::vector<std::vector<int>> owner(static_cast<size_t>(units));
      for (int u = 0; u < units; ++u) owner[size_t(u)].assign(size_t(rows[size_t(u)]), 0);
      std::vector<int64_t> cost(static_cast<size_t>(parts), 0);
      for (int part = 0; part < parts; ++part) {
        for (const UnitRows& p : split_rows_by_cost(prefix, rows, part, parts, align)) {
          ASSERT_LT(p.r0, p.r1);
          ASSERT_LE(p.r1, rows[size_t(p.unit)]);
          for (int64_t r = p.r0; r < p.r1; ++r) ++owner[size_t(p.unit)][size_t(r)];
          cost[size_t(part)] += (p.r1 - p.r0) * per_row[size_t(p.unit)];
        }
      }
      for (int u = 0; u < units; ++u)
        for (int n : owner[size_t(u)]) ASSERT_EQ(n, 1) << "trial " << trial << " unit " << u;
      const int64_t share = prefix.back() / parts;
      for (int64_t c : cost) EXPECT_LE(std::abs(c - share), step + parts) << "trial " << trial;
    }
  }
}

}  // namespace
}  // namespace coremesh::ops::detail
