#include "coremesh/parallel/mesh.hpp"

#include <fmt/format.h>

#include "coremesh/core/error.hpp"

namespace coremesh::parallel {

const char* dim_name(Dim d) {
  static const char* names[] = {"dp", "cp", "pp", "ep", "tp"};
  return names[size_t(d)];
}

std::vector<std::string> Mesh::problems(const ParallelConfig& p, int world, const SplitSizes& s) {
  std::vector<std::string> out = p.problems();
  if (!out.empty()) return out;
  if (p.world() != world)
    out.push_back(fmt::format("dp {} x cp {} x pp {} x ep {} x tp {} = {} PEs, but the job has {}: change the "
                              "degrees so that their product is {}, or start {} PEs",
                              p.dp, p.cp, p.pp, p.ep, p.tp, p.world(), world, world, p.world()));
  auto divides = [&](int degree, const char* name, int size, const char* what) {
    if (degree > 1 && size >= 0 && size % degree != 0)
      out.push_back(fmt::format("{} = {} does not divide the {} {}: choose {} among the divisors of {}", name,
                                degree, size, what, name, size));
  };
  divides(p.ep, "ep", s.experts, "routed experts");
  if (p.ep > 1 && s.experts == 0) out.push_back("ep > 1 needs routed experts: set ep to 1 or add experts");
  divides(p.tp, "tp", s.heads, "query heads");
  // virtual_stages cut chunks only for the interleaved schedule (the V schedules check their own two)
  const int stage_chunks = p.schedule == PipelineSchedule::interleaved ? p.virtual_stages : 1;
  if (p.pp > 1 && s.layers >= 0 && 2 * s.layers + 2 < p.pp * stage_chunks)
    out.push_back(fmt::format("pp {} x {} chunk(s) per rank need at least as many model parts ({}): lower pp{}", p.pp,
                              stage_chunks, 2 * s.layers + 2, stage_chunks > 1 ? " or virtual_stages" : ""));
  const int chunks = p.cp_zigzag && p.cp_comm == CpComm::ring ? 2 * p.cp : p.cp;
  if (p.cp > 1 && s.seq_len >= 0 && s.seq_len % chunks != 0)
    out.push_back(fmt::format("cp = {} splits each sequence into {} chunks, which does not divide seq_len = {}: "
                              "choose seq_len a multiple of {}",
                              p.cp, chunks, s.seq_len, chunks));
  if (p.cp > 1 && p.cp_comm == CpComm::ulysses)
    for (auto [size, what] : {std::pair{s.heads, "query heads"}, std::pair{s.kv_heads, "key/value heads"}})
      if (size >= 0 && size % (p.cp * p.tp) != 0)
        out.push_back(fmt::format("Ulysses splits the {} {} over cp x tp = {} x {} = {} PEs: choose cp x tp among "
                                  "the divisors of {}, or cp_comm ring",
                                  size, what, p.cp, p.tp, p.cp * p.tp, size));
  return out;
}

Mesh::Mesh(const ParallelConfig& p, int world, const SplitSizes& sizes) : config_(p), world_(world) {
  const auto problems_found = problems(p, world, sizes);
  if (!problems_found.empty()) {
    std::string text = "invalid parallel layout:";
    for (const auto& s : problems_found) text += "\n  - " + s;
    CM_THROW(InvalidArgument, "change the parallel degrees listed above", "{}", text);
  }
  degree_ = {p.dp, p.cp, p.pp, p.ep, p.tp};
}

Coords Mesh::coords(int rank) const {
  CM_CHECK(rank >= 0 && rank < world_, "pass a rank of the mesh", "rank {} of {}", rank, world_);
  Coords c;
  for (size_t i = kDims.size(); i-- > 0;) {  // TP innermost
    c.c[i] = rank % degree_[i];
    rank /= degree_[i];
  }
  return c;
}

int Mesh::rank(const Coords& c) const {
  int r = 0;
  for (size_t i = 0; i < kDims.size(); ++i) {
    CM_CHECK(c.c[i] >= 0 && c.c[i] < degree_[i], "pass coordinates inside the mesh", "{} index {} of {}",
             dim_name(kDims[i]), c.c[i], degree_[i]);
    r = r * degree_[i] + c.c[i];
  }
  return r;
}

std::vector<int> Mesh::members(int rank_, std::initializer_list<Dim> vary) const {
  const Coords base = coords(rank_);
  std::vector<int> out;
  // Every combination of the varying coordinates; increasing rank order
  // follows from visiting the outer dimensions first.
  std::array<int, 5> limit{1, 1, 1, 1, 1};
  for (Dim d : vary) limit[size_t(d)] = degree(d);
  Coords c = base;
  for (int a = 0; a < limit[0]; ++a)
    for (int b = 0; b < limit[1]; ++b)
      for (int p = 0; p < limit[2]; ++p)
        for (int e = 0; e < limit[3]; ++e)
          for (int t = 0; t < limit[4]; ++t) {
            const std::array<int, 5> idx{a, b, p, e, t};
            for (size_t i = 0; i < 5; ++i) c.c[i] = limit[i] > 1 ? idx[i] : base.c[i];
            out.push_back(rank(c));
          }
  return out;
}

std::vector<int> Mesh::group(Dim d, int r) const { return members(r, {d}); }
std::vector<int> Mesh::dense_grad_group(int r) const { return members(r, {Dim::dp, Dim::cp, Dim::ep}); }
std::vector<int> Mesh::expert_grad_group(int r) const { return members(r, {Dim::dp, Dim::cp}); }
std::vector<int> Mesh::tp_shared_grad_group(int r, int sharing) const {
  const int block = coords(r)[Dim::tp] / sharing;
  std::vector<int> out;
  for (int q : members(r, {Dim::dp, Dim::cp, Dim::ep, Dim::tp}))
    if (coords(q)[Dim::tp] / sharing == block) out.push_back(q);
  return out;
}
std::vector<int> Mesh::data_group(int r) const { return members(r, {Dim::dp, Dim::ep}); }

int Mesh::data_index(int r) const {
  const Coords c = coords(r);
  return c[Dim::dp] * degree(Dim::ep) + c[Dim::ep];
}

std::string Mesh::describe() const {
  return fmt::format("dp {} x cp {} x pp {} x ep {} x tp {} = {} PEs", degree(Dim::dp), degree(Dim::cp),
                     degree(Dim::pp), degree(Dim::ep), degree(Dim::tp), world_);
}

}  // namespace coremesh::parallel
