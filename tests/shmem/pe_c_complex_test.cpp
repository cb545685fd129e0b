// The C API's complex reductions from C++ (issue 34, item 7): OpenSHMEM
// 1.5, 9.9.10, Table 10 lists double _Complex and float _Complex for sum
// and prod (shmem_complexd_sum_reduce, ..., and the deprecated
// shmem_complexd_sum_to_all). A C++ program may hold them as std::complex
// or as GCC's complex types (`double _Complex`, `__complex__ float`): both
// compile and give the same result.
#include <gtest/gtest.h>

#include <complex>

#include "coremesh/shmem/shmem.hpp"
#include "shmem.h"

namespace shmem = coremesh::shmem;

namespace {
constexpr int kN = 4;
__extension__ typedef _Complex double gnu_complexd;
__extension__ typedef _Complex float gnu_complexf;
gnu_complexd g_d_src[kN], g_d_dst[kN], g_d_wrk[SHMEM_REDUCE_MIN_WRKDATA_SIZE];
gnu_complexf g_f_src[kN], g_f_dst[kN], g_f_wrk[SHMEM_REDUCE_MIN_WRKDATA_SIZE];
std::complex<double> g_s_src[kN], g_s_dst[kN];
long g_psync[SHMEM_REDUCE_SYNC_SIZE];

// PE p contributes (1 + p % 3) + i.
std::complex<double> value(int pe) { return {1.0 + pe % 3, 1.0}; }
}  // namespace

TEST(CComplexFromCxx, GnuAndStdComplexSumAndProd) {
  const int me = shmem::my_pe(), npes = shmem::n_pes();
  std::complex<double> sum = 0, prod = 1;
  for (int p = 0; p < npes; ++p) sum += value(p), prod *= value(p);
  for (int i = 0; i < kN; ++i) {
    __real__ g_d_src[i] = value(me).real();
    __imag__ g_d_src[i] = value(me).imag();
    __real__ g_f_src[i] = static_cast<float>(value(me).real());
    __imag__ g_f_src[i] = static_cast<float>(value(me).imag());
    g_s_src[i] = value(me);
  }
  EXPECT_EQ(shmem_complexd_sum_reduce(SHMEM_TEAM_WORLD, g_d_dst, g_d_src, kN), 0);
  EXPECT_EQ(__real__ g_d_dst[kN - 1], sum.real());
  EXPECT_EQ(__imag__ g_d_dst[kN - 1], sum.imag());
  EXPECT_EQ(shmem_complexd_prod_reduce(SHMEM_TEAM_WORLD, g_d_dst, g_d_src, kN), 0);
  EXPECT_NEAR(__real__ g_d_dst[0], prod.real(), 1e-9 * std::abs(prod));
  EXPECT_NEAR(__imag__ g_d_dst[0], prod.imag(), 1e-9 * std::abs(prod));
  EXPECT_EQ(shmem_complexf_sum_reduce(SHMEM_TEAM_WORLD, g_f_dst, g_f_src, kN), 0);
  EXPECT_EQ(__real__ g_f_dst[1], static_cast<float>(sum.real()));
  EXPECT_EQ(shmem_complexf_prod_reduce(SHMEM_TEAM_WORLD, g_f_dst, g_f_src, kN), 0);
  EXPECT_NEAR(__imag__ g_f_dst[2], prod.imag(), 1e-4 * std::abs(prod));
  // std::complex still works, and agrees with the GCC type bit for bit.
  EXPECT_EQ(shmem_complexd_sum_reduce(SHMEM_TEAM_WORLD, g_s_dst, g_s_src, kN), 0);
  EXPECT_EQ(g_s_dst[3], sum);
  // The deprecated active-set forms, over the world.
  for (long& v : g_psync) v = SHMEM_SYNC_VALUE;
  shmem_barrier_all();
  shmem_complexd_sum_to_all(g_d_dst, g_d_src, kN, 0, 0, npes, g_d_wrk, g_psync);
  EXPECT_EQ(__real__ g_d_dst[2], sum.real());
  shmem_barrier_all();
  shmem_complexf_prod_to_all(g_f_dst, g_f_src, kN, 0, 0, npes, g_f_wrk, g_psync);
  EXPECT_NEAR(__real__ g_f_dst[3], prod.real(), 1e-4 * std::abs(prod));
  shmem_barrier_all();
}
