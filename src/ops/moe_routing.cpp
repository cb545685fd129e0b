// MoE routing kernels. Notation: T tokens, E experts, k per token, C hidden.
// Per-token kernels split tokens over blocks; per-expert kernels split experts
// (each expert scans the (T,k) assignments, so no two blocks write one slot).
#include "coremesh/ops/moe_routing.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "coremesh/ops/activation.hpp"
#include "detail/checks.hpp"
#include "detail/launch.hpp"
#include "detail/vec_math.hpp"

namespace coremesh::ops {
namespace {

constexpr auto kVector = detail::KernelKind::vector;

// A caller-given output: contiguous f32 of the op's output shape.
void check_output(const Tensor& out, const Shape& shape, const char* op) {
  CM_CHECK(out.dtype() == DType::f32 && out.is_contiguous() && out.shape() == shape,
           "pass a contiguous f32 tensor of the output's shape, or none", "{}: out is {}, the output is ({}) f32", op,
           out.describe(), fmt::join(shape, ", "));
}

void check_scores(const Tensor& s, const char* what) {
  detail::check_contiguous(s, what);
  detail::check_dtype(s, DType::f32, what);
  CM_CHECK(s.dim() == 2, "pass (T,E) scores", "{} must be (T,E), got {}", what, s.describe());
}

void check_indices(const Tensor& idx) {
  detail::check_contiguous(idx, "indices");
  detail::check_dtype(idx, DType::i32, "indices");
  CM_CHECK(idx.dim() == 2, "pass (T,k) indices", "indices must be (T,k), got {}", idx.describe());
}

// Expert id of an assignment, checked against E (-1 passes through).
int64_t expert_at(const int32_t* idx, int64_t i, int64_t E) {
  const int64_t e = idx[i];
  CM_CHECK(e >= -1 && e < E, "expert ids must be in [0, E) or -1", "expert id {} at {} for E={}", e, i, E);
  return e;
}

// permute's (T,k) row_of (i64) and the (R,C) f32 rows it points into.
void check_rows(const Tensor& row_of, const Tensor& rows, const char* what) {
  detail::check_contiguous(row_of, "row_of");
  detail::check_dtype(row_of, DType::i64, "row_of");
  CM_CHECK(row_of.dim() == 2, "pass permute's (T,k) row_of", "row_of must be (T,k), got {}", row_of.describe());
  detail::check_contiguous(rows, what);
  detail::check_dtype(rows, DType::f32, what);
  CM_CHECK(rows.dim() == 2, "pass (rows, C) rows", "{} must be (rows, C), got {}", what, rows.describe());
}

// Row of assignment i, checked against the R rows (-1: dropped, passes through).
int64_t row_at(const Tensor& row_of, int64_t i, int64_t R) {
  const int64_t row = row_of.data<int64_t>()[i];
  CM_CHECK(row >= -1 && row < R, "pass the row_of that permute returned with these rows",
           "row_of[{}] = {} for {} rows", i, row, R);
  return row;
}

}  // namespace

Tensor router_scores(const Tensor& logits, ScoreFunc func) {
  check_scores(logits, "logits");
  if (func == ScoreFunc::softmax) return softmax(logits);
  Tensor s = Tensor::empty(logits.shape());
  detail::launch_rows("router_sigmoid", kVector, {logits.shape()}, {DType::f32}, "", {{logits}, {s}},
                      detail::rows_of(logits), logits.size(1), [logits, s](int64_t r0, int64_t r1) {
                        const int64_t E = logits.size(1);
                        for (int64_t i = r0 * E; i < r1 * E; ++i)
                          s.data<float>()[i] = 1.0f / (1.0f + detail::fast_exp(-logits.data<float>()[i]));
                      });
  return s;
}

// softmax: dl = s (ds - sum ds s);  sigmoid: dl = ds s (1 - s)
Tensor router_scores_backward(const Tensor& dscores, const Tensor& scores, ScoreFunc func) {
  check_scores(scores, "scores");
  detail::check_shape(dscores, scores.shape(), "dscores");
  if (func == ScoreFunc::softmax) return softmax_backward(dscores, scores);
  Tensor d = Tensor::empty(scores.shape());
  detail::launch_rows("router_sigmoid_backward", kVector, {scores.shape()}, {DType::f32}, "",
                      {{dscores, scores}, {d}}, detail::rows_of(scores), scores.size(1), [dscores, scores, d](int64_t r0, int64_t r1) {
                        const int64_t E = scores.size(1);
                        for (int64_t i = r0 * E; i < r1 * E; ++i) {
                          const float s = scores.data<float>()[i];
                          d.data<float>()[i] = dscores.data<float>()[i] * s * (1.0f - s);
                        }
                      });
  return d;
}

Routing topk_route(const Tensor& scores, const Tensor& bias, const TopKConfig& cfg) {
  check_scores(scores, "scores");
  const int64_t T = scores.size(0), E = scores.size(1);
  CM_CHECK(cfg.k >= 1 && cfg.k <= E, "use 1 <= k <= E", "top-k with k={} of E={}", cfg.k, E);
  CM_CHECK(cfg.n_groups >= 1 && E % cfg.n_groups == 0 && cfg.topk_groups >= 1 &&
               cfg.topk_groups <= cfg.n_groups && cfg.k <= cfg.topk_groups * (E / cfg.n_groups),
           "n_groups must divide E, 1 <= topk_groups <= n_groups, and the kept groups must hold k experts",
           "E={} n_groups={} topk_groups={} k={}", E, cfg.n_groups, cfg.topk_groups, cfg.k);
  if (bias.defined()) {
    detail::check_shape(bias, {E}, "bias");
    detail::check_dtype(bias, DType::f32, "bias");
  }
  Routing r{Tensor::empty({T, cfg.k}, DType::i32), Tensor::empty({T, cfg.k})};
  Tensor idx = r.indices, w = r.weights;
  detail::launch_rows(
      "topk_route", kVector, {scores.shape()}, {DType::f32},
      fmt::format("k={};g={};tg={};renorm={};bias={}", cfg.k, cfg.n_groups, cfg.topk_groups, cfg.renorm, bias.defined()),
      {bias.defined() ? std::vector<Tensor>{scores, bias} : std::vector<Tensor>{scores}, {idx, w}}, T, E * 4, [scores, bias, idx, w, cfg, E](int64_t t0, int64_t t1) {
        const int64_t G = cfg.n_groups, per = E / G, k = cfg.k;
        std::vector<float> sel(static_cast<size_t>(E));
        std::vector<int64_t> order(static_cast<size_t>(std::max(E, G)));
        std::vector<float> gscore(static_cast<size_t>(G));
        for (int64_t t = t0; t < t1; ++t) {
          const float* s = scores.data<float>() + t * E;
          for (int64_t e = 0; e < E; ++e) sel[e] = s[e] + (bias.defined() ? bias.data<float>()[e] : 0.0f);
          if (G > 1) {  // group score: sum of the group's top-2 (max if the group has one expert)
            for (int64_t g = 0; g < G; ++g) {
              float a = -INFINITY, b = -INFINITY;
              for (int64_t e = g * per; e < (g + 1) * per; ++e) {
                if (sel[e] > a) b = a, a = sel[e];
                else if (sel[e] > b) b = sel[e];
              }
              gscore[g] = per >= 2 ? a + b : a;
            }
            std::iota(order.begin(), order.begin() + G, 0);
            std::stable_sort(order.begin(), order.begin() + G,
                             [&](int64_t x, int64_t y) { return gscore[x] > gscore[y]; });
            for (int64_t i = cfg.topk_groups; i < G; ++i)  // mask dropped groups
              for (int64_t e = order[i] * per; e < (order[i] + 1) * per; ++e) sel[e] = -INFINITY;
          }
          std::iota(order.begin(), order.begin() + E, 0);
          std::partial_sort(order.begin(), order.begin() + k, order.begin() + E, [&](int64_t x, int64_t y) {
            return sel[x] > sel[y] || (sel[x] == sel[y] && x < y);
          });
          float sum = 0.0f;
          for (int64_t j = 0; j < k; ++j) sum += s[order[j]];
          const float norm = cfg.renorm ? cfg.route_scale / (sum + 1e-20f) : cfg.route_scale;
          for (int64_t j = 0; j < k; ++j) {
            idx.data<int32_t>()[t * k + j] = static_cast<int32_t>(order[j]);
            w.data<float>()[t * k + j] = s[order[j]] * norm;
          }
        }
      });
  return r;
}

// w_j = c s_j / Z (renorm, Z = sum_i s_i over the selected) or c s_j:
//   ds_j = c (dw_j / Z - sum_i dw_i s_i / Z^2)   or   ds_j = c dw_j
Tensor topk_route_backward(const Tensor& dweights, const Tensor& scores, const Routing& routing,
                           const TopKConfig& cfg) {
  check_scores(scores, "scores");
  check_indices(routing.indices);
  const int64_t T = scores.size(0), E = scores.size(1), k = routing.indices.size(1);
  detail::check_shape(routing.indices, {T, k}, "indices");
  detail::check_shape(dweights, {T, k}, "dweights");
  detail::check_dtype(dweights, DType::f32, "dweights");
  detail::check_contiguous(dweights, "dweights");
  Tensor ds = Tensor::empty({T, E});
  Tensor idx = routing.indices;
  detail::launch_rows("topk_route_backward", kVector, {scores.shape()}, {DType::f32},
                      fmt::format("k={};renorm={}", k, cfg.renorm), {{dweights, scores, idx}, {ds}}, T, E,
                      [dweights, scores, idx, ds, cfg, E, k](int64_t t0, int64_t t1) {
                        for (int64_t t = t0; t < t1; ++t) {
                          const float* s = scores.data<float>() + t * E;
                          const int32_t* ix = idx.data<int32_t>() + t * k;
                          const float* dw = dweights.data<float>() + t * k;
                          float* out = ds.data<float>() + t * E;
                          std::fill(out, out + E, 0.0f);
                          float Z = 0.0f, dot = 0.0f;
                          for (int64_t j = 0; j < k; ++j)
                            if (expert_at(ix, j, E) >= 0) Z += s[ix[j]], dot += dw[j] * s[ix[j]];
                          for (int64_t j = 0; j < k; ++j) {
                            if (ix[j] < 0) continue;
                            out[ix[j]] += cfg.renorm ? cfg.route_scale * (dw[j] / (Z + 1e-20f) - dot / ((Z + 1e-20f) * (Z + 1e-20f)))
                                                     : cfg.route_scale * dw[j];
                          }
                        }
                      });
  return ds;
}

Tensor expert_counts(const Tensor& indices, int64_t E) {
  check_indices(indices);
  Tensor counts = Tensor::empty({E}, DType::i64);
  const int64_t n = indices.numel();
  detail::launch_rows("expert_counts", kVector, {indices.shape()}, {DType::i32}, fmt::format("E={}", E),
                      {{indices}, {counts}}, E, n, [indices, counts, n, E](int64_t e0, int64_t e1) {
                        const int32_t* ix = indices.data<int32_t>();
                        int64_t* c = counts.data<int64_t>();
                        std::fill(c + e0, c + e1, 0);
                        for (int64_t i = 0; i < n; ++i) {
                          const int64_t e = expert_at(ix, i, E);
                          if (e >= e0 && e < e1) ++c[e];
                        }
                      });
  return counts;
}

namespace {

// The bias shift that moves |mean - count| of expert e's selections across
// its selection edge: its margin bins walked outward from the edge (linear
// within a bin). `hist` is e's (2, kMarginBins) block.
double balancing_shift(double count, double mean, const int64_t* hist) {
  const double need = std::abs(mean - count);
  const bool raise = mean > count;
  const int64_t* side = hist + (raise ? kMarginBins : 0);
  double seen = 0, far = 0;
  for (int b = 0; b < kMarginBins && need > 0; ++b) {
    const double lo = margin_bin_edge(b), hi = b + 1 < kMarginBins ? margin_bin_edge(b + 1) : lo * std::sqrt(2.0);
    if (side[b] == 0) continue;
    far = hi;
    if (seen + double(side[b]) >= need) {
      far = lo + (hi - lo) * (need - seen) / double(side[b]);
      break;
    }
    seen += double(side[b]);
  }
  return raise ? far : -far;
}

}  // namespace

void update_expert_bias(const Tensor& bias, const Tensor& counts, float rate, BiasUpdate mode, const Tensor& margins) {
  detail::check_contiguous(bias, "bias");
  detail::check_dtype(bias, DType::f32, "bias");
  detail::check_dtype(counts, DType::i64, "counts");
  detail::check_shape(counts, bias.shape(), "counts");
  const int64_t E = bias.numel();
  std::vector<Tensor> inputs{bias, counts};
  if (mode == BiasUpdate::margin) {
    CM_CHECK(margins.defined(), "pass the step's selection margins (accumulate_selection_margins) to the margin update",
             "update_expert_bias(margin) without margins");
    detail::check_contiguous(margins, "margins");
    detail::check_dtype(margins, DType::i64, "margins");
    detail::check_shape(margins, {E, 2, kMarginBins}, "margins");
    inputs.push_back(margins);
  }
  detail::launch_rows("update_expert_bias", kVector, {bias.shape()}, {DType::f32}, "", {inputs, {bias}}, E, E,
                      [bias, counts, margins, rate, mode, E](int64_t e0, int64_t e1) {
                        const int64_t* c = counts.data<int64_t>();
                        double mean = 0;
                        for (int64_t e = 0; e < E; ++e) mean += double(c[e]);
                        mean /= double(E);
                        for (int64_t e = e0; e < e1; ++e) {
                          const double err = mean - double(c[e]);  // > 0: underloaded, raise its bias
                          double step = 0;
                          if (mode == BiasUpdate::sign) step = double((err > 0) - (err < 0));
                          else if (mode == BiasUpdate::proportional) step = mean > 0 ? err / mean : 0.0;
                          else step = balancing_shift(double(c[e]), mean, margins.data<int64_t>() + e * 2 * kMarginBins);
                          bias.data<float>()[e] += rate * static_cast<float>(step);
                        }
                      });
}

// Pass 1 per expert e: f_e, P_e, the column dscores[:,e] = alpha E f_e / T and
// the term f_e P_e; pass 2 (one block) sums the terms in expert order.
AuxLoss switch_aux_loss(const Tensor& scores, const Tensor& indices, int64_t E, float alpha) {
  check_scores(scores, "scores");
  check_indices(indices);
  const int64_t T = scores.size(0), k = indices.size(1);
  CM_CHECK(scores.size(1) == E && indices.size(0) == T, "scores (T,E) and indices (T,k) must agree",
           "scores {} indices {} E={}", scores.describe(), indices.describe(), E);
  AuxLoss out{Tensor::empty({1}), Tensor::empty({T, E})};
  Tensor terms = Tensor::empty({E}), loss = out.loss, ds = out.dscores;
  detail::launch_rows("switch_aux_loss", kVector, {scores.shape()}, {DType::f32}, fmt::format("k={}", k),
                      {{scores, indices}, {terms, ds}}, E, T * (k + 1), [scores, indices, terms, ds, T, E, k, alpha](int64_t e0, int64_t e1) {
                        const int32_t* ix = indices.data<int32_t>();
                        for (int64_t e = e0; e < e1; ++e) {
                          int64_t count = 0;
                          double P = 0;
                          for (int64_t i = 0; i < T * k; ++i) count += expert_at(ix, i, E) == e;
                          for (int64_t t = 0; t < T; ++t) P += scores.data<float>()[t * E + e];
                          const double f = (T * k != 0) ? double(count) / double(T * k) : 0.0;
                          P = T ? P / double(T) : 0.0;
                          terms.data<float>()[e] = static_cast<float>(f * P);
                          const float g = T ? static_cast<float>(alpha * double(E) * f / double(T)) : 0.0f;
                          for (int64_t t = 0; t < T; ++t) ds.data<float>()[t * E + e] = g;
                        }
                      });
  detail::Plan plan = detail::plan("switch_aux_loss_total", kVector, {{E}}, {DType::f32}, "",
                                   [](int) { return detail::Tiling{}; });
  detail::launch(std::move(plan), {{terms}, {loss}}, [terms, loss, E, alpha](const detail::BlockContext&) {
    double s = 0;
    for (int64_t e = 0; e < E; ++e) s += terms.data<float>()[e];
    loss.data<float>()[0] = static_cast<float>(alpha * double(E) * s);
  });
  return out;
}

int64_t expert_capacity(int64_t tokens, int64_t k, int64_t E, float factor) {
  CM_CHECK(E > 0 && factor > 0 && std::isfinite(factor) && tokens >= 0 && k >= 1,
           "use tokens >= 0, k >= 1, E > 0 and a finite positive capacity factor", "tokens={} k={} E={} factor={}",
           tokens, k, E, factor);
  return static_cast<int64_t>(std::ceil(double(factor) * double(tokens * k) / double(E)));
}

// Block b owns experts [e0, e1) and writes exactly the output slots whose
// input expert is among them (block 0 also copies the already-dropped ones),
// so every slot is written once and no host-side copy is needed.
Routing apply_capacity(const Routing& routing, int64_t E, int64_t capacity, DropPolicy policy) {
  check_indices(routing.indices);
  detail::check_shape(routing.weights, routing.indices.shape(), "weights");
  CM_CHECK(capacity >= 0 && E > 0, "use E > 0 experts and a capacity >= 0", "E={} capacity={}", E, capacity);
  Routing out{Tensor::empty(routing.indices.shape(), DType::i32), Tensor::empty(routing.weights.shape())};
  const int64_t n = routing.indices.numel();
  Tensor in_idx = routing.indices, in_w = routing.weights, idx = out.indices, w = out.weights;
  detail::launch_rows("apply_capacity", kVector, {idx.shape()}, {DType::i32},
                      fmt::format("E={};cap={};policy={}", E, capacity, static_cast<int>(policy)),
                      {{in_idx, in_w}, {idx, w}}, E, n,
                      [in_idx, in_w, idx, w, E, n, capacity, policy](int64_t e0, int64_t e1) {
                        const int32_t* ix = in_idx.data<int32_t>();
                        const float* wt = in_w.data<float>();
                        std::vector<int64_t> mine;
                        for (int64_t e = (e0 == 0 ? -1 : e0); e < e1; ++e) {
                          mine.clear();
                          for (int64_t i = 0; i < n; ++i)
                            if (expert_at(ix, i, E) == e) mine.push_back(i);
                          if (e >= 0 && policy == DropPolicy::probability)  // highest weight first, then position
                            std::stable_sort(mine.begin(), mine.end(),
                                             [&](int64_t a, int64_t b) { return wt[a] > wt[b]; });
                          for (size_t j = 0; j < mine.size(); ++j) {
                            const bool keep = e >= 0 && static_cast<int64_t>(j) < capacity;
                            idx.data<int32_t>()[mine[j]] = keep ? static_cast<int32_t>(e) : -1;
                            w.data<float>()[mine[j]] = keep ? wt[mine[j]] : 0.0f;
                          }
                        }
                      });
  return out;
}

// Pass 1 (one block, O(T k + E)): counting sort of the assignments by expert,
// stable in token order -> offsets, row_of. Pass 2 (tokens split): copies.
Permutation permute(const Tensor& x, const Tensor& indices, int64_t E, const Tensor& out) {
  detail::check_contiguous(x, "x");
  detail::check_dtype(x, DType::f32, "x");
  check_indices(indices);
  CM_CHECK(E > 0, "pass the number of experts (> 0)", "permute over E={} experts", E);
  const int64_t T = indices.size(0), k = indices.size(1);
  CM_CHECK(x.dim() == 2 && x.size(0) == T, "x must be (T,C) with one row per token",
           "x {} for indices {}", x.describe(), indices.describe());
  const int64_t C = x.size(1);
  if (out.defined()) check_output(out, {T * k, C}, "permute");
  Permutation p{out.defined() ? out : Tensor::empty({T * k, C}), Tensor::empty({E + 1}, DType::i64),
                Tensor::empty({T, k}, DType::i64)};
  Tensor offsets = p.offsets, row_of = p.row_of, xp = p.x;
  detail::Plan plan = detail::plan("permute_index", kVector, {indices.shape()}, {DType::i32},
                                   fmt::format("E={}", E), [](int) { return detail::Tiling{}; });
  detail::launch(std::move(plan), {{indices}, {offsets, row_of}}, [indices, offsets, row_of, E, T, k](const detail::BlockContext&) {
    const int32_t* ix = indices.data<int32_t>();
    int64_t* off = offsets.data<int64_t>();
    std::fill(off, off + E + 1, 0);
    for (int64_t i = 0; i < T * k; ++i) {
      const int64_t e = expert_at(ix, i, E);
      if (e >= 0) ++off[e + 1];
    }
    for (int64_t e = 0; e < E; ++e) off[e + 1] += off[e];
    std::vector<int64_t> next(off, off + E);
    for (int64_t i = 0; i < T * k; ++i) row_of.data<int64_t>()[i] = ix[i] >= 0 ? next[ix[i]]++ : -1;
  });
  detail::launch_rows("permute", kVector, {x.shape(), indices.shape()}, {DType::f32}, "",
                      {{x, row_of, offsets}, {xp}}, T, k * C,
                      [x, row_of, offsets, xp, T, k, C, E](int64_t t0, int64_t t1) {
                        for (int64_t t = t0; t < t1; ++t)
                          for (int64_t j = 0; j < k; ++j) {
                            const int64_t row = row_of.data<int64_t>()[t * k + j];
                            if (row >= 0)
                              std::memcpy(xp.data<float>() + row * C, x.data<float>() + t * C, C * sizeof(float));
                          }
                        // Unused slots: rows [offsets[E], T k), spread over the same token range.
                        const int64_t used = offsets.data<int64_t>()[E];
                        const int64_t z0 = used + (T * k - used) * t0 / T, z1 = used + (T * k - used) * t1 / T;
                        std::fill(xp.data<float>() + z0 * C, xp.data<float>() + z1 * C, 0.0f);
                      });
  return p;
}

// x rows were copied to xp rows: dx[t] = sum_j dxp[row_of[t,j]]
Tensor permute_backward(const Tensor& dxp, const Tensor& row_of, const Tensor& out) {
  check_rows(row_of, dxp, "dxp");
  const int64_t T = row_of.size(0), k = row_of.size(1), C = dxp.size(1);
  if (out.defined()) check_output(out, {T, C}, "permute_backward");
  Tensor dx = out.defined() ? out : Tensor::empty({T, C});
  detail::launch_rows("permute_backward", kVector, {dxp.shape(), row_of.shape()}, {DType::f32}, "",
                      {{dxp, row_of}, {dx}}, T, k * C, [dxp, row_of, dx, k, C](int64_t t0, int64_t t1) {
                        for (int64_t t = t0; t < t1; ++t) {
                          float* out = dx.data<float>() + t * C;
                          std::fill(out, out + C, 0.0f);
                          for (int64_t j = 0; j < k; ++j) {
                            const int64_t row = row_at(row_of, t * k + j, dxp.size(0));
                            if (row < 0) continue;
                            const float* g = dxp.data<float>() + row * C;
                            for (int64_t c = 0; c < C; ++c) out[c] += g[c];
                          }
                        }
                      });
  return dx;
}

Tensor unpermute(const Tensor& yp, const Tensor& row_of, const Tensor& weights, const Tensor& out) {
  check_rows(row_of, yp, "yp");
  detail::check_shape(weights, row_of.shape(), "weights");
  detail::check_dtype(weights, DType::f32, "weights");
  detail::check_contiguous(weights, "weights");
  const int64_t T = row_of.size(0), k = row_of.size(1), C = yp.size(1);
  if (out.defined()) check_output(out, {T, C}, "unpermute");
  Tensor y = out.defined() ? out : Tensor::empty({T, C});
  detail::launch_rows("unpermute", kVector, {yp.shape(), row_of.shape()}, {DType::f32}, "",
                      {{yp, row_of, weights}, {y}}, T, k * C,
                      [yp, row_of, weights, y, k, C](int64_t t0, int64_t t1) {
                        for (int64_t t = t0; t < t1; ++t) {
                          float* out = y.data<float>() + t * C;
                          std::fill(out, out + C, 0.0f);
                          for (int64_t j = 0; j < k; ++j) {
                            const int64_t row = row_at(row_of, t * k + j, yp.size(0));
                            if (row < 0) continue;
                            const float wj = weights.data<float>()[t * k + j];
                            const float* src = yp.data<float>() + row * C;
                            for (int64_t c = 0; c < C; ++c) out[c] += wj * src[c];
                          }
                        }
                      });
  return y;
}

// y[t] = sum_j w[t,j] yp[r(t,j)]:  dyp[r(t,j)] = w[t,j] dy[t],  dw[t,j] = dy[t] . yp[r(t,j)]
UnpermuteGrads unpermute_backward(const Tensor& dy, const Tensor& yp, const Tensor& row_of,
                                  const Tensor& weights, const Tensor& dyp_out, const Tensor& dweights_out) {
  check_rows(row_of, yp, "yp");
  const int64_t T = row_of.size(0), k = row_of.size(1), C = yp.size(1);
  detail::check_contiguous(dy, "dy");
  detail::check_dtype(dy, DType::f32, "dy");
  detail::check_shape(dy, {T, C}, "dy");
  detail::check_contiguous(weights, "weights");
  detail::check_dtype(weights, DType::f32, "weights");
  detail::check_shape(weights, {T, k}, "weights");
  // Rows no token points at are zeroed by the kernel (its blocks share them
  // out like the tokens), not on the host: a replayed graph runs no host code.
  if (dyp_out.defined()) check_output(dyp_out, yp.shape(), "unpermute_backward");
  if (dweights_out.defined()) check_output(dweights_out, {T, k}, "unpermute_backward");
  UnpermuteGrads g{T == 0 ? Tensor::zeros(yp.shape()) : dyp_out.defined() ? dyp_out : Tensor::empty(yp.shape()),
                   dweights_out.defined() ? dweights_out : Tensor::empty({T, k})};
  Tensor dyp = g.dyp, dw = g.dweights;
  detail::launch_rows("unpermute_backward", kVector, {yp.shape(), row_of.shape()}, {DType::f32}, "",
                      {{dy, yp, row_of, weights}, {dyp, dw}}, T, 2 * k * C,
                      [dy, yp, row_of, weights, dyp, dw, T, k, C](int64_t t0, int64_t t1) {
                        const int64_t R = dyp.size(0);
                        std::vector<char> used(static_cast<size_t>(R), 0);
                        for (int64_t i = 0; i < T * k; ++i)
                          if (const int64_t row = row_of.data<int64_t>()[i]; row >= 0 && row < R) used[size_t(row)] = 1;
                        for (int64_t row = R * t0 / T; row < R * t1 / T; ++row)
                          if (!used[size_t(row)]) std::fill(dyp.data<float>() + row * C, dyp.data<float>() + (row + 1) * C, 0.0f);
                        for (int64_t t = t0; t < t1; ++t) {
                          const float* g = dy.data<float>() + t * C;
                          for (int64_t j = 0; j < k; ++j) {
                            const int64_t row = row_at(row_of, t * k + j, R);
                            if (row < 0) {
                              dw.data<float>()[t * k + j] = 0.0f;
                              continue;
                            }
                            const float wj = weights.data<float>()[t * k + j];
                            float* d = dyp.data<float>() + row * C;
                            for (int64_t c = 0; c < C; ++c) d[c] = wj * g[c];
                            dw.data<float>()[t * k + j] = detail::dot(g, yp.data<float>() + row * C, C);
                          }
                        }
                      });
  return g;
}

GroupedRows concat_groups(const std::vector<Tensor>& parts, const std::vector<Tensor>& offsets) {
  CM_CHECK(!parts.empty() && parts.size() == offsets.size(), "pass one group list per part",
           "concat_groups of {} parts with {} group lists", parts.size(), offsets.size());
  const Tensor& first = parts.front();
  const int64_t G = offsets.front().numel() - 1;
  int64_t M = 0;
  std::vector<Shape> shapes;
  for (size_t p = 0; p < parts.size(); ++p) {
    detail::check_contiguous(parts[p], "parts");
    detail::check_dtype(offsets[p], DType::i64, "offsets");
    CM_CHECK(parts[p].dim() == 2 && parts[p].dtype() == first.dtype() && parts[p].size(1) == first.size(1) &&
                 offsets[p].numel() == G + 1,
             "pass parts of one dtype and width with group lists of one length",
             "part {} is {} with {} groups; part 0 is {} with {}", p, parts[p].describe(), offsets[p].numel() - 1,
             first.describe(), G);
    M += parts[p].size(0);
    shapes.push_back(parts[p].shape());
  }
  const size_t row_bytes = size_t(first.size(1)) * dtype_size(first.dtype());
  GroupedRows out{Tensor::empty({M, first.size(1)}, first.dtype()), Tensor::empty({G + 1}, DType::i64)};
  const Tensor rows = out.rows, joined = out.offsets;
  detail::Plan plan = detail::plan("concat_groups", kVector, std::move(shapes), {first.dtype()},
                                   fmt::format("G={}", G), [G](int max_blocks) {
                                     return detail::Tiling{int(std::clamp<int64_t>(G, 1, max_blocks))};
                                   });
  std::vector<Tensor> in = parts;
  in.insert(in.end(), offsets.begin(), offsets.end());
  detail::launch(std::move(plan), {in, {rows, joined}},
                 [parts, offsets, rows, joined, G, M, row_bytes](const detail::BlockContext& ctx) {
                   // where group g starts in the result: every part's earlier groups
                   std::vector<int64_t> start(size_t(G) + 1, 0);
                   for (int64_t g = 0; g < G; ++g) {
                     start[size_t(g) + 1] = start[size_t(g)];
                     for (const Tensor& o : offsets) start[size_t(g) + 1] += o.data<int64_t>()[g + 1] - o.data<int64_t>()[g];
                   }
                   auto* to = static_cast<std::byte*>(rows.raw_data());
                   for (int64_t g = ctx.block_idx; g < G; g += ctx.block_dim) {
                     int64_t at = start[size_t(g)];
                     for (size_t p = 0; p < parts.size(); ++p) {
                       const int64_t* o = offsets[p].data<int64_t>();
                       const int64_t n = o[g + 1] - o[g];
                       if (n > 0)
                         std::memcpy(to + size_t(at) * row_bytes,
                                     static_cast<const std::byte*>(parts[p].raw_data()) + size_t(o[g]) * row_bytes,
                                     size_t(n) * row_bytes);
                       at += n;
                     }
                   }
                   if (ctx.block_idx != 0) return;
                   std::copy(start.begin(), start.end(), joined.data<int64_t>());
                   std::memset(to + size_t(start.back()) * row_bytes, 0, size_t(M - start.back()) * row_bytes);
                 });
  return out;
}

}  // namespace coremesh::ops
