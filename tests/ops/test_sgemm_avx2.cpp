// sgemm_avx2 against a naive double-precision reference: all transpose
// combinations, beta 0 / 1 / other, sizes around the 6x16 tile and the
// KC = 256 / NC = 1536 block edges, leading dimensions above the minimum,
// and C's padding columns left untouched.
#include "../../src/ops/gemm_engine/sgemm_avx2.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <thread>
#include <vector>

#ifdef COREMESH_HAS_SGEMM_AVX2
namespace coremesh::ops::detail {
namespace {

constexpr float kSentinel = -12345.0f;

struct Case {
  bool ta, tb;
  int64_t m, n, k;
  float beta;
  int64_t pad = 0;  // added to every leading dimension
};

std::vector<float> random_matrix(int64_t rows, int64_t ld, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(rows * ld));
  for (float& x : v) x = dist(rng);
  return v;
}

void check(const Case& t) {
  SCOPED_TRACE(::testing::Message() << "ta=" << t.ta << " tb=" << t.tb << " m=" << t.m
                                    << " n=" << t.n << " k=" << t.k << " beta=" << t.beta
                                    << " pad=" << t.pad);
  // Stored shapes: A (m,k) or (k,m); B (k,n) or (n,k).
  const int64_t a_rows = t.ta ? t.k : t.m, a_cols = t.ta ? t.m : t.k;
  const int64_t b_rows = t.tb ? t.n : t.k, b_cols = t.tb ? t.k : t.n;
  const int64_t lda = a_cols + t.pad, ldb = b_cols + t.pad, ldc = t.n + t.pad;
  const std::vector<float> a = random_matrix(a_rows, lda, 1);
  const std::vector<float> b = random_matrix(b_rows, ldb, 2);
  std::vector<float> c = random_matrix(t.m, ldc, 3);
  for (int64_t i = 0; i < t.m; ++i) {
    for (int64_t j = t.n; j < ldc; ++j) c[i * ldc + j] = kSentinel;
    // beta == 0 must not read C: a NaN there must not reach the result.
    if (t.beta == 0.0f && t.n > 0) c[i * ldc] = std::numeric_limits<float>::quiet_NaN();
  }
  const std::vector<float> c0 = c;

  sgemm_avx2(t.ta, t.tb, t.m, t.n, t.k, a.data(), lda, b.data(), ldb, t.beta, c.data(), ldc);

  auto at = [&](int64_t i, int64_t p) { return double(t.ta ? a[p * lda + i] : a[i * lda + p]); };
  auto bt = [&](int64_t p, int64_t j) { return double(t.tb ? b[j * ldb + p] : b[p * ldb + j]); };
  int64_t bad = 0;
  for (int64_t i = 0; i < t.m; ++i) {
    for (int64_t j = 0; j < ldc; ++j) {
      const float got = c[i * ldc + j];
      if (j >= t.n) {
        bad += got != kSentinel;
        continue;
      }
      double ref = 0.0, mag = 0.0;
      for (int64_t p = 0; p < t.k; ++p) {
        ref += at(i, p) * bt(p, j);
        mag += std::fabs(at(i, p) * bt(p, j));
      }
      if (t.beta != 0.0f) {
        ref += double(t.beta) * c0[i * ldc + j];
        mag += std::fabs(double(t.beta) * c0[i * ldc + j]);
      }
      // Worst-case float summation error of k FMAs plus the beta term.
      const double tol = double(t.k + 2) * 6e-8 * mag + 1e-30;
      if (!(std::fabs(got - ref) <= tol)) {
        if (++bad <= 5) ADD_FAILURE() << "c(" << i << "," << j << ") = " << got << ", want " << ref;
      }
    }
  }
  EXPECT_EQ(bad, 0);
}

TEST(OpsSgemmAvx2, SmallSizesAllTransposes) {
  const int64_t sizes[] = {1, 5, 7, 16, 17, 33};
  for (int tr = 0; tr < 4; ++tr) {
    for (int64_t m : sizes) {
      for (int64_t n : sizes) {
        for (int64_t k : sizes) {
          for (float beta : {0.0f, 1.0f}) check({bool(tr & 1), bool(tr & 2), m, n, k, beta, tr});
        }
      }
    }
  }
}

TEST(OpsSgemmAvx2, BlockEdges) {
  // (m, n, k): around 256 (KC, also a multiple of 16), M blocks of 96, K
  // spanning several KC steps with a ragged last one.
  const int64_t shapes[][3] = {{255, 256, 257}, {257, 255, 256}, {256, 257, 255}, {97, 40, 513},
                               {193, 17, 300}, {6, 16, 256}, {1, 300, 1}, {300, 1, 300}};
  for (int tr = 0; tr < 4; ++tr) {
    for (const auto& s : shapes) {
      for (float beta : {0.0f, 1.0f}) {
        for (int64_t pad : {0, 3}) check({bool(tr & 1), bool(tr & 2), s[0], s[1], s[2], beta, pad});
      }
    }
  }
}

TEST(OpsSgemmAvx2, WiderThanOnePanel) {
  // n > NC = 1536: two B panels.
  for (int tr = 0; tr < 4; ++tr) check({bool(tr & 1), bool(tr & 2), 13, 1600, 40, 1.0f, 5});
}

TEST(OpsSgemmAvx2, TrainingShapes) {
  check({false, true, 250, 768, 256, 0.0f});    // per-expert forward
  check({false, false, 250, 256, 384, 0.0f});   // per-expert dgrad
  check({true, false, 256, 384, 250, 1.0f});    // per-expert wgrad, accumulating
  check({true, false, 768, 256, 1024, 0.0f});   // wgrad
}

TEST(OpsSgemmAvx2, OtherBetaAndEmptyK) {
  check({false, false, 37, 45, 70, 0.5f, 2});
  check({true, true, 37, 45, 70, -2.0f, 2});
  check({false, true, 9, 20, 0, 0.0f, 1});   // k == 0: C = 0
  check({false, true, 9, 20, 0, 1.0f, 1});   // k == 0, beta 1: C unchanged
  check({false, true, 9, 20, 0, 3.0f, 1});   // k == 0: C scaled
}

// The sharing protocol, one step at a time: a thief takes whole pieces not
// yet started from the back, then items of the running piece from the back;
// the owner meets the thief in the middle and learns the rest was taken.
TEST(OpsRowShare, ThievesTakeFromTheBackAndTheOwnerFromTheFront) {
  RowShare share(2);
  EXPECT_EQ(share.take_back(0).piece, -1);  // nothing published yet
  share.publish(0, std::vector<GemmPiece>(3));
  RowShare::Take t = share.take_back(0);
  EXPECT_EQ(t.piece, 2);
  EXPECT_EQ(t.item, -1);
  share.open(0, 4);
  EXPECT_EQ(share.take_front(0), 0);
  EXPECT_EQ(share.take_back(0).piece, 1);  // still a whole piece
  t = share.take_back(0);                  // then items of piece 0
  EXPECT_EQ(t.piece, 0);
  EXPECT_EQ(t.item, 3);
  EXPECT_EQ(share.take_front(0), 1);
  EXPECT_EQ(share.take_front(0), 2);
  EXPECT_EQ(share.take_front(0), -1);
  EXPECT_EQ(share.advance(0), -1);  // piece 1 was taken
  EXPECT_EQ(share.take_back(0).piece, -1);
  EXPECT_EQ(share.stolen(), 3);
}

// Blocks running their GEMM pieces concurrently through a RowShare give, bit
// for bit, what each piece gives alone, however the threads interleave.
// parts[p] lists block p's pieces (m, k); same_b: every piece has the same B
// (and K). With `stalled_owner`, block 0 publishes and opens its first piece
// but never runs: block 1 alone must take all of block 0's work, whole pieces
// and items, so that the taking is proven whatever the scheduler does.
struct PieceSize {
  int64_t m, k;
};
void check_shared(bool ta, bool tb, int64_t n, float beta, const std::vector<std::vector<PieceSize>>& parts,
                  bool same_b = false, bool stalled_owner = false) {
  SCOPED_TRACE(::testing::Message() << "ta=" << ta << " tb=" << tb << " n=" << n << " beta=" << beta
                                    << " parts=" << parts.size() << " same_b=" << same_b
                                    << " stalled_owner=" << stalled_owner);
  int64_t m_all = 0, k_max = 1;
  for (const auto& list : parts)
    for (const PieceSize& p : list) m_all += p.m, k_max = std::max(k_max, p.k);
  const GemmShape shape{ta, tb, n, (ta ? m_all : k_max) + 3, (tb ? k_max : n) + 1, n + 2, beta};
  const std::vector<float> a = random_matrix(ta ? k_max : m_all, shape.lda, 1);
  std::vector<std::vector<float>> bs;
  const std::vector<float> c0 = random_matrix(m_all, shape.ldc, 3);
  std::vector<float> c = c0, want = c0;
  // Piece lists pointing into c; the expected result computed piece by piece into want.
  std::vector<std::vector<GemmPiece>> lists(parts.size());
  int64_t row = 0;
  for (size_t p = 0; p < parts.size(); ++p)
    for (const PieceSize& ps : parts[p]) {
      if (bs.empty() || !same_b) bs.push_back(random_matrix(tb ? n : ps.k, shape.ldb, 10 + bs.size()));
      const float* ap = a.data() + (ta ? row : row * shape.lda);
      lists[p].push_back({ap, bs.back().data(), c.data() + row * shape.ldc, ps.m, ps.k});
      sgemm_avx2(ta, tb, ps.m, n, ps.k, ap, shape.lda, bs.back().data(), shape.ldb, beta,
                 want.data() + row * shape.ldc, shape.ldc);
      row += ps.m;
    }
  if (stalled_owner) {
    // The first piece must be one K step of one N panel: all of it is items.
    ASSERT_EQ(parts.size(), 2u);
    RowShare share(2);
    const int64_t items = sgemm_avx2_items(shape, lists[0][0]);
    const auto whole = static_cast<int64_t>(lists[0].size()) - 1;
    share.publish(0, lists[0]);
    share.open(0, items);
    sgemm_avx2_shared(share, 1, shape, lists[1]);
    EXPECT_EQ(share.stolen(), whole + items);
    EXPECT_EQ(c, want);
    return;
  }
  for (int round = 0; round < 20; ++round) {
    c = c0;
    RowShare share(static_cast<int>(parts.size()));
    std::atomic<int> arrived{0};
    std::vector<std::thread> threads;
    for (size_t p = 0; p < parts.size(); ++p)
      threads.emplace_back([&, p] {  // start together, so that they meet
        arrived.fetch_add(1);
        while (arrived.load() < static_cast<int>(parts.size())) std::this_thread::yield();
        sgemm_avx2_shared(share, static_cast<int>(p), shape, lists[p]);
      });
    for (std::thread& t : threads) t.join();
    ASSERT_EQ(c, want) << "round " << round;
  }
}

TEST(OpsSgemmAvx2, SharedRowsAreBitIdenticalHoweverThreadsInterleave) {
  // Row ranges of one GEMM (a dense matmul over 2 or 3 cores).
  check_shared(false, true, 768, 0.0f, {{{600, 256}}, {{6, 256}}}, true);                    // one K step
  check_shared(false, false, 256, 1.0f, {{{300, 700}}, {{301, 700}}}, true);                 // several K steps
  check_shared(true, false, 256, 0.0f, {{{256, 1024}}, {{250, 1024}}, {{5, 1024}}}, true);   // transposed A
  check_shared(true, true, 3000, 0.5f, {{{97, 40}}, {{60, 40}}}, true);                      // two B panels
  check_shared(false, true, 256, 0.0f, {{{200, 256}}, {}}, true);                            // nothing of its own
}

TEST(OpsSgemmAvx2, AnIdleBlockTakesAStalledBlocksPiecesAndItems) {
  check_shared(false, true, 256, 0.0f, {{{200, 256}}, {}}, true, true);
  check_shared(true, false, 300, 1.0f, {{{130, 200}, {64, 300}, {40, 100}}, {{30, 200}}}, false, true);
  check_shared(false, false, 1536, 0.5f, {{{97, 40}, {60, 40}}, {}}, true, true);
}

TEST(OpsSgemmAvx2, SharedPiecesWithOwnOperands) {
  // Grouped GEMM: pieces with their own A, B and K; thieves take whole
  // pieces and items, packing the others' B.
  check_shared(false, true, 768, 0.0f, {{{250, 256}, {40, 256}, {130, 256}, {90, 256}}, {{60, 256}}});
  check_shared(true, false, 256, 1.0f, {{{128, 300}, {64, 0}, {128, 280}}, {{128, 280}, {0, 100}}});
  check_shared(false, false, 384, 0.0f, {{{100, 384}, {100, 384}}, {{100, 384}, {100, 384}}, {{30, 384}}});
}

}  // namespace
}  // namespace coremesh::ops::detail
#endif
