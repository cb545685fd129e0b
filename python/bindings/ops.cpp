// coremesh.ops: the dense kernels (GEMM family, attention, norms,
// activations, RoPE, loss, embedding, quantization, transpose).
//
// Every op is asynchronous: it tiles under the current stream's core limits
// (with runtime.StreamLimitCtx(...)), enqueues its kernel and returns at
// once; results are valid once the stream reaches them (np.asarray and
// friends wait). Docstrings give shapes; notation as in include/coremesh/ops.
#include "common.hpp"
#include "coremesh/ops/activation.hpp"
#include "coremesh/ops/attention.hpp"
#include "coremesh/ops/elementwise.hpp"
#include "coremesh/ops/embedding.hpp"
#include "coremesh/ops/gemm.hpp"
#include "coremesh/ops/grouped_gemm.hpp"
#include "coremesh/ops/loss.hpp"
#include "coremesh/ops/norm.hpp"
#include "coremesh/ops/quant.hpp"
#include "coremesh/ops/rope.hpp"
#include "coremesh/ops/transpose.hpp"

namespace coremesh::python {

ops::WeightLayout layout_arg(const std::string& name) {
  static const std::pair<const char*, ops::WeightLayout> table[] = {
      {"nk", ops::WeightLayout::nk}, {"kn", ops::WeightLayout::kn}};  // nk: nn.Linear's (N,K)
  return named_choice(name, table, "layout");
}

namespace {

using ops::QuantizedTensor;

ops::GeluApprox gelu_arg(const std::string& name) {
  static const std::pair<const char*, ops::GeluApprox> table[] = {
      {"tanh", ops::GeluApprox::tanh}, {"none", ops::GeluApprox::none}};  // none: the erf form
  return named_choice(name, table, "GELU approximation");
}

ops::RopeConfig rope_config(float base, bool interleaved) { return {base, interleaved}; }

void bind_gemm(py::module_& m) {
  py::class_<QuantizedTensor>(m, "QuantizedTensor", R"doc(
FP8 e4m3 codes with their f32 scales (DeepSeek-V3 fine-grained scaling):
activations (M,K) with scale (M, ceil(K/128)); weights (N,K) with scale
(ceil(N/128), ceil(K/128)). Unpacks as (data, scale).)doc")
      .def(py::init([](const Tensor& data, const Tensor& scale) { return QuantizedTensor{data, scale}; }),
           py::arg("data"), py::arg("scale"), "Pairs fp8 e4m3 codes with their f32 scales (no copy, no check).")
      .def_readwrite("data", &QuantizedTensor::data, "The f8e4m3 codes.")
      .def_readwrite("scale", &QuantizedTensor::scale, "The f32 scales, one per 1x128 tile or 128x128 block.")
      .def("__iter__", [](const QuantizedTensor& q) { return py::iter(py::make_tuple(q.data, q.scale)); });

  m.def("add", &ops::add, py::arg("a"), py::arg("b"), "a + b, f32 of equal shape (vector kernel).");
  m.def("mul", &ops::mul, py::arg("a"), py::arg("b"), "a * b, f32 of equal shape (vector kernel).");
  m.def("add_out", &ops::add_out, py::arg("a"), py::arg("b"), py::arg("out"),
        "out = a + b into out, contiguous f32 of equal shape; out may be a or b itself.");
  m.def("mul_out", &ops::mul_out, py::arg("a"), py::arg("b"), py::arg("out"),
        "out = a * b into out, contiguous f32 of equal shape; out may be a or b itself.");

  m.def("matmul", &ops::matmul, py::arg("a"), py::arg("b"), py::arg("trans_a") = false,
        py::arg("trans_b") = false, R"doc(
c = op(a) @ op(b) (cube kernel). a (M,K) or (K,M) with trans_a; b (K,N) or
(N,K) with trans_b; batched a (Bt,.,.) with b (Bt,.,.) or a shared 2-D b.
f32 or bf16 inputs, f32 c (M,N) / (Bt,M,N).)doc");
  m.def("matmul_out", &ops::matmul_out, py::arg("a"), py::arg("b"), py::arg("out"),
        py::arg("trans_a") = false, py::arg("trans_b") = false, py::arg("beta") = 0.0f,
        "out = op(a) @ op(b) + beta * out.");
  m.def("matmul_backward", [](const Tensor& dc, const Tensor& a, const Tensor& b, bool ta, bool tb) {
          auto g = ops::matmul_backward(dc, a, b, ta, tb);
          return py::make_tuple(g.da, g.db);
        }, py::arg("dc"), py::arg("a"), py::arg("b"), py::arg("trans_a") = false,
        py::arg("trans_b") = false, "(da, db) with a's and b's shapes, for c = op(a) @ op(b).");
  m.def("matmul_fp8_wgrad", &ops::matmul_fp8_wgrad, py::arg("dy"), py::arg("x"), R"doc(
DeepSeek-V3's fp8 weight gradient dy^T x: dy (M, N) and x (M, K) f32, each rounded to fp8 in 1x128
tiles along the M tokens, multiplied with f32 sums.)doc");
  m.def("matmul_fp8", &ops::matmul_fp8, py::arg("x"), py::arg("w"), R"doc(
y (M,N) f32 = dequant(x) @ dequant(w)^T: x QuantizedTensor (M,K) with scale
(M, ceil(K/128)), w QuantizedTensor (N,K) with scale (ceil(N/128), ceil(K/128)).)doc");

  m.def("quantize_fp8_act", &ops::quantize_fp8_act, py::arg("x"),
        "x (M,K) f32/bf16 -> QuantizedTensor: e4m3 codes (M,K), scales (M, ceil(K/128)) per 1x128 tile.");
  m.def("dequantize_fp8_act", &ops::dequantize_fp8_act, py::arg("q"), "-> (M,K) f32.");
  m.def("quantize_fp8_weight", &ops::quantize_fp8_weight, py::arg("w"),
        "w (N,K) or (G,N,K) -> QuantizedTensor with one scale per 128x128 block.");
  m.def("dequantize_fp8_weight", &ops::dequantize_fp8_weight, py::arg("q"), "-> (N,K) f32.");
  m.def("cast", [](const Tensor& x, const py::object& dtype) { return ops::cast(x, dtype_arg(dtype)); },
        py::arg("x"), py::arg("dtype"), "Element-wise conversion on the stream (exact bf16/fp8 rounding).");

  m.def("grouped_matmul", [](const Tensor& x, const Tensor& w, const Tensor& offsets,
                             const std::string& layout) {
          return ops::grouped_matmul(x, w, offsets, layout_arg(layout));
        }, py::arg("x"), py::arg("w"), py::arg("offsets"), py::arg("layout") = "nk", R"doc(
G matmuls in one kernel (MoE experts). Layout B: x (M,K), stacked w (G,N,K)
['nk'] or (G,K,N) ['kn'], offsets (G+1) i64 (group g owns rows
[offsets[g], offsets[g+1]); rows past offsets[G] are zeros) -> y (M,N).
Layout D: the same with w a list of G (N,K) weights. Layout A: a list of
xs[g] (M_g,K) and ws[g] -> a list of ys[g] (M_g,N).)doc");
  m.def("grouped_matmul", [](const Tensor& x, const std::vector<Tensor>& ws, const Tensor& offsets,
                             const std::string& layout) {
          return ops::grouped_matmul(x, ws, offsets, layout_arg(layout));
        }, py::arg("x"), py::arg("ws"), py::arg("offsets"), py::arg("layout") = "nk");
  m.def("grouped_matmul", [](const std::vector<Tensor>& xs, const std::vector<Tensor>& ws,
                             const std::string& layout) {
          return ops::grouped_matmul(xs, ws, layout_arg(layout));
        }, py::arg("xs"), py::arg("ws"), py::arg("layout") = "nk");
  m.def("grouped_matmul_stacked", [](const std::vector<Tensor>& xs, const std::vector<Tensor>& ws,
                                     const std::string& layout) {
          return ops::grouped_matmul_stacked(xs, ws, layout_arg(layout));
        }, py::arg("xs"), py::arg("ws"), py::arg("layout") = "nk",
        "Layout C: xs[g] (M_g,K), ws[g] -> y (sum M_g, N), groups stacked in order.");
  m.def("grouped_matmul_out", [](const Tensor& x, const Tensor& w, const Tensor& offsets,
                                 const Tensor& y, const std::string& layout, std::pair<int64_t, int64_t> groups) {
          ops::grouped_matmul_out(x, w, offsets, y, layout_arg(layout), {groups.first, groups.second});
        }, py::arg("x"), py::arg("w"), py::arg("offsets"), py::arg("y"), py::arg("layout") = "nk",
        py::arg("groups") = std::pair<int64_t, int64_t>{0, -1},
        "Layout B into y; groups (begin, end): only those groups' rows (end -1: G; the tail past the\n"
        "last group is zeroed only by a range that ends at G).");
  m.def("grouped_matmul_backward", [](const Tensor& dy, const Tensor& x, const Tensor& w,
                                      const Tensor& offsets, const std::string& layout,
                                      const std::optional<Tensor>& dw_into, float dw_beta) {
          auto g = ops::grouped_matmul_backward(dy, x, w, offsets, layout_arg(layout),
                                                optional_tensor(dw_into), dw_beta);
          return py::make_tuple(g.dx, g.dw);
        }, py::arg("dy"), py::arg("x"), py::arg("w"), py::arg("offsets"), py::arg("layout") = "nk",
        py::arg("dw_into") = py::none(), py::arg("dw_beta") = 1.0f, R"doc(
Layout B backward: dy (M,N) -> (dx (M,K), dw with w's shape). With dw_into,
dw = d w + dw_beta * dw_into, written into dw_into.)doc");
  m.def("grouped_matmul_dw", [](const Tensor& dy, const Tensor& x, const Tensor& offsets, const Tensor& dw,
                                const std::string& layout, float beta) {
          ops::grouped_matmul_dw(dy, x, offsets, dw, layout_arg(layout), beta);
        }, py::arg("dy"), py::arg("x"), py::arg("offsets"), py::arg("dw"), py::arg("layout") = "nk",
        py::arg("beta") = 0.0f,
        "The weight-gradient half alone: dw[g] = dy_g^T x_g ['nk'] + beta * dw[g], into dw (w's shape).");
  m.def("grouped_matmul_fp8",
        [](const ops::QuantizedTensor& x, const ops::QuantizedTensor& w, const Tensor& offsets,
           const std::optional<Tensor>& out, std::pair<int64_t, int64_t> groups) {
          return ops::grouped_matmul_fp8(x, w, offsets, optional_tensor(out), {groups.first, groups.second});
        }, py::arg("x"), py::arg("w"), py::arg("offsets"), py::arg("out") = py::none(),
        py::arg("groups") = std::pair<int64_t, int64_t>{0, -1},
        "Layout B in FP8: x QuantizedTensor (M,K), w QuantizedTensor (G,N,K) -> y (M,N) f32; into out\n"
        "when given, and only the groups (begin, end) as grouped_matmul_out.");
}

void bind_attention_and_norm(py::module_& m) {
  m.def("flash_attention", [](const Tensor& q, const Tensor& k, const Tensor& v, bool causal, float scale) {
          auto r = ops::flash_attention(q, k, v, causal, scale);
          return py::make_tuple(r.out, r.lse);
        }, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("causal") = true, py::arg("scale") = 0.0f,
        R"doc(
Flash attention, MHA or GQA. q (B,T,H,D), k and v (B,S,Hkv,D), f32 ->
(out (B,T,H,D), lse (B,H,T)). causal needs T == S; scale <= 0: 1/sqrt(D).)doc");
  m.def("flash_attention_backward", [](const Tensor& dout, const Tensor& q, const Tensor& k,
                                       const Tensor& v, const Tensor& out, const Tensor& lse,
                                       bool causal, float scale) {
          auto g = ops::flash_attention_backward(dout, q, k, v, out, lse, causal, scale);
          return py::make_tuple(g.dq, g.dk, g.dv);
        }, py::arg("dout"), py::arg("q"), py::arg("k"), py::arg("v"), py::arg("out"), py::arg("lse"),
        py::arg("causal") = true, py::arg("scale") = 0.0f, "-> (dq, dk, dv) with q's, k's, v's shapes.");
  m.def("merge_attention", [](const Tensor& o1, const Tensor& l1, const Tensor& o2, const Tensor& l2) {
          auto r = ops::merge_attention(o1, l1, o2, l2);
          return py::make_tuple(r.out, r.lse);
        }, py::arg("out1"), py::arg("lse1"), py::arg("out2"), py::arg("lse2"),
        "Attention over two disjoint key sets combined through their lse: -> (out, lse).");

  m.def("rmsnorm", [](const Tensor& x, const Tensor& w, float eps) {
          auto r = ops::rmsnorm(x, w, eps);
          return py::make_tuple(r.y, r.rstd);
        }, py::arg("x"), py::arg("w"), py::arg("eps") = 1e-6f,
        "x (..., C), w (C) -> (y (..., C), rstd (R)): y = x / sqrt(mean(x^2) + eps) * w.");
  m.def("rmsnorm_residual", [](const Tensor& x, const Tensor& residual, const Tensor& w, float eps) {
          auto r = ops::rmsnorm_residual(x, residual, w, eps);
          return py::make_tuple(r.h, r.y, r.rstd);
        }, py::arg("x"), py::arg("residual"), py::arg("w"), py::arg("eps") = 1e-6f,
        "h = x + residual, y = rmsnorm(h) -> (h, y, rstd).");
  m.def("rmsnorm_fp8", [](const Tensor& x, const Tensor& w, float eps) {
          auto r = ops::rmsnorm_fp8(x, w, eps);
          return py::make_tuple(r.y, r.rstd);
        }, py::arg("x"), py::arg("w"), py::arg("eps") = 1e-6f,
        "rmsnorm quantized to FP8 1x128 tiles -> (QuantizedTensor, rstd).");
  m.def("rmsnorm_backward", [](const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                               const std::optional<Tensor>& dx_plus,
                               const std::optional<Tensor>& dw_into, float dw_beta) {
          auto g = ops::rmsnorm_backward(dy, x, w, rstd, optional_tensor(dx_plus),
                                         optional_tensor(dw_into), dw_beta);
          return py::make_tuple(g.dx, g.dw);
        }, py::arg("dy"), py::arg("x"), py::arg("w"), py::arg("rstd"), py::arg("dx_plus") = py::none(),
        py::arg("dw_into") = py::none(), py::arg("dw_beta") = 1.0f,
        "-> (dx (..., C), dw (C)); dx_plus (x's shape) is added into dx (residual form).");

  m.def("silu", &ops::silu, py::arg("x"), "x * sigmoid(x), f32.");
  m.def("silu_backward", &ops::silu_backward, py::arg("dy"), py::arg("x"),
        "dy, x f32 of equal shape -> dx = dy * silu'(x).");
  m.def("gelu", [](const Tensor& x, const std::string& a) { return ops::gelu(x, gelu_arg(a)); },
        py::arg("x"), py::arg("approximate") = "tanh", "GELU, tanh (GPT-2) or 'none' (erf) form.");
  m.def("gelu_backward", [](const Tensor& dy, const Tensor& x, const std::string& a) {
          return ops::gelu_backward(dy, x, gelu_arg(a));
        }, py::arg("dy"), py::arg("x"), py::arg("approximate") = "tanh",
        "dy, x f32 of equal shape -> dx = dy * gelu'(x), in the same form as gelu.");
  m.def("swiglu", &ops::swiglu, py::arg("gate_up"),
        "gate_up (..., 2F) laid out [gate | up] -> silu(gate) * up (..., F).");
  m.def("swiglu_backward", &ops::swiglu_backward, py::arg("dy"), py::arg("gate_up"),
        "dy (..., F) -> d gate_up (..., 2F).");
  m.def("softmax", &ops::softmax, py::arg("x"), "Softmax over the last dimension.");
  m.def("softmax_backward", &ops::softmax_backward, py::arg("dy"), py::arg("y"), "From the output y.");
}

void bind_sequence_ops(py::module_& m) {
  m.def("rope", [](const Tensor& x, const Tensor& pos, float base, bool interleaved) {
          return ops::rope(x, pos, rope_config(base, interleaved));
        }, py::arg("x"), py::arg("positions"), py::arg("base") = 10000.0f, py::arg("interleaved") = false,
        R"doc(
Rotary embedding. x (B,T,H,D) f32, D even; positions (T) i64. Pairs are
(x[p], x[p+D/2]) (half split) or (x[2p], x[2p+1]) (interleaved), rotated by
pos * base^(-2p/D).)doc");
  m.def("rope_backward", [](const Tensor& dy, const Tensor& pos, float base, bool interleaved) {
          return ops::rope_backward(dy, pos, rope_config(base, interleaved));
        }, py::arg("dy"), py::arg("positions"), py::arg("base") = 10000.0f, py::arg("interleaved") = false,
        "dy (B,T,H,D) -> dx: the inverse rotation, with the same positions, base and pairing as rope.");
  m.def("rope_qkv", [](const Tensor& qkv, int64_t heads, int64_t kv_heads, const Tensor& pos,
                       float base, bool interleaved) {
          auto r = ops::rope_qkv(qkv, heads, kv_heads, pos, rope_config(base, interleaved));
          return py::make_tuple(r.q, r.k, r.v);
        }, py::arg("qkv"), py::arg("heads"), py::arg("kv_heads"), py::arg("positions"),
        py::arg("base") = 10000.0f, py::arg("interleaved") = false,
        "qkv (B,T,(H+2Hkv)*D) -> (q (B,T,H,D), k, v (B,T,Hkv,D)), q and k rotated.");
  m.def("rope_qkv_backward", [](const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& pos,
                                float base, bool interleaved) {
          return ops::rope_qkv_backward(dq, dk, dv, pos, rope_config(base, interleaved));
        }, py::arg("dq"), py::arg("dk"), py::arg("dv"), py::arg("positions"), py::arg("base") = 10000.0f,
        py::arg("interleaved") = false, "-> dqkv (B,T,(H+2Hkv)*D).");
  m.def("rope_positions", &ops::rope_positions, py::arg("T"), py::arg("start") = 0,
        "(T) i64: start, start+1, ...");

  m.def("cross_entropy", [](const Tensor& logits, const Tensor& targets, int64_t ignore_index) {
          auto r = ops::cross_entropy(logits, targets, ignore_index);
          return py::make_tuple(r.loss, r.lse);
        }, py::arg("logits"), py::arg("targets"), py::arg("ignore_index") = -100, R"doc(
logits (N,V) f32, targets (N) i32/i64 -> (loss (N), lse (N)); loss is 0
where target == ignore_index. A target outside [0,V) fails in the kernel.)doc");
  m.def("cross_entropy_backward", [](const Tensor& dloss, const Tensor& logits, const Tensor& targets,
                                     const Tensor& lse, int64_t ignore_index, int64_t vocab_begin, int64_t vocab) {
          return ops::cross_entropy_backward(dloss, logits, targets, lse, ignore_index, {vocab_begin, vocab});
        }, py::arg("dloss"), py::arg("logits"), py::arg("targets"), py::arg("lse"), py::arg("ignore_index") = -100,
        py::arg("vocab_begin") = 0, py::arg("vocab") = -1,
        "dloss (N) -> dlogits (N,V); logits may be the columns [vocab_begin, vocab_begin + V) of a vocab-wide row.");
  m.def("cross_entropy_slice_stats", [](const Tensor& logits, const Tensor& targets, int64_t vocab_begin,
                                        int64_t vocab, int64_t ignore_index) {
          return ops::cross_entropy_slice_stats(logits, targets, {vocab_begin, vocab}, ignore_index);
        }, py::arg("logits"), py::arg("targets"), py::arg("vocab_begin"), py::arg("vocab"),
        py::arg("ignore_index") = -100, R"doc(
Vocabulary-parallel cross entropy, step 1: logits (N, V/P) of the columns
[vocab_begin, vocab_begin + V/P) -> stats (P+1, N) to be summed over the P slices.)doc");
  m.def("cross_entropy_from_slice_stats", [](const Tensor& summed, const Tensor& targets, int64_t ignore_index) {
          auto r = ops::cross_entropy_from_slice_stats(summed, targets, ignore_index);
          return py::make_tuple(r.loss, r.lse);
        }, py::arg("summed"), py::arg("targets"), py::arg("ignore_index") = -100,
        "Step 2: the slices' summed stats -> (loss (N), lse (N)) of the whole vocabulary.");

  m.def("embedding", [](const Tensor& table, const Tensor& ids, int64_t vocab_begin, int64_t vocab) {
          return ops::embedding(table, ids, {vocab_begin, vocab});
        }, py::arg("table"), py::arg("ids"), py::arg("vocab_begin") = 0, py::arg("vocab") = -1,
        "table (V,C) f32 (rows [vocab_begin, vocab_begin + V) of a vocab-row table), ids (...) i32/i64 in "
        "[0,vocab) -> (..., C), zero rows for ids held elsewhere; a bad id fails in the kernel.");
  m.def("embedding_backward", &ops::embedding_backward, py::arg("dy"), py::arg("ids"), py::arg("vocab"),
        "dy (..., C) -> dtable (vocab, C), summed per id.");
  m.def("embedding_backward_into", [](const Tensor& dy, const Tensor& ids, Tensor dtable, float beta,
                                      int64_t vocab_begin, int64_t vocab) {
          ops::embedding_backward_into(dy, ids, dtable, beta, {vocab_begin, vocab});
        }, py::arg("dy"), py::arg("ids"), py::arg("dtable"), py::arg("beta") = 1.0f, py::arg("vocab_begin") = 0,
        py::arg("vocab") = -1, "dtable = d table + beta * dtable, in place (its rows of the slice).");

  m.def("transpose", &ops::transpose, py::arg("x"), "x (..., R, C) -> (..., C, R), any dtype, exact.");
  m.def("transpose_out", &ops::transpose_out, py::arg("x"), py::arg("y"),
        "transpose into y (..., C, R), contiguous, x's dtype, not overlapping x.");
}

}  // namespace

void bind_ops(py::module_& m) {
  bind_gemm(m);
  bind_attention_and_norm(m);
  bind_sequence_ops(m);
}

}  // namespace coremesh::python
