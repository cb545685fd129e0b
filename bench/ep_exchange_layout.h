/* ep_exchange_layout.h: what each PE sends in the expert-parallel exchange
 * benchmark, shared by its coremesh side (ep_exchange.cpp, ShmemExperts) and
 * its MPI side (ep_exchange_mpi.c, MPI_Alltoallv) so both move the same rows.
 *
 * The demo model's layout: per PE 8 x 128 tokens of width 256, top-2 of 8
 * experts chosen by i.i.d. random router logits (a router at initialization:
 * balanced in expectation, with the multinomial spread of real routing).
 * Rows are grouped by expert, token order inside one, as the MoE layer hands
 * them to its dispatcher. Token t of PE p carries p * 4096 + t + c / 512 in
 * column c (exact in f32), so a row in the wrong place changes the checksum. */
#ifndef COREMESH_BENCH_EP_EXCHANGE_LAYOUT_H
#define COREMESH_BENCH_EP_EXCHANGE_LAYOUT_H

#include <stdint.h>

enum { EPX_TOKENS = 8 * 128, EPX_WIDTH = 256, EPX_EXPERTS = 8, EPX_TOP_K = 2 };
enum { EPX_ROWS = EPX_TOKENS * EPX_TOP_K };  /* rows one PE sends */

static inline uint64_t epx_random(uint64_t* state) { /* splitmix64 */
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* offsets: EPX_EXPERTS + 1 row offsets per expert; rows: EPX_ROWS x EPX_WIDTH. */
static inline void epx_make(int pe, int64_t* offsets, float* rows) {
  static unsigned char picked[EPX_TOKENS][EPX_EXPERTS];
  uint64_t state = 12345u + 7919u * (uint64_t)pe;
  for (int t = 0; t < EPX_TOKENS; ++t) {
    uint64_t logit[EPX_EXPERTS];
    for (int e = 0; e < EPX_EXPERTS; ++e) logit[e] = epx_random(&state), picked[t][e] = 0;
    for (int k = 0; k < EPX_TOP_K; ++k) {
      int best = -1;
      for (int e = 0; e < EPX_EXPERTS; ++e)
        if (!picked[t][e] && (best < 0 || logit[e] > logit[best])) best = e;
      picked[t][best] = 1;
    }
  }
  int64_t row = 0;
  for (int e = 0; e < EPX_EXPERTS; ++e) {
    offsets[e] = row;
    for (int t = 0; t < EPX_TOKENS; ++t) {
      if (!picked[t][e]) continue;
      for (int c = 0; c < EPX_WIDTH; ++c) rows[row * EPX_WIDTH + c] = (float)(pe * 4096 + t) + (float)c / 512.0f;
      ++row;
    }
  }
  offsets[EPX_EXPERTS] = row;
}

/* Position-weighted sum: the same rows in another order give another value. */
static inline double epx_checksum(const float* v, int64_t n) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += (double)v[i] * (double)(1 + i % 1021);
  return sum;
}

#endif
