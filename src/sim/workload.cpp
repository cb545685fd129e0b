#include "coremesh/sim/workload.hpp"

#include <algorithm>
#include <cmath>

#include "coremesh/core/error.hpp"
#include "coremesh/model/layout.hpp"

namespace coremesh::sim {

namespace {

constexpr double kF32 = 4;  // bytes of an activation, a gradient, a parameter

Op gemm(const std::string& dtype, int64_t m, int64_t n, int64_t k) {
  Op op;
  op.kind = OpKind::gemm, op.dtype = dtype, op.m = m, op.n = n, op.k = k;
  op.flops = 2.0 * double(m) * double(n) * double(k);
  op.bytes = kF32 * double(m * k + k * n + m * n);
  return op;
}

Op grouped(OpKind kind, const std::string& dtype, int64_t rows, int64_t n, int64_t k, int64_t groups) {
  Op op = gemm(dtype, rows, n, k);
  op.kind = kind, op.groups = groups;
  op.bytes = kF32 * double(rows * (n + k) + groups * n * k);
  return op;
}

Op elementwise(double bytes) {
  Op op;
  op.kind = OpKind::elementwise, op.bytes = bytes;
  return op;
}

// Causal attention of q_rows queries (the last of kv_rows keys) per head:
// 4 D FLOPs per (query, key) pair kept (QK^T and PV); the backward twice that.
Op attention(const std::string& dtype, bool backward, int64_t b, int64_t h, int64_t hkv, int64_t q_rows,
             int64_t kv_rows, int64_t d) {
  Op op;
  op.dtype = dtype;
  op.kind = backward ? OpKind::attention_backward : OpKind::attention;
  op.batch = b, op.heads = h, op.kv_heads = hkv, op.q_rows = q_rows, op.kv_rows = kv_rows, op.head_dim = d;
  const double pairs = double(q_rows) * (double(kv_rows) - double(q_rows)) + double(q_rows) * (q_rows + 1) / 2.0;
  op.flops = (backward ? 2 : 1) * 4.0 * double(b * h * d) * pairs;
  op.bytes = kF32 * double(b) * double(q_rows * h * d * 2 + kv_rows * hkv * d * 2) * (backward ? 2 : 1);
  return op;
}

struct Dims {
  int64_t B, T, N, rows, C, H, Hkv, D, QKV, Fd, Fs, Fe, V, E, El, K;
  int tp, cp, ep;
  bool sp;
  std::string dtype;        // the block GEMMs' inputs (the model's precision)
  std::string other_dtype;  // attention, router, head: f32, or bf16 under mixed precision
  double act_bytes;         // an exchanged activation: 4 (f32), 2 under mixed precision
  double dispatch_bytes;    // an EP-dispatched element: fp8 sends 1 byte + an f32 scale per 128
};

Dims dims_of(const train::TrainConfig& c) {
  const model::ModelConfig& m = c.model;
  const parallel::ParallelConfig& p = c.parallel;
  model::StageLayout stage;
  stage.tp = p.tp;
  const model::TpShape t = model::tp_shape(m, stage);
  Dims d{};
  d.tp = p.tp, d.cp = p.cp, d.ep = p.ep, d.sp = p.sequence_parallel && p.tp > 1;
  d.B = c.batch_size, d.T = c.seq_len / p.cp, d.N = d.B * d.T, d.rows = d.sp ? d.N / p.tp : d.N;
  d.C = m.d_model, d.H = t.heads, d.Hkv = t.kv_heads, d.D = m.head_dim(), d.QKV = (d.H + 2 * d.Hkv) * d.D;
  d.Fd = t.dense_hidden, d.Fs = t.shared_hidden, d.Fe = t.expert_hidden, d.V = t.vocab;
  d.E = m.n_routed_experts, d.El = std::max(1, m.n_routed_experts / p.ep), d.K = m.top_k;
  d.dtype = model::precision_name(m.precision);
  // Mixed precision computes the rest in bf16 and exchanges bf16 (fp8 dispatch), as DeepSeek-V3 does.
  const bool mixed = m.precision != model::Precision::f32;
  d.other_dtype = mixed ? "bf16" : "f32";
  d.act_bytes = mixed ? 2 : kF32;
  d.dispatch_bytes = m.precision == model::Precision::fp8 ? 1 + kF32 / 128 : d.act_bytes;
  return d;
}

// The TP seams (parallel/tensor_parallel.hpp): enter gathers the sequence
// shards under SP (else identity), exit sums (reduce-scatter under SP); the
// backward mirrors them.
struct Seams {
  const Dims& d;
  double act() const { return d.act_bytes * double(d.N * d.C); }
  void enter(std::vector<Exchange>& x) const {
    if (d.tp > 1 && d.sp) x.push_back({"tp all-gather", Collective::all_gather, Group::tp, act()});
  }
  void exit(std::vector<Exchange>& x) const {
    if (d.tp > 1)
      x.push_back(d.sp ? Exchange{"tp reduce-scatter", Collective::reduce_scatter, Group::tp, act()}
                       : Exchange{"tp all-reduce", Collective::all_reduce, Group::tp, act()});
  }
  void exit_backward(std::vector<Exchange>& x) const {
    if (d.tp > 1 && d.sp) x.push_back({"tp all-gather", Collective::all_gather, Group::tp, act()});
  }
  void enter_backward(std::vector<Exchange>& x) const {  // overlapped with the weight gradients
    if (d.tp > 1)
      x.push_back(d.sp ? Exchange{"tp reduce-scatter", Collective::reduce_scatter, Group::tp, act(), true}
                       : Exchange{"tp all-reduce", Collective::all_reduce, Group::tp, act(), true});
  }
};

// y = x W^T with W (out, in): forward, input gradient, weight gradient
void linear(PartWork& w, const std::string& dtype, int64_t rows, int64_t out, int64_t in) {
  Op f = gemm(dtype, rows, out, in), i = gemm(dtype, rows, in, out), g = gemm(dtype, out, in, rows);
  f.trans_b = true, g.trans_a = true;
  w.forward.push_back(f), w.input_grad.push_back(i), w.weight_grad.push_back(g);
  if (dtype != "f32") {  // the inputs' casts (forward), again for the backward's GEMMs
    w.forward.push_back(elementwise(6.0 * double(rows * in + out * in)));
    w.input_grad.push_back(elementwise(6.0 * double(rows * out)));
  }
}

// RMSNorm(x + delta): read x, delta, w; write h, y (and rstd); backward
// reads dy, x, plus, writes dx (its weight's gradient is a reduction).
void add_norm(PartWork& w, const Dims& d) {
  w.forward.push_back(elementwise(4 * kF32 * double(d.rows * d.C)));
  w.input_grad.push_back(elementwise(4 * kF32 * double(d.rows * d.C)));
}

void swiglu(PartWork& w, int64_t rows, int64_t hidden) {
  w.forward.push_back(elementwise(3 * kF32 * double(rows * hidden)));
  w.input_grad.push_back(elementwise(5 * kF32 * double(rows * hidden)));
}

// x W13^T -> SwiGLU -> W2^T over the micro-batch's rows (dense FFN, shared expert)
void swiglu_mlp(PartWork& w, const Dims& d, int64_t hidden) {
  linear(w, d.dtype, d.N, 2 * hidden, d.C);
  swiglu(w, d.N, hidden);
  linear(w, d.dtype, d.N, d.C, hidden);
}

// A block's end: the TP exit and its backward, the input-gradient sum that
// hides behind the weight gradients, dx = dr + the norm's gradient.
void block_exit(PartWork& w, const Dims& d) {
  const Seams tp{d};
  tp.exit(w.forward_exchanges);
  tp.exit_backward(w.backward_exchanges);
  tp.enter_backward(w.backward_exchanges);
  w.input_grad.push_back(elementwise(3 * kF32 * double(d.rows * d.C)));
}

void attention_part(PartWork& w, const train::TrainConfig& c, const Dims& d) {
  const Seams tp{d};
  add_norm(w, d);
  tp.enter(w.forward_exchanges);
  linear(w, d.dtype, d.N, d.QKV, d.C);
  w.forward.push_back(elementwise(2 * kF32 * double(d.N * d.QKV)));     // RoPE, head split
  w.input_grad.push_back(elementwise(2 * kF32 * double(d.N * d.QKV)));  // its inverse
  const double qkv_bytes = d.act_bytes * double(d.N * d.QKV), out_bytes = d.act_bytes * double(d.N * d.H * d.D);
  if (d.cp == 1) {
    w.forward.push_back(attention(d.other_dtype, false, d.B, d.H, d.Hkv, d.T, d.T, d.D));
    w.input_grad.push_back(attention(d.other_dtype, true, d.B, d.H, d.Hkv, d.T, d.T, d.D));
  } else if (c.parallel.cp_comm == parallel::CpComm::ulysses) {
    // heads to sequences and back: q, k, v out, the output in (and mirrored)
    const int64_t S = d.T * d.cp, h = std::max<int64_t>(1, d.H / d.cp), hkv = std::max<int64_t>(1, d.Hkv / d.cp);
    w.forward_exchanges.push_back({"cp all-to-all qkv", Collective::all_to_all, Group::cp, qkv_bytes});
    w.forward.push_back(attention(d.other_dtype, false, d.B, h, hkv, S, S, d.D));
    w.forward_exchanges.push_back({"cp all-to-all out", Collective::all_to_all, Group::cp, out_bytes});
    w.backward_exchanges.push_back({"cp all-to-all dout", Collective::all_to_all, Group::cp, out_bytes});
    w.input_grad.push_back(attention(d.other_dtype, true, d.B, h, hkv, S, S, d.D));
    w.backward_exchanges.push_back({"cp all-to-all dqkv", Collective::all_to_all, Group::cp, qkv_bytes});
  } else {
    // ring: this rank's queries (zigzag: balanced) against every rank's keys,
    // cp - 1 passes of k and v; the backward passes dk, dv back too
    const int64_t S = d.T * d.cp;
    Op f = attention(d.other_dtype, false, d.B, d.H, d.Hkv, S, S, d.D), b = attention(d.other_dtype, true, d.B, d.H, d.Hkv, S, S, d.D);
    f.q_rows = b.q_rows = d.T, f.flops /= d.cp, b.flops /= d.cp, f.bytes /= d.cp, b.bytes /= d.cp;
    w.forward.push_back(f), w.input_grad.push_back(b);
    const double kv = 2 * d.act_bytes * double(d.N * d.Hkv * d.D);
    for (int s = 1; s < d.cp; ++s) {
      w.forward_exchanges.push_back({"cp ring k, v", Collective::put, Group::cp, kv});
      w.backward_exchanges.push_back({"cp ring k, v, dk, dv", Collective::put, Group::cp, 2 * kv});
    }
  }
  linear(w, d.dtype, d.N, d.C, d.H * d.D);  // wo
  block_exit(w, d);
}

void dense_ffn(PartWork& w, const Dims& d) {
  const Seams tp{d};
  add_norm(w, d);
  tp.enter(w.forward_exchanges);
  swiglu_mlp(w, d, d.Fd);
  block_exit(w, d);
}

void moe_ffn(PartWork& w, const WorkloadShape& s, const Dims& d) {
  const model::ModelConfig& m = s.config.model;
  const Seams tp{d};
  add_norm(w, d);
  // router: scores, top-k, the balance statistics
  linear(w, d.other_dtype, d.rows, d.E, d.C);
  w.forward.push_back(elementwise(4 * kF32 * double(d.rows * d.E)));
  w.input_grad.push_back(elementwise(4 * kF32 * double(d.rows * d.E)));
  tp.enter(w.forward_exchanges);
  // the busiest EP rank's rows: its experts' share of the group's assignments
  // (without expert parallelism a rank computes every assignment: no skew;
  // with it, at most all ep ranks' rows)
  double skew = d.ep > 1 ? std::clamp(s.routing_skew, 1.0, double(d.ep)) : 1.0;
  if (m.capacity_factor > 0) skew = std::min(skew, double(m.capacity_factor));
  const int64_t assigned = d.N * d.K;
  const int64_t rows = int64_t(std::ceil(double(assigned) * skew));
  const double moved = kF32 * double(assigned * d.C), rows_sent = double(assigned * d.C) * skew;
  const double across = m.n_groups > 1 ? std::min(1.0, double(m.topk_groups) / double(d.K)) : 1.0;
  w.forward.push_back(elementwise(2 * moved));  // permute
  if (d.ep > 1) {
    w.forward_exchanges.push_back({"ep dispatch", Collective::all_to_all, Group::ep, d.dispatch_bytes * rows_sent, false, across});
    w.backward_exchanges.push_back({"ep combine backward", Collective::all_to_all, Group::ep, d.act_bytes * rows_sent, false, across});
  }
  for (const auto& [n, k] : {std::pair{2 * d.Fe, d.C}, std::pair{d.C, d.Fe}}) {
    w.forward.push_back(grouped(OpKind::grouped_gemm, d.dtype, rows, n, k, d.El));
    w.input_grad.push_back(grouped(OpKind::grouped_gemm, d.dtype, rows, k, n, d.El));
    w.weight_grad.push_back(grouped(OpKind::grouped_gemm_dw, d.dtype, rows, n, k, d.El));
    if (n == 2 * d.Fe) swiglu(w, rows, d.Fe);
  }
  if (d.ep > 1) {
    w.forward_exchanges.push_back({"ep combine", Collective::all_to_all, Group::ep, d.act_bytes * rows_sent, false, across});
    w.backward_exchanges.push_back({"ep dispatch backward", Collective::all_to_all, Group::ep, d.act_bytes * rows_sent, false, across});
  }
  w.forward.push_back(elementwise(2 * moved));     // the weighted sum back to tokens
  w.input_grad.push_back(elementwise(4 * moved));  // permute and unpermute backward
  if (d.Fs > 0) {  // the shared expert
    swiglu_mlp(w, d, d.Fs);
  }
  block_exit(w, d);
}

void head(PartWork& w, const Dims& d) {
  const Seams tp{d};
  add_norm(w, d);
  tp.enter(w.forward_exchanges);
  linear(w, d.other_dtype, d.N, d.V, d.C);
  w.forward.push_back(elementwise(2 * kF32 * double(d.N * d.V)));     // cross entropy
  w.input_grad.push_back(elementwise(2 * kF32 * double(d.N * d.V)));  // its gradient
  if (d.tp > 1)  // the vocabulary slices' statistics
    w.forward_exchanges.push_back({"tp all-reduce (loss)", Collective::all_reduce, Group::tp, 2 * kF32 * double(d.N)});
  tp.enter_backward(w.backward_exchanges);
}

void embedding(PartWork& w, const Dims& d) {
  const Seams tp{d};
  w.forward.push_back(elementwise(2 * kF32 * double(d.N * d.C)));
  tp.exit(w.forward_exchanges);
  tp.exit_backward(w.backward_exchanges);
  w.weight_grad.push_back(elementwise(3 * kF32 * double(d.N * d.C)));  // rows scattered into the table
}

}  // namespace

double PartWork::flops() const {
  double f = 0;
  for (const auto* list : {&forward, &input_grad, &weight_grad})
    for (const Op& op : *list) f += op.flops;
  return f;
}

PartWork part_work(const WorkloadShape& s, int part) {
  const model::ModelConfig& m = s.config.model;
  const Dims d = dims_of(s.config);
  PartWork w;
  const model::Part p = model::part_at(m, part);
  switch (p.kind) {
    case model::PartKind::embedding: embedding(w, d); break;
    case model::PartKind::attention: attention_part(w, s.config, d); break;
    case model::PartKind::ffn:
      if (m.is_moe_layer(p.layer)) moe_ffn(w, s, d);
      else dense_ffn(w, d);
      break;
    case model::PartKind::head: head(w, d); break;
  }
  return w;
}

std::vector<Op> kernels_of(const WorkloadShape& s) {
  std::vector<Op> out;
  for (int part = 0; part < model::num_parts(s.config.model); ++part) {
    const PartWork w = part_work(s, part);
    for (const auto* list : {&w.forward, &w.input_grad, &w.weight_grad})
      for (const Op& op : *list)
        if (op.kind != OpKind::elementwise) out.push_back(op);
  }
  return out;
}

Op optimizer_op(double params) { return elementwise(9 * kF32 * params); }

}  // namespace coremesh::sim
