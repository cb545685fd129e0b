// The host side of a pipeline stage (pipeline.hpp): statistics and the
// executed schedule gathered over the PEs after a step, checkpoints gathered
// on the leader.
#include <algorithm>
#include <cstring>
#include <limits>
#include <map>
#include <tuple>

#include "coremesh/core/error.hpp"
#include "coremesh/shmem/collectives.hpp"
#include "coremesh/shmem/rma.hpp"
#include "coremesh/shmem/session.hpp"
#include "coremesh/shmem/team.hpp"
#include "coremesh/train/pipeline.hpp"
#include "coremesh/train/trainer.hpp"

namespace coremesh::train {

using parallel::ActionKind;
using parallel::Dim;

std::string action_category(ActionKind k) {
  switch (k) {
    case ActionKind::F: return "F";
    case ActionKind::B: return "B";
    case ActionKind::I: return "I";
    case ActionKind::W: return "W";
    case ActionKind::FB: return "F&B";
    case ActionKind::SendSum:
    case ActionKind::RecvSum: return "grad sum";
    default: return "p2p";
  }
}

std::vector<Pipeline::Totals> Pipeline::over_world(const std::vector<double>& local) {
  const int n = shmem::n_pes(), k = int(local.size());
  CM_ASSERT(k <= 4);
  auto* v = reinterpret_cast<double*>(host_values_.raw_data());
  std::copy(local.begin(), local.end(), v);
  shmem::allgather(shmem::Team::world(), v + 4, v, 4);
  std::vector<Totals> out(static_cast<size_t>(k));
  for (int i = 0; i < k; ++i) {
    out[size_t(i)].max = v[4 + i];  // PE 0's
    for (int pe = 0; pe < n; ++pe) {
      out[size_t(i)].sum += v[4 * (pe + 1) + i];
      out[size_t(i)].max = std::max(out[size_t(i)].max, v[4 * (pe + 1) + i]);
    }
  }
  return out;
}

void Pipeline::gather_executed() {
  if (!timed_) return;
  const int64_t slots = times_buffer_.numel() / (shmem::n_pes() + 1);  // 2 per action
  auto* v = times_buffer_.data<int64_t>();
  std::fill(v, v + slots, 0);
  for (size_t i = 0; i < times_.size() && int64_t(2 * i + 1) < slots; ++i)
    v[2 * i] = times_[i].first, v[2 * i + 1] = times_[i].second;
  shmem::allgather(shmem::Team::world(), v + slots, v, size_t(slots));
  executed_.clear();
  auto times_of = [&](int rank) {  // data replica 0's
    parallel::Coords c;
    c[Dim::pp] = rank;
    return v + slots * (mesh_.rank(c) + 1);
  };
  int64_t origin = std::numeric_limits<int64_t>::max();
  for (int r = 0; r < schedule_.ranks; ++r)
    for (int64_t i = 0; i < slots; i += 2)
      if (times_of(r)[i] > 0) origin = std::min(origin, times_of(r)[i]);
  for (int r = 0; r < schedule_.ranks; ++r) {
    const int64_t* t = times_of(r);
    const std::vector<parallel::Action>& actions = schedule_.actions[size_t(r)];
    for (size_t i = 0; i < actions.size(); ++i) {
      const parallel::Action& a = actions[i];
      executed_.push_back({r, parallel::to_string(a), action_category(a.kind), double(t[2 * i] - origin) / 1e6,
                           double(t[2 * i + 1] - origin) / 1e6});
    }
  }
}

std::vector<std::vector<double>> Pipeline::every_expert_load(const std::vector<std::vector<double>>& mine) {
  const model::ModelConfig& m = cfg_.model;
  const int64_t E = m.n_routed_experts, n = m.n_layers * E;
  auto* v = reinterpret_cast<double*>(load_values_.raw_data());  // [0, n) mine, [n, 2n) everyone's
  std::fill(v, v + n, 0.0);
  // one holder per layer: data replica 0, TP rank 0, copy 0 under DualPipe
  const std::vector<model::PartRange> held = canonical_chunks(rank_), all = stage().chunks;
  size_t i = 0;
  for (int l = 0; l < m.n_layers; ++l) {
    if (!m.is_moe_layer(l) || !model::holds_part({all}, 2 + 2 * l)) continue;
    const std::vector<double>& counts = mine.at(i++);
    if (data_index() == 0 && first_tp_rank() && model::holds_part({held}, 2 + 2 * l))
      std::copy(counts.begin(), counts.end(), v + l * E);
  }
  shmem::allreduce(shmem::Team::world(), v + n, v, size_t(n), shmem::ReduceOp::sum);
  std::vector<std::vector<double>> out;
  for (int l = 0; l < m.n_layers; ++l)
    if (m.is_moe_layer(l)) out.emplace_back(v + n + l * E, v + n + (l + 1) * E);
  return out;
}

void Pipeline::gather_state(model::Model& model, AdamW& opt, NamedTensors& params, NamedTensors& adam_m,
                            NamedTensors& adam_v, NamedTensors& buffers) {
  const int64_t E = cfg_.model.n_routed_experts;
  for (const auto& [name, b] : model.named_buffers()) {  // router biases: "layers.<l>.router_bias"
    const int l = std::stoi(name.substr(7));
    std::memcpy(buffers_.data<float>() + l * E, b.data<float>(), size_t(E) * sizeof(float));
  }
  auto* table = owned_table_.data<int64_t>();  // where this PE's AdamW state lies: (begin, end, offset) per range
  table[0] = int64_t(opt.owned().size());
  for (size_t i = 0; i < opt.owned().size(); ++i)
    table[1 + 3 * i] = opt.owned()[i].first, table[2 + 3 * i] = opt.owned()[i].second,
                  table[3 + 3 * i] = opt.state_offset(i);
  shmem::barrier();  // every PE's step is done and its buffers and table staged
  if (shmem::my_pe() == 0) {
    // the holder of each part (a pipeline rank of data replica 0), and its
    // layouts (per ep and tp index)
    std::vector<int> holder(size_t(model::num_parts(cfg_.model)));
    for (int pe = 0; pe < schedule_.ranks; ++pe)
      for (const model::PartRange& r : canonical_chunks(pe))
        for (int part = r.begin; part < r.end; ++part) holder[size_t(part)] = pe;
    std::map<std::tuple<int, int, int>, model::ParamLayout> layouts;
    auto layout = [&](int rank, int ep_index, int tp_index) -> const model::ParamLayout& {
      auto [it, fresh] = layouts.try_emplace({rank, ep_index, tp_index});
      if (fresh) it->second = model::layout_params(cfg_.model, stage_of(rank, ep_index, tp_index));
      return it->second;
    };
    auto get = [](Tensor& to, int64_t at, const Tensor& from, int64_t offset, int64_t n, int pe) {
      shmem::get(to.data<float>() + at, from.data<float>() + offset, size_t(n), pe);
    };
    std::map<int, std::vector<int64_t>> tables;  // of the PEs read so far
    auto owned = [&](int pe) -> const std::vector<int64_t>& {
      std::vector<int64_t>& t = tables[pe];
      if (t.empty()) {
        int64_t n = 0;
        shmem::get(&n, owned_table_.data<int64_t>(), 1, pe);
        t.resize(size_t(1 + 3 * n));
        shmem::get(t.data(), owned_table_.data<int64_t>(), t.size(), pe);
      }
      return t;
    };
    const int ep = cfg_.parallel.ep, tp = cfg_.parallel.tp;
    const int kv_sharing = model::tp_shape(cfg_.model, stage()).kv_sharing;
    for (const model::ParamInfo& w : model::layout_params(cfg_.model).params) {
      const int rank = holder[size_t(w.part)];
      Tensor x = Tensor::empty(w.shape), m = Tensor::empty(w.shape), v = Tensor::empty(w.shape);
      // under ep each ep rank's experts, under tp each TP rank's slice (data replica 0)
      for (int j = 0; j < (w.expert() ? ep : 1); ++j)
        for (int k = 0; k < tp; ++k) {
          const model::ParamInfo* p = nullptr;
          for (const auto& q : layout(rank, j, k).params)
            if (q.name == w.name && !q.tied_replica) p = &q;
          CM_ASSERT(p != nullptr);
          if (!p->tp_first) continue;  // a copy: the first holder's is read
          parallel::Coords c;
          c[Dim::pp] = rank, c[Dim::ep] = j, c[Dim::tp] = k;
          const int from = mesh_.rank(c);
          Tensor px = Tensor::empty(p->shape), pm = Tensor::empty(p->shape), pv = Tensor::empty(p->shape);
          get(px, 0, model.param_arena(), p->offset, p->numel, from);
          // AdamW's state: on `from`, or under ZeRO-1 on the members that own its shards
          std::vector<int> owners{from};
          if (cfg_.parallel.zero > 0)
            owners = w.expert()            ? mesh_.expert_grad_group(from)
                     : p->tp_partial_grad ? mesh_.tp_shared_grad_group(from, kv_sharing)
                                          : mesh_.dense_grad_group(from);
          for (int o : owners) {
            const std::vector<int64_t>& t = owned(o);
            for (int64_t i = 0; i < t[0]; ++i) {
              const int64_t b = t[size_t(1 + 3 * i)], e = t[size_t(2 + 3 * i)], s = t[size_t(3 + 3 * i)];
              const int64_t lo = std::max(b, p->offset), hi = std::min(e, p->offset + p->numel);
              if (lo >= hi) continue;
              get(pm, lo - p->offset, opt.m(), s + (lo - b), hi - lo, o);
              get(pv, lo - p->offset, opt.v(), s + (lo - b), hi - lo, o);
            }
          }
          model::place_part(*p, px, x), model::place_part(*p, pm, m), model::place_part(*p, pv, v);
        }
      params.emplace_back(w.name, x), adam_m.emplace_back(w.name, m), adam_v.emplace_back(w.name, v);
    }
    buffers.clear();
    for (int l = 0; l < cfg_.model.n_layers; ++l) {
      if (!cfg_.model.is_moe_layer(l)) continue;
      Tensor b = Tensor::empty({E});
      get(b, 0, buffers_, l * E, E, pe(holder[size_t(2 + 2 * l)]));
      buffers.emplace_back("layers." + std::to_string(l) + ".router_bias", b);
    }
  }
  shmem::barrier();  // nobody changes its arenas before the leader has read them
}

}  // namespace coremesh::train
