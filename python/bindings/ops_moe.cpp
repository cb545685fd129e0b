// coremesh.ops: MoE routing, permute/combine and the optimizer kernels.
// Notation: T tokens, E experts, k experts per token, C hidden size; indices
// (T,k) i32 hold expert ids, -1 for a dropped assignment. Nothing here waits
// for the host: counts and offsets stay tensors.
#include <string>
#include "common.hpp"
#include "coremesh/ops/moe_routing.hpp"
#include "coremesh/ops/optimizer.hpp"

namespace coremesh::python {
namespace {

ops::ScoreFunc score_func_arg(const std::string& name) {
  static const std::pair<const char*, ops::ScoreFunc> table[] = {
      {"softmax", ops::ScoreFunc::softmax}, {"sigmoid", ops::ScoreFunc::sigmoid}};
  return named_choice(name, table, "score function");
}

ops::DropPolicy drop_policy_arg(const std::string& name) {
  static const std::pair<const char*, ops::DropPolicy> table[] = {
      {"probability", ops::DropPolicy::probability}, {"position", ops::DropPolicy::position}};
  return named_choice(name, table, "drop policy");
}

ops::AdamWConfig adamw_config(float lr, float beta1, float beta2, float eps, float weight_decay) {
  return {lr, beta1, beta2, eps, weight_decay};
}

void bind_routing(py::module_& m) {
  py::class_<ops::Routing>(m, "Routing", "indices (T,k) i32 (-1: dropped) and weights (T,k) f32; "
                                         "unpacks as (indices, weights).")
      .def(py::init([](const Tensor& i, const Tensor& w) { return ops::Routing{i, w}; }),
           py::arg("indices"), py::arg("weights"), "Pairs indices (T,k) i32 with weights (T,k) f32 (no copy).")
      .def_readwrite("indices", &ops::Routing::indices, "(T,k) i32 expert ids, -1 for a dropped assignment.")
      .def_readwrite("weights", &ops::Routing::weights, "(T,k) f32 combine weights.")
      .def("__iter__", [](const ops::Routing& r) { return py::iter(py::make_tuple(r.indices, r.weights)); });

  m.def("router_scores", [](const Tensor& logits, const std::string& func) {
          return ops::router_scores(logits, score_func_arg(func));
        }, py::arg("logits"), py::arg("func") = "softmax",
        "logits (T,E) -> scores (T,E): softmax over experts or sigmoid per expert.");
  m.def("router_scores_backward", [](const Tensor& dscores, const Tensor& scores, const std::string& func) {
          return ops::router_scores_backward(dscores, scores, score_func_arg(func));
        }, py::arg("dscores"), py::arg("scores"), py::arg("func") = "softmax",
        "dscores (T,E) -> dlogits (T,E), from the output scores of router_scores with the same func.");

  const auto topk = [](int k, int n_groups, int topk_groups, bool renorm, float route_scale) {
    return ops::TopKConfig{k, n_groups, topk_groups, renorm, route_scale};
  };
  m.def("topk_route", [topk](const Tensor& scores, const std::optional<Tensor>& bias, int k,
                             int n_groups, int topk_groups, bool renorm, float route_scale) {
          return ops::topk_route(scores, optional_tensor(bias),
                                 topk(k, n_groups, topk_groups, renorm, route_scale));
        }, py::arg("scores"), py::arg("bias") = py::none(), py::arg("k") = 2, py::arg("n_groups") = 1,
        py::arg("topk_groups") = 1, py::arg("renorm") = false, py::arg("route_scale") = 1.0f, R"doc(
Top-k experts per token by scores (T,E) + bias (E) (bias selects only);
group-limited when n_groups > 1. -> Routing: weights are the unbiased
scores (renormalized if asked) times route_scale; ties go to the lower id.)doc");
  m.def("topk_route_backward", [topk](const Tensor& dweights, const Tensor& scores,
                                      const ops::Routing& routing, int k, int n_groups,
                                      int topk_groups, bool renorm, float route_scale) {
          return ops::topk_route_backward(dweights, scores, routing,
                                          topk(k, n_groups, topk_groups, renorm, route_scale));
        }, py::arg("dweights"), py::arg("scores"), py::arg("routing"), py::arg("k") = 2,
        py::arg("n_groups") = 1, py::arg("topk_groups") = 1, py::arg("renorm") = false,
        py::arg("route_scale") = 1.0f, "dweights (T,k) -> dscores (T,E).");
  m.def("expert_counts", &ops::expert_counts, py::arg("indices"), py::arg("num_experts"),
        "-> counts (E) i64 of kept assignments.");
  m.def("update_expert_bias", [](const Tensor& bias, const Tensor& counts, float rate, const std::string& mode,
                                 const std::optional<Tensor>& margins) {
          if (mode != "sign" && mode != "proportional" && mode != "margin")
            throw std::invalid_argument("update_expert_bias: mode '" + mode +
                                        "' is unknown; use 'sign', 'proportional' or 'margin'");
          ops::update_expert_bias(bias, counts, rate,
                                  mode == "sign"           ? ops::BiasUpdate::sign
                                  : mode == "proportional" ? ops::BiasUpdate::proportional
                                                           : ops::BiasUpdate::margin,
                                  optional_tensor(margins));
        }, py::arg("bias"), py::arg("counts"), py::arg("rate"), py::arg("mode") = "sign", py::arg("margins") = py::none(),
        "In place: bias[e] += rate * sign(mean - counts[e]) ('sign'), rate * (mean - counts[e]) / mean "
        "('proportional'), or rate * the shift that balances expert e read off margins (E, 2, MARGIN_BINS) "
        "('margin', from accumulate_selection_margins).");
  m.def("accumulate_selection_margins", [](const Tensor& scores, const std::optional<Tensor>& bias,
                                           const Tensor& selected, const Tensor& margins) {
          ops::accumulate_selection_margins(scores, optional_tensor(bias), selected, margins);
        }, py::arg("scores"), py::arg("bias"), py::arg("selected"), py::arg("margins"),
        "Adds each (token, expert)'s distance to its selection edge to margins (E, 2, MARGIN_BINS) i64: "
        "[e][0] how far e's bias must fall to leave, [e][1] rise to enter (bins: margin_bin_edge).");
  m.def("margin_bin_edge", &ops::margin_bin_edge, py::arg("bin"), "The lower edge of a selection-margin bin.");
  m.attr("MARGIN_BINS") = ops::kMarginBins;
  m.def("switch_aux_loss", [](const Tensor& scores, const Tensor& indices, int64_t E, float alpha) {
          auto r = ops::switch_aux_loss(scores, indices, E, alpha);
          return py::make_tuple(r.loss, r.dscores);
        }, py::arg("scores"), py::arg("indices"), py::arg("num_experts"), py::arg("alpha"),
        "Switch-Transformer balance loss -> (loss (1), dscores (T,E)).");
  m.def("sequence_balance_loss", &ops::sequence_balance_loss, py::arg("scores"), py::arg("selected"),
        py::arg("sequences"), py::arg("alpha"), R"doc(
DeepSeek-V3's sequence-wise balance loss -> (1): scores (N,E) with N =
sequences*T, selected (N,k) the top-k before capacity;
alpha/B sum_b sum_e f_be P_be, f_be = E/(kT) #{t in b: e selected},
P_be = mean over b's tokens of the per-token normalized scores.)doc");
  m.def("sequence_balance_loss_backward", &ops::sequence_balance_loss_backward, py::arg("scores"),
        py::arg("selected"), py::arg("sequences"), py::arg("alpha"), py::arg("scale"),
        "-> dscores (N,E) = d(scale * loss)/dscores.");
  m.def("accumulate_expert_load", &ops::accumulate_expert_load, py::arg("selected"), py::arg("kept"),
        py::arg("load"), "load (E+1) i64 += selections per expert of `selected`; load[E] += drops (-1) in `kept`.");
  m.def("expert_capacity", &ops::expert_capacity, py::arg("tokens"), py::arg("k"), py::arg("num_experts"),
        py::arg("factor"), "ceil(factor * tokens * k / num_experts).");
  m.def("apply_capacity", [](const ops::Routing& r, int64_t E, int64_t capacity, const std::string& policy) {
          return ops::apply_capacity(r, E, capacity, drop_policy_arg(policy));
        }, py::arg("routing"), py::arg("num_experts"), py::arg("capacity"), py::arg("policy") = "probability",
        "Drops assignments beyond each expert's capacity (highest weights or first tokens kept).");

  m.def("permute", [](const Tensor& x, const Tensor& indices, int64_t E) {
          auto p = ops::permute(x, indices, E);
          return py::make_tuple(p.x, p.offsets, p.row_of);
        }, py::arg("x"), py::arg("indices"), py::arg("num_experts"), R"doc(
Expert-contiguous order: x (T,C) -> (xp (T*k,C), offsets (E+1) i64 [the
group list of grouped_matmul], row_of (T,k) i64 [-1: dropped]).)doc");
  m.def("permute_backward", [](const Tensor& dxp, const Tensor& row_of) { return ops::permute_backward(dxp, row_of); },
        py::arg("dxp"), py::arg("row_of"),
        "dxp (T*k,C) -> dx (T,C).");
  m.def("unpermute", [](const Tensor& yp, const Tensor& row_of, const Tensor& w) { return ops::unpermute(yp, row_of, w); },
        py::arg("yp"), py::arg("row_of"), py::arg("weights"),
        "Combine: y (T,C) = sum_j weights[t,j] * yp[row_of[t,j]].");
  m.def("unpermute_backward", [](const Tensor& dy, const Tensor& yp, const Tensor& row_of, const Tensor& w) {
          auto g = ops::unpermute_backward(dy, yp, row_of, w);
          return py::make_tuple(g.dyp, g.dweights);
        }, py::arg("dy"), py::arg("yp"), py::arg("row_of"), py::arg("weights"),
        "-> (dyp (T*k,C), dweights (T,k)).");
}

void bind_optimizer(py::module_& m) {
  py::class_<ops::ParamSegment>(m, "ParamSegment", "[offset, offset+numel) of a flat tensor; decay: "
                                                   "weight decay applies.")
      .def(py::init([](int64_t offset, int64_t numel, bool decay) { return ops::ParamSegment{offset, numel, decay}; }),
           py::arg("offset"), py::arg("numel"), py::arg("decay") = false,
           "The segment [offset, offset+numel) of a flat tensor; decay: weight decay applies to it.")
      .def_readwrite("offset", &ops::ParamSegment::offset, "First element of the segment.")
      .def_readwrite("numel", &ops::ParamSegment::numel, "Number of elements in the segment.")
      .def_readwrite("decay", &ops::ParamSegment::decay, "Whether weight decay applies.");

  m.def("grad_sq_sum", py::overload_cast<const std::vector<Tensor>&>(&ops::grad_sq_sum), py::arg("grads"),
        "Sum of squares of every element of `grads` -> (1) f32 (deterministic).");
  m.def("grad_sq_sum", py::overload_cast<const Tensor&, const std::vector<ops::ParamSegment>&>(&ops::grad_sq_sum),
        py::arg("grad"), py::arg("segments"), "The same over the segments of one flat tensor.");
  m.def("grad_sq_partials", &ops::grad_sq_partials, py::arg("grad"), py::arg("segments"),
        "Per-chunk partial sums of squares (ceil(numel/4096) f32) of the elements in segments.");
  m.def("sum_partials", &ops::sum_partials, py::arg("partials"),
        "(1) total of partials in index order: grad_sq_sum's value, bit for bit.");
  m.def("clip_coefficient", &ops::clip_coefficient, py::arg("sq_sum"), py::arg("max_norm"),
        "(1) tensor min(1, max_norm / (sqrt(sq_sum) + 1e-6)).");

  const char* adamw_doc = R"doc(
One fused AdamW step (step >= 1) in place on param, m, v (f32, same shape):
g = grad * grad_scale[0]; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
param = param (1 - lr wd) - lr m^ / (sqrt(v^) + eps) with bias correction.
With segments, param/grad/m/v are flat arenas and decay applies per segment.
Lists of tensors get one launch per parameter.)doc";
  m.def("adamw_step", [=](const Tensor& param, const Tensor& grad, const Tensor& m_, const Tensor& v,
                          int64_t step, float lr, float beta1, float beta2, float eps, float wd,
                          const std::optional<Tensor>& grad_scale,
                          const std::optional<std::vector<ops::ParamSegment>>& segments) {
          const auto cfg = adamw_config(lr, beta1, beta2, eps, wd);
          if (segments) ops::adamw_step(param, grad, m_, v, *segments, cfg, step, optional_tensor(grad_scale));
          else ops::adamw_step(param, grad, m_, v, cfg, step, optional_tensor(grad_scale));
        }, py::arg("param"), py::arg("grad"), py::arg("m"), py::arg("v"), py::arg("step"),
        py::arg("lr") = 1e-3f, py::arg("beta1") = 0.9f, py::arg("beta2") = 0.95f, py::arg("eps") = 1e-8f,
        py::arg("weight_decay") = 0.0f, py::arg("grad_scale") = py::none(), py::arg("segments") = py::none(),
        adamw_doc);
  m.def("adamw_step", [](const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                         const std::vector<Tensor>& m_, const std::vector<Tensor>& v, int64_t step,
                         float lr, float beta1, float beta2, float eps, float wd,
                         const std::optional<Tensor>& grad_scale) {
          ops::adamw_step(params, grads, m_, v, adamw_config(lr, beta1, beta2, eps, wd), step,
                          optional_tensor(grad_scale));
        }, py::arg("params"), py::arg("grads"), py::arg("m"), py::arg("v"), py::arg("step"),
        py::arg("lr") = 1e-3f, py::arg("beta1") = 0.9f, py::arg("beta2") = 0.95f, py::arg("eps") = 1e-8f,
        py::arg("weight_decay") = 0.0f, py::arg("grad_scale") = py::none());
}

}  // namespace

void bind_ops_moe(py::module_& m) {
  bind_routing(m);
  bind_optimizer(m);
}

}  // namespace coremesh::python
